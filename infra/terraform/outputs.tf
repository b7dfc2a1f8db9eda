################################################################################
# Cache
################################################################################

output "cache_id" {
  description = "ID of the replication group, or name of the serverless cache."
  value       = local.cache_id
}

output "cache_arn" {
  description = "ARN of the replication group or serverless cache."
  value       = local.cache_arn
}

output "cache_endpoint" {
  description = "Host the functions connect to: the primary endpoint, the configuration endpoint in cluster mode, or the serverless endpoint."
  value       = local.cache_host
}

output "cache_port" {
  description = "Port the functions connect to."
  value       = local.cache_port
}

output "redis_url" {
  description = "REDIS_URL given to the functions (rediss://host:port; TLS is always on)."
  value       = local.cache_environment.REDIS_URL
}

output "cache_security_group_id" {
  description = "ID of the cache's security group (ingress only from lambda_security_group_id)."
  value       = aws_security_group.cache.id
}

output "lambda_security_group_id" {
  description = "ID of the functions' security group, the only one allowed to reach the cache port."
  value       = aws_security_group.lambda.id
}

output "auth_token_secret_arn" {
  description = "ARN of the Secrets Manager secret holding the AUTH token (auth_mode = \"auth_token\"), else null."
  value       = try(aws_secretsmanager_secret.auth_token[0].arn, null)
}

output "iam_user_id" {
  description = "ElastiCache user the functions authenticate as with IAM (auth_mode = \"iam\"), else null."
  value       = try(aws_elasticache_user.app[0].user_id, null)
}

output "user_group_id" {
  description = "ID of the ElastiCache user group (auth_mode = \"iam\"), else null."
  value       = try(aws_elasticache_user_group.this[0].user_group_id, null)
}

################################################################################
# Lambda functions
################################################################################

output "authorizer_function_name" {
  description = "Name of the authorizer function."
  value       = aws_lambda_function.this["authorizer"].function_name
}

output "authorizer_function_arn" {
  description = "ARN of the authorizer function."
  value       = aws_lambda_function.this["authorizer"].arn
}

output "limiter_function_name" {
  description = "Name of the decision service function."
  value       = aws_lambda_function.this["limiter"].function_name
}

output "limiter_function_arn" {
  description = "ARN of the decision service function."
  value       = aws_lambda_function.this["limiter"].arn
}

output "limiter_function_url" {
  description = "Function URL of the decision service (the Envoy filter's callout target), or null when not created."
  value       = try(aws_lambda_function_url.limiter[0].function_url, null)
}

output "function_role_arns" {
  description = "Execution role ARN of each function, keyed authorizer and limiter."
  value       = { for key, role in aws_iam_role.this : key => role.arn }
}

output "log_group_names" {
  description = "CloudWatch log group of each function, keyed authorizer and limiter."
  value       = { for key, group in aws_cloudwatch_log_group.this : key => group.name }
}

################################################################################
# APIs
################################################################################

output "rest_api_id" {
  description = "ID of the example REST API."
  value       = aws_api_gateway_rest_api.this.id
}

output "rest_api_execution_arn" {
  description = "Execution ARN of the example REST API."
  value       = aws_api_gateway_rest_api.this.execution_arn
}

output "rest_api_authorizer_id" {
  description = "ID of the REST API's tollgate authorizer, to attach to methods of your own API."
  value       = aws_api_gateway_authorizer.this.id
}

output "rest_api_invoke_url" {
  description = "Invoke URL of the REST API stage."
  value       = aws_api_gateway_stage.this.invoke_url
}

output "http_api_id" {
  description = "ID of the HTTP API, or null when enable_http_api is false."
  value       = try(aws_apigatewayv2_api.this[0].id, null)
}

output "http_api_invoke_url" {
  description = "Invoke URL of the HTTP API's $default stage, or null when enable_http_api is false."
  value       = try(aws_apigatewayv2_stage.this[0].invoke_url, null)
}

################################################################################
# Observability
################################################################################

output "alarm_arns" {
  description = "ARN of each CloudWatch alarm, keyed by its name without the name prefix."
  value       = { for key, alarm in aws_cloudwatch_metric_alarm.this : key => alarm.arn }
}

output "dashboard_name" {
  description = "Name of the CloudWatch dashboard, or null when create_dashboard is false."
  value       = try(aws_cloudwatch_dashboard.this[0].dashboard_name, null)
}
