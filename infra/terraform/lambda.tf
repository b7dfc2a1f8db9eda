################################################################################
# Lambda functions: the authorizer and the decision service
################################################################################

locals {
  # Names var.environment_variables may not set (see its validations): those
  # Lambda reserves (besides every AWS_LAMBDA_* and LAMBDA_* name), and those
  # the module sets itself in local.cache_environment.
  lambda_reserved_environment_names = [
    "_HANDLER",
    "_X_AMZN_TRACE_ID",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_EXECUTION_ENV",
    "AWS_ACCESS_KEY",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
  ]
  module_environment_names = [
    "REDIS_URL",
    "REDIS_CLUSTER",
    "REDIS_AUTH_SECRET_ARN",
    "REDIS_IAM_USER",
    "REDIS_CACHE_NAME",
    "REDIS_IAM_SERVERLESS",
    "TOLLGATE_POLICY",
    "TOLLGATE_POLICY_JSON",
    "TOLLGATE_POLICY_SSM",
    "TOLLGATE_POLICY_POLL",
  ]
}

resource "aws_cloudwatch_log_group" "this" {
  for_each = local.functions

  name              = "/aws/lambda/${each.value.name}"
  retention_in_days = var.log_retention_in_days

  tags = local.tags
}

resource "aws_iam_role" "this" {
  for_each = local.functions

  name_prefix = "${each.value.name}-"
  description = "Execution role of ${each.value.name}"

  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Sid       = "LambdaAssumeRole"
      Effect    = "Allow"
      Action    = "sts:AssumeRole"
      Principal = { Service = "lambda.amazonaws.com" }
    }]
  })

  tags = local.tags
}

locals {
  # Least privilege: every statement names its one resource, except the ENI
  # actions Lambda needs to attach to the VPC, which IAM only grants on "*".
  function_policy_statements = {
    for key, fn in local.functions : key => concat(
      [
        {
          Sid      = "WriteOwnLogs"
          Effect   = "Allow"
          Action   = ["logs:CreateLogStream", "logs:PutLogEvents"]
          Resource = ["${aws_cloudwatch_log_group.this[key].arn}:log-stream:*"]
        },
        {
          Sid    = "AttachToVpc"
          Effect = "Allow"
          Action = [
            "ec2:AssignPrivateIpAddresses",
            "ec2:CreateNetworkInterface",
            "ec2:DeleteNetworkInterface",
            "ec2:DescribeNetworkInterfaces",
            "ec2:DescribeSubnets",
            "ec2:UnassignPrivateIpAddresses",
          ]
          Resource = ["*"]
        },
      ],
      var.policy_parameter != null ? [
        {
          Sid      = "ReadPolicyParameter"
          Effect   = "Allow"
          Action   = ["ssm:GetParameter"]
          Resource = [aws_ssm_parameter.policy[0].arn]
        },
      ] : [],
      local.token_auth ? [
        {
          Sid      = "ReadCacheAuthToken"
          Effect   = "Allow"
          Action   = ["secretsmanager:GetSecretValue"]
          Resource = [aws_secretsmanager_secret.auth_token[0].arn]
        },
      ] : [],
      local.iam_auth ? [
        {
          Sid      = "ConnectToCache"
          Effect   = "Allow"
          Action   = ["elasticache:Connect"]
          Resource = [local.cache_arn, aws_elasticache_user.app[0].arn]
        },
      ] : [],
    )
  }
}

resource "aws_iam_role_policy" "this" {
  for_each = local.functions

  name = "${each.value.name}-access"
  role = aws_iam_role.this[each.key].id

  policy = jsonencode({
    Version   = "2012-10-17"
    Statement = local.function_policy_statements[each.key]
  })
}

resource "aws_lambda_function" "this" {
  for_each = local.functions

  function_name = each.value.name
  description   = each.value.description
  role          = aws_iam_role.this[each.key].arn

  runtime       = "provided.al2023"
  architectures = ["arm64"]
  handler       = "bootstrap"

  filename         = each.value.package
  source_code_hash = filebase64sha256(each.value.package)

  memory_size                    = each.value.memory_size
  timeout                        = each.value.timeout
  reserved_concurrent_executions = coalesce(each.value.reserved_concurrency, -1)

  vpc_config {
    subnet_ids         = var.subnet_ids
    security_group_ids = [aws_security_group.lambda.id]
  }

  environment {
    variables = merge(var.environment_variables, local.cache_environment)
  }

  # JSON log format lets Lambda filter by level; EMF metric lines pass through
  # unchanged.
  logging_config {
    log_format            = "JSON"
    log_group             = aws_cloudwatch_log_group.this[each.key].name
    application_log_level = var.application_log_level
    system_log_level      = var.system_log_level
  }

  tags = local.tags

  depends_on = [
    aws_iam_role_policy.this,
    aws_secretsmanager_secret_version.auth_token,
    aws_vpc_security_group_egress_rule.lambda_to_cache,
  ]
}

################################################################################
# Function URL of the decision service (the Envoy filter's callout target)
################################################################################

resource "aws_lambda_function_url" "limiter" {
  count = var.create_limiter_function_url ? 1 : 0

  function_name      = aws_lambda_function.this["limiter"].function_name
  authorization_type = var.limiter_function_url_authorization_type
  invoke_mode        = var.limiter_function_url_invoke_mode
}

resource "aws_lambda_permission" "limiter_function_url" {
  for_each = var.create_limiter_function_url && var.limiter_function_url_authorization_type == "AWS_IAM" ? toset(var.limiter_function_url_allowed_principals) : toset([])

  statement_id_prefix    = "AllowFunctionUrl-"
  action                 = "lambda:InvokeFunctionUrl"
  function_name          = aws_lambda_function.this["limiter"].function_name
  principal              = each.value
  function_url_auth_type = "AWS_IAM"
}

# A Function URL with auth type NONE still needs a resource policy that lets
# anyone invoke it.
resource "aws_lambda_permission" "limiter_function_url_public" {
  count = var.create_limiter_function_url && var.limiter_function_url_authorization_type == "NONE" ? 1 : 0

  statement_id           = "AllowPublicFunctionUrl"
  action                 = "lambda:InvokeFunctionUrl"
  function_name          = aws_lambda_function.this["limiter"].function_name
  principal              = "*"
  function_url_auth_type = "NONE"
}

# The policy, when var.policy_parameter gives it: the functions read it at start and
# again at most every var.policy_refresh_seconds.
resource "aws_ssm_parameter" "policy" {
  count = var.policy_parameter != null ? 1 : 0

  name        = "/${var.name}/policy"
  description = "tollgate policy, read by ${var.name}-authorizer and ${var.name}-limiter"
  type        = "String"
  tier        = length(var.policy_parameter) > 4096 ? "Advanced" : "Standard"
  value       = var.policy_parameter

  tags = local.tags
}
