################################################################################
# Replication group (node-based cache)
################################################################################

resource "aws_elasticache_subnet_group" "this" {
  count = local.serverless ? 0 : 1

  name        = var.name
  description = "tollgate cache subnets"
  subnet_ids  = var.subnet_ids

  tags = local.tags
}

resource "aws_elasticache_replication_group" "this" {
  count = local.serverless ? 0 : 1

  replication_group_id = local.cache_id
  description          = "tollgate rate-limit state"

  engine               = var.engine
  engine_version       = local.engine_version
  node_type            = var.node_type
  port                 = var.port
  parameter_group_name = local.parameter_group_name

  subnet_group_name  = aws_elasticache_subnet_group.this[0].name
  security_group_ids = [aws_security_group.cache.id]

  # Cluster mode shards the keyspace; otherwise one primary plus replicas.
  cluster_mode            = local.cluster_mode ? "enabled" : "disabled"
  num_node_groups         = local.cluster_mode ? var.shards : null
  replicas_per_node_group = local.cluster_mode ? var.replicas : null
  num_cache_clusters      = local.cluster_mode ? null : var.replicas + 1

  # Cluster mode requires automatic failover; Multi-AZ needs a replica to fail over to.
  automatic_failover_enabled = local.cluster_mode || var.replicas > 0
  multi_az_enabled           = var.replicas > 0

  # Encryption is not optional.
  transit_encryption_enabled = true
  transit_encryption_mode    = "required"
  at_rest_encryption_enabled = true
  kms_key_id                 = var.kms_key_arn

  auth_token     = local.token_auth ? var.auth_token : null
  user_group_ids = local.iam_auth ? [aws_elasticache_user_group.this[0].user_group_id] : null

  snapshot_retention_limit   = var.snapshot_retention_limit
  maintenance_window         = var.maintenance_window
  apply_immediately          = var.apply_immediately
  auto_minor_version_upgrade = true

  tags = local.tags

  lifecycle {
    precondition {
      condition     = var.replicas == 0 || length(var.subnet_ids) >= 2
      error_message = "Multi-AZ (replicas > 0) needs subnet_ids in at least two Availability Zones."
    }

    precondition {
      condition     = !local.iam_auth || tonumber(local.engine_major) >= 7
      error_message = "IAM authentication needs valkey 7.2+ or redis 7.0+; raise engine_version or use auth_mode = \"auth_token\"."
    }
  }
}

################################################################################
# Serverless cache
################################################################################

resource "aws_elasticache_serverless_cache" "this" {
  count = local.serverless ? 1 : 0

  name                 = local.cache_id
  description          = "tollgate rate-limit state"
  engine               = var.engine
  major_engine_version = local.engine_major

  subnet_ids         = var.subnet_ids
  security_group_ids = [aws_security_group.cache.id]
  kms_key_id         = var.kms_key_arn
  user_group_id      = aws_elasticache_user_group.this[0].user_group_id

  snapshot_retention_limit = var.snapshot_retention_limit

  dynamic "cache_usage_limits" {
    for_each = var.serverless_max_data_storage_gb != null || var.serverless_max_ecpu_per_second != null ? [1] : []

    content {
      dynamic "data_storage" {
        for_each = var.serverless_max_data_storage_gb != null ? [var.serverless_max_data_storage_gb] : []

        content {
          maximum = data_storage.value
          unit    = "GB"
        }
      }

      dynamic "ecpu_per_second" {
        for_each = var.serverless_max_ecpu_per_second != null ? [var.serverless_max_ecpu_per_second] : []

        content {
          maximum = ecpu_per_second.value
        }
      }
    }
  }

  tags = local.tags

  lifecycle {
    precondition {
      condition     = length(var.subnet_ids) >= 2
      error_message = "A serverless cache needs subnet_ids in at least two Availability Zones."
    }
  }
}

################################################################################
# Authentication: RBAC user group with an IAM-authenticated user
################################################################################

# ElastiCache requires every user group to hold a user named "default"; this
# one is switched off so that only the IAM user can log in.
resource "aws_elasticache_user" "default" {
  count = local.iam_auth ? 1 : 0

  user_id       = "${var.name}-default"
  user_name     = "default"
  engine        = var.engine
  access_string = "off -@all"

  authentication_mode {
    type = "no-password-required"
  }

  tags = local.tags
}

resource "aws_elasticache_user" "app" {
  count = local.iam_auth ? 1 : 0

  # IAM authentication requires the user name to equal the user ID.
  user_id       = "${var.name}-app"
  user_name     = "${var.name}-app"
  engine        = var.engine
  access_string = var.iam_user_access_string

  authentication_mode {
    type = "iam"
  }

  tags = local.tags
}

resource "aws_elasticache_user_group" "this" {
  count = local.iam_auth ? 1 : 0

  user_group_id = var.name
  engine        = var.engine
  user_ids      = [aws_elasticache_user.default[0].user_id, aws_elasticache_user.app[0].user_id]

  tags = local.tags
}

################################################################################
# Authentication: AUTH token in Secrets Manager
################################################################################

resource "aws_secretsmanager_secret" "auth_token" {
  count = local.token_auth ? 1 : 0

  name_prefix             = "${var.name}-redis-auth-token-"
  description             = "AUTH token of the tollgate cache ${local.cache_id}; the secret string is the token itself"
  recovery_window_in_days = var.secret_recovery_window_in_days

  tags = local.tags
}

resource "aws_secretsmanager_secret_version" "auth_token" {
  count = local.token_auth ? 1 : 0

  secret_id = aws_secretsmanager_secret.auth_token[0].id

  # Write-only: the value is sent to Secrets Manager but never stored in state.
  secret_string_wo         = var.auth_token
  secret_string_wo_version = var.auth_token_version
}
