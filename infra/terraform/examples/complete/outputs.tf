output "rest_api_invoke_url" {
  description = "Invoke URL of the example REST API; send requests with an x-api-key header."
  value       = module.tollgate.rest_api_invoke_url
}

output "http_api_invoke_url" {
  description = "Invoke URL of the example HTTP API, or null without backend_url."
  value       = module.tollgate.http_api_invoke_url
}

output "limiter_function_url" {
  description = "Function URL of the decision service (sign requests with SigV4, service lambda)."
  value       = module.tollgate.limiter_function_url
}

output "redis_url" {
  description = "REDIS_URL the functions connect to."
  value       = module.tollgate.redis_url
}

output "dashboard_name" {
  description = "Name of the CloudWatch dashboard."
  value       = module.tollgate.dashboard_name
}

output "alarm_topic_arn" {
  description = "SNS topic the alarms notify; subscribe your on-call to it."
  value       = aws_sns_topic.alarms.arn
}
