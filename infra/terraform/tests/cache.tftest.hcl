# The cache in each of its modes, with what depends on the mode: encryption,
# the security groups, authentication, the functions' environment, their IAM
# policies (least privilege) and the cache alarms.

mock_provider "aws" {
  source          = "./tests/mocks"
  override_during = plan
}

variables {
  vpc_id             = "vpc-0123456789abcdef0"
  subnet_ids         = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
  authorizer_package = "tests/fixtures/placeholder.zip"
  limiter_package    = "tests/fixtures/placeholder.zip"

  # Test-only value: the one group of actions IAM grants on "*" alone, Lambda's
  # VPC network interfaces.
  eni_actions = [
    "ec2:AssignPrivateIpAddresses",
    "ec2:CreateNetworkInterface",
    "ec2:DeleteNetworkInterface",
    "ec2:DescribeNetworkInterfaces",
    "ec2:DescribeSubnets",
    "ec2:UnassignPrivateIpAddresses",
  ]
}

# Each log group gets its own ARN (the mock's default gives every log group the
# same one), so the assertion that a function may write only to its own log
# group can tell the two apart and fail.
override_resource {
  target          = aws_cloudwatch_log_group.this["authorizer"]
  override_during = plan
  values = {
    arn = "arn:aws:logs:eu-west-1:123456789012:log-group:/aws/lambda/tollgate-authorizer"
  }
}

override_resource {
  target          = aws_cloudwatch_log_group.this["limiter"]
  override_during = plan
  values = {
    arn = "arn:aws:logs:eu-west-1:123456789012:log-group:/aws/lambda/tollgate-limiter"
  }
}

