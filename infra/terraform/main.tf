data "aws_region" "current" {}

locals {
  tags = merge(var.tags, { "tollgate:stack" = var.name })

  serverless   = var.serverless
  cluster_mode = !var.serverless && var.cluster_mode_enabled
  iam_auth     = var.auth_mode == "iam"
  token_auth   = var.auth_mode == "auth_token"
  backend      = var.backend_url != null

  engine_version = coalesce(var.engine_version, var.engine == "valkey" ? "8.0" : "7.1")
  engine_major   = split(".", local.engine_version)[0]

  # The default parameter group of the major version; cluster mode needs the
  # ".cluster.on" variant (CreateReplicationGroup otherwise picks a non-cluster one).
  parameter_group_name = coalesce(
    var.parameter_group_name,
    "default.${var.engine}${local.engine_major}${local.cluster_mode ? ".cluster.on" : ""}",
  )

  cache_id = var.name

  # Where and how the functions reach the cache.
  cache_host = (
    local.serverless ? aws_elasticache_serverless_cache.this[0].endpoint[0].address :
    local.cluster_mode ? aws_elasticache_replication_group.this[0].configuration_endpoint_address :
    aws_elasticache_replication_group.this[0].primary_endpoint_address
  )
  # Serverless caches serve reads on 6380 as well as 6379.
  cache_port_range = local.serverless ? { from = 6379, to = 6380 } : { from = var.port, to = var.port }

  cache_port = local.serverless ? aws_elasticache_serverless_cache.this[0].endpoint[0].port : var.port
  cache_arn  = local.serverless ? aws_elasticache_serverless_cache.this[0].arn : aws_elasticache_replication_group.this[0].arn

  # Serverless caches speak the cluster protocol, so clients run in cluster mode.
  client_cluster_mode = local.serverless || local.cluster_mode

  cache_environment = merge(
    { REDIS_URL = "rediss://${local.cache_host}:${local.cache_port}" },
    local.client_cluster_mode ? { REDIS_CLUSTER = "true" } : {},
    local.token_auth ? { REDIS_AUTH_SECRET_ARN = aws_secretsmanager_secret.auth_token[0].arn } : {},
    local.iam_auth ? {
      REDIS_IAM_USER   = aws_elasticache_user.app[0].user_id
      REDIS_CACHE_NAME = local.cache_id
    } : {},
    local.iam_auth && local.serverless ? { REDIS_IAM_SERVERLESS = "true" } : {},
    var.policy_file != null ? { TOLLGATE_POLICY = var.policy_file } : {},
    var.policy_json != null ? { TOLLGATE_POLICY_JSON = var.policy_json } : {},
    var.policy_parameter != null ? {
      TOLLGATE_POLICY_SSM  = aws_ssm_parameter.policy[0].name
      TOLLGATE_POLICY_POLL = "${var.policy_refresh_seconds}s"
    } : {},
  )

  functions = {
    authorizer = {
      name                 = "${var.name}-authorizer"
      description          = "tollgate API Gateway authorizer: decides each request against the shared rate limits"
      package              = var.authorizer_package
      memory_size          = var.authorizer_memory_size
      timeout              = var.authorizer_timeout
      reserved_concurrency = var.authorizer_reserved_concurrency
    }
    limiter = {
      name                 = "${var.name}-limiter"
      description          = "tollgate decision service: answers rate-limit decisions over HTTP (Envoy filter callouts)"
      package              = var.limiter_package
      memory_size          = var.limiter_memory_size
      timeout              = var.limiter_timeout
      reserved_concurrency = var.limiter_reserved_concurrency
    }
  }
}