run "defaults_valkey_iam_one_replica" {
  command = plan

  # Encryption.
  assert {
    condition     = aws_elasticache_replication_group.this[0].transit_encryption_enabled == true && aws_elasticache_replication_group.this[0].transit_encryption_mode == "required"
    error_message = "In-transit encryption (TLS) must be on and required."
  }

  assert {
    condition     = tostring(aws_elasticache_replication_group.this[0].at_rest_encryption_enabled) == "true"
    error_message = "At-rest encryption must be on."
  }

  # Network: only the Lambdas' security group reaches the cache port.
  assert {
    condition     = aws_elasticache_replication_group.this[0].security_group_ids == toset([aws_security_group.cache.id])
    error_message = "The cache must sit in its own security group only."
  }

  assert {
    condition = (
      aws_vpc_security_group_ingress_rule.cache_from_lambda.security_group_id == aws_security_group.cache.id &&
      aws_vpc_security_group_ingress_rule.cache_from_lambda.referenced_security_group_id == aws_security_group.lambda.id &&
      aws_vpc_security_group_ingress_rule.cache_from_lambda.cidr_ipv4 == null &&
      aws_vpc_security_group_ingress_rule.cache_from_lambda.cidr_ipv6 == null &&
      aws_vpc_security_group_ingress_rule.cache_from_lambda.prefix_list_id == null
    )
    error_message = "The cache's only ingress must come from the Lambdas' security group."
  }

  assert {
    condition     = aws_vpc_security_group_ingress_rule.cache_from_lambda.from_port == 6379 && aws_vpc_security_group_ingress_rule.cache_from_lambda.to_port == 6379
    error_message = "The ingress must open only the cache port."
  }

  assert {
    condition     = length(aws_security_group.cache.ingress) == 0 && length(aws_security_group.lambda.ingress) == 0
    error_message = "No inline ingress rules may widen the security groups."
  }

  assert {
    condition     = alltrue([for fn in aws_lambda_function.this : fn.vpc_config[0].security_group_ids == toset([aws_security_group.lambda.id])])
    error_message = "The functions must use the Lambdas' security group."
  }

  assert {
    condition     = length(aws_vpc_security_group_egress_rule.lambda_https) == 0
    error_message = "IAM authentication needs no HTTPS egress."
  }

  # Replication group shape.
  assert {
    condition = (
      aws_elasticache_replication_group.this[0].engine == "valkey" &&
      aws_elasticache_replication_group.this[0].num_cache_clusters == 2 &&
      aws_elasticache_replication_group.this[0].automatic_failover_enabled &&
      aws_elasticache_replication_group.this[0].multi_az_enabled &&
      aws_elasticache_replication_group.this[0].parameter_group_name == "default.valkey8"
    )
    error_message = "One replica must give two nodes with automatic failover and Multi-AZ."
  }

  # IAM authentication through an RBAC user group.
  assert {
    condition     = aws_elasticache_user.app[0].authentication_mode[0].type == "iam" && aws_elasticache_user.app[0].user_name == aws_elasticache_user.app[0].user_id
    error_message = "The functions' user must authenticate with IAM (user name equal to user ID)."
  }

  assert {
    condition     = aws_elasticache_user.default[0].user_name == "default" && startswith(aws_elasticache_user.default[0].access_string, "off ")
    error_message = "The user group's mandatory default user must be switched off."
  }

  assert {
    condition     = aws_elasticache_replication_group.this[0].user_group_ids == toset(["tollgate"]) && aws_elasticache_replication_group.this[0].auth_token == null
    error_message = "IAM mode must attach the user group and set no AUTH token."
  }

  assert {
    condition     = length(aws_secretsmanager_secret.auth_token) == 0
    error_message = "IAM mode must create no secret."
  }

  assert {
    condition = aws_lambda_function.this["authorizer"].environment[0].variables == tomap({
      REDIS_URL        = "rediss://master.tollgate.abc123.euw1.cache.amazonaws.com:6379"
      REDIS_IAM_USER   = "tollgate-app"
      REDIS_CACHE_NAME = "tollgate"
    })
    error_message = "IAM mode must give the functions REDIS_URL (rediss://), REDIS_IAM_USER and REDIS_CACHE_NAME only."
  }

  # Least privilege.
  assert {
    condition = alltrue(flatten([
      for policy in aws_iam_role_policy.this : [
        for statement in jsondecode(policy.policy).Statement : [
          for action in statement.Action : statement.Effect == "Allow" && action != "*" && !endswith(action, ":*")
        ]
      ]
    ]))
    error_message = "No statement may grant * or service:* actions."
  }

  assert {
    condition = alltrue(flatten([
      for policy in aws_iam_role_policy.this : [
        for statement in jsondecode(policy.policy).Statement : [
          for resource in statement.Resource :
          !strcontains(resource, "*") ||
          (resource == "*" && alltrue([for action in statement.Action : contains(var.eni_actions, action)])) ||
          (endswith(resource, ":log-stream:*") && alltrue([for action in statement.Action : startswith(action, "logs:")]))
        ]
      ]
    ]))
    error_message = "Wildcard resources are allowed only for the ENI actions and for log streams."
  }

  assert {
    condition = alltrue([
      for key, policy in aws_iam_role_policy.this : [
        for statement in jsondecode(policy.policy).Statement : statement.Resource if statement.Sid == "WriteOwnLogs"
      ][0] == ["${aws_cloudwatch_log_group.this[key].arn}:log-stream:*"]
    ])
    error_message = "Each function may write only to its own log group."
  }

  # Guards the assertion above: with equal ARNs it could not fail.
  assert {
    condition     = aws_cloudwatch_log_group.this["authorizer"].arn != aws_cloudwatch_log_group.this["limiter"].arn
    error_message = "The test needs distinct mocked log group ARNs (override_resource above)."
  }

  assert {
    condition = alltrue([
      for policy in aws_iam_role_policy.this : [
        for statement in jsondecode(policy.policy).Statement : statement if statement.Sid == "ConnectToCache"
        ][0] == {
        Sid      = "ConnectToCache"
        Effect   = "Allow"
        Action   = ["elasticache:Connect"]
        Resource = ["arn:aws:elasticache:eu-west-1:123456789012:replicationgroup:tollgate", "arn:aws:elasticache:eu-west-1:123456789012:user:tollgate-app"]
      }
    ])
    error_message = "elasticache:Connect must name the one cache and the one user."
  }

  assert {
    condition     = !anytrue([for policy in aws_iam_role_policy.this : strcontains(policy.policy, "secretsmanager")])
    error_message = "IAM mode needs no Secrets Manager access."
  }

  assert {
    condition     = alltrue([for role in aws_iam_role.this : jsondecode(role.assume_role_policy).Statement[0].Principal.Service == "lambda.amazonaws.com"])
    error_message = "Only Lambda may assume the execution roles."
  }

  # One CPU, memory and evictions alarm per node.
  assert {
    condition = (
      aws_cloudwatch_metric_alarm.this["tollgate-001-cpu"].metric_name == "EngineCPUUtilization" &&
      aws_cloudwatch_metric_alarm.this["tollgate-002-memory"].metric_name == "DatabaseMemoryUsagePercentage" &&
      aws_cloudwatch_metric_alarm.this["tollgate-002-evictions"].metric_name == "Evictions" &&
      aws_cloudwatch_metric_alarm.this["tollgate-001-cpu"].dimensions == tomap({ CacheClusterId = "tollgate-001" })
    )
    error_message = "Each cache node needs CPU, memory and eviction alarms."
  }
}

run "redis_without_replicas" {
  command = plan

  variables {
    engine   = "redis"
    replicas = 0
  }

  assert {
    condition = (
      aws_elasticache_replication_group.this[0].engine == "redis" &&
      aws_elasticache_replication_group.this[0].engine_version == "7.1" &&
      aws_elasticache_replication_group.this[0].num_cache_clusters == 1 &&
      !aws_elasticache_replication_group.this[0].automatic_failover_enabled &&
      !aws_elasticache_replication_group.this[0].multi_az_enabled &&
      aws_elasticache_replication_group.this[0].parameter_group_name == "default.redis7"
    )
    error_message = "Without replicas there is nothing to fail over to."
  }
}

run "cluster_mode" {
  command = plan

  variables {
    cluster_mode_enabled = true
    shards               = 2
    replicas             = 2
  }

  assert {
    condition = (
      aws_elasticache_replication_group.this[0].cluster_mode == "enabled" &&
      aws_elasticache_replication_group.this[0].num_node_groups == 2 &&
      aws_elasticache_replication_group.this[0].replicas_per_node_group == 2 &&
      aws_elasticache_replication_group.this[0].automatic_failover_enabled &&
      aws_elasticache_replication_group.this[0].parameter_group_name == "default.valkey8.cluster.on"
    )
    error_message = "Cluster mode must shard into node groups with the cluster.on parameter group."
  }

  assert {
    condition     = aws_lambda_function.this["limiter"].environment[0].variables.REDIS_CLUSTER == "true"
    error_message = "Cluster mode must set REDIS_CLUSTER=true."
  }

  assert {
    condition     = aws_lambda_function.this["limiter"].environment[0].variables.REDIS_URL == "rediss://clustercfg.tollgate.abc123.euw1.cache.amazonaws.com:6379"
    error_message = "Cluster mode must connect to the configuration endpoint."
  }

  assert {
    condition     = length([for key, alarm in aws_cloudwatch_metric_alarm.this : key if alarm.namespace == "AWS/ElastiCache"]) == 2 * 3 * 3
    error_message = "Expected CPU, memory and eviction alarms for every node of every shard."
  }

  assert {
    condition     = aws_cloudwatch_metric_alarm.this["tollgate-0002-003-cpu"].dimensions == tomap({ CacheClusterId = "tollgate-0002-003" })
    error_message = "Cluster-mode node IDs are NAME-SHARD-NODE."
  }
}

run "auth_token_mode" {
  command = plan

  variables {
    auth_mode  = "auth_token"
    auth_token = "correct-horse-battery-staple-42"
  }

  assert {
    condition     = nonsensitive(aws_elasticache_replication_group.this[0].auth_token) == "correct-horse-battery-staple-42" && aws_elasticache_replication_group.this[0].user_group_ids == null
    error_message = "AUTH mode must set the token on the replication group and no user group."
  }

  assert {
    condition     = aws_secretsmanager_secret_version.auth_token[0].secret_string_wo_version == 1 && aws_secretsmanager_secret_version.auth_token[0].secret_string == null
    error_message = "The token must go to Secrets Manager as a write-only value."
  }

  assert {
    condition = aws_lambda_function.this["authorizer"].environment[0].variables == tomap({
      REDIS_URL             = "rediss://master.tollgate.abc123.euw1.cache.amazonaws.com:6379"
      REDIS_AUTH_SECRET_ARN = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:tollgate-redis-auth-token-AbCdEf"
    })
    error_message = "AUTH mode must give the functions REDIS_URL and REDIS_AUTH_SECRET_ARN only."
  }

  assert {
    condition     = length(aws_elasticache_user.app) == 0 && length(aws_elasticache_user_group.this) == 0
    error_message = "AUTH mode must create no RBAC users."
  }

  assert {
    condition     = length(aws_vpc_security_group_egress_rule.lambda_https) == 1 && aws_vpc_security_group_egress_rule.lambda_https["0.0.0.0/0"].to_port == 443
    error_message = "AUTH mode must let the functions reach Secrets Manager on 443."
  }

  assert {
    condition = alltrue([
      for policy in aws_iam_role_policy.this : [
        for statement in jsondecode(policy.policy).Statement : statement if statement.Sid == "ReadCacheAuthToken"
        ][0] == {
        Sid      = "ReadCacheAuthToken"
        Effect   = "Allow"
        Action   = ["secretsmanager:GetSecretValue"]
        Resource = ["arn:aws:secretsmanager:eu-west-1:123456789012:secret:tollgate-redis-auth-token-AbCdEf"]
      }
    ])
    error_message = "secretsmanager:GetSecretValue must name the one secret."
  }

  assert {
    condition     = !anytrue([for policy in aws_iam_role_policy.this : strcontains(policy.policy, "elasticache:")])
    error_message = "AUTH mode needs no elasticache:Connect."
  }

  assert {
    condition = alltrue(flatten([
      for policy in aws_iam_role_policy.this : [
        for statement in jsondecode(policy.policy).Statement : [
          for resource in statement.Resource : resource != "*" || alltrue([for action in statement.Action : contains(var.eni_actions, action)])
        ]
      ]
    ]))
    error_message = "Only the ENI actions may use the * resource."
  }
}

run "serverless" {
  command = plan

  variables {
    serverless  = true
    policy_file = "/var/task/strict.yaml"
  }

  assert {
    condition     = length(aws_elasticache_replication_group.this) == 0 && length(aws_elasticache_serverless_cache.this) == 1
    error_message = "serverless = true must create a serverless cache instead of a replication group."
  }

  assert {
    condition = (
      aws_elasticache_serverless_cache.this[0].major_engine_version == "8" &&
      aws_elasticache_serverless_cache.this[0].user_group_id == "tollgate" &&
      aws_elasticache_serverless_cache.this[0].security_group_ids == toset([aws_security_group.cache.id])
    )
    error_message = "The serverless cache must use the user group and the cache security group."
  }

  assert {
    condition = aws_lambda_function.this["authorizer"].environment[0].variables == tomap({
      REDIS_URL            = "rediss://tollgate-abc123.serverless.euw1.cache.amazonaws.com:6379"
      REDIS_CLUSTER        = "true"
      REDIS_IAM_USER       = "tollgate-app"
      REDIS_CACHE_NAME     = "tollgate"
      REDIS_IAM_SERVERLESS = "true"
      TOLLGATE_POLICY      = "/var/task/strict.yaml"
    })
    error_message = "Serverless IAM mode must set REDIS_CLUSTER, REDIS_IAM_SERVERLESS and the IAM variables."
  }

  assert {
    condition     = aws_vpc_security_group_ingress_rule.cache_from_lambda.from_port == 6379 && aws_vpc_security_group_ingress_rule.cache_from_lambda.to_port == 6380
    error_message = "Serverless caches need 6379 (primary) and 6380 (reader) open to the functions."
  }

  assert {
    condition = contains(
      [for statement in jsondecode(aws_iam_role_policy.this["authorizer"].policy).Statement : statement if statement.Sid == "ConnectToCache"][0].Resource,
      "arn:aws:elasticache:eu-west-1:123456789012:serverlesscache:tollgate",
    )
    error_message = "elasticache:Connect must name the serverless cache."
  }

  assert {
    condition = (
      aws_cloudwatch_metric_alarm.this["cache-evictions"].dimensions == tomap({ clusterId = "tollgate" }) &&
      aws_cloudwatch_metric_alarm.this["cache-throttled-commands"].metric_name == "ThrottledCmds" &&
      length([for key, alarm in aws_cloudwatch_metric_alarm.this : key if alarm.namespace == "AWS/ElastiCache"]) == 2
    )
    error_message = "Serverless caches need eviction and throttled-command alarms, and no per-node alarms."
  }
}
