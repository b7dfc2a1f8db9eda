################################################################################
# Alarms
################################################################################

locals {
  # Node IDs ElastiCache gives the members of the replication group:
  # NAME-001 ... without cluster mode, NAME-0001-001 ... (shard-node) with it.
  cache_node_ids = local.serverless ? [] : local.cluster_mode ? [
    for pair in setproduct(range(1, var.shards + 1), range(1, var.replicas + 2)) :
    format("%s-%04d-%03d", local.cache_id, pair[0], pair[1])
    ] : [
    for node in range(1, var.replicas + 2) : format("%s-%03d", local.cache_id, node)
  ]

  function_alarms = merge([
    for key, fn in local.functions : {
      "${key}-errors" = {
        description = "${fn.name} returned errors (API Gateway answers 5xx)."
        namespace   = "AWS/Lambda"
        metric_name = "Errors"
        dimensions  = { FunctionName = fn.name }
        statistic   = "Sum"
        comparison  = "GreaterThanOrEqualToThreshold"
        threshold   = 1
      }
      "${key}-throttles" = {
        description = "${fn.name} was throttled: raise its reserved concurrency or the account limit."
        namespace   = "AWS/Lambda"
        metric_name = "Throttles"
        dimensions  = { FunctionName = fn.name }
        statistic   = "Sum"
        comparison  = "GreaterThanOrEqualToThreshold"
        threshold   = 1
      }
      # Emitted by the functions as an EMF line whenever the cache is
      # unreachable and the policy's failure mode (open, closed, local) decides.
      "${key}-failure-mode" = {
        description = "${fn.name} decided without the cache (failure mode open, closed or local)."
        namespace   = var.metrics_namespace
        metric_name = "FailureModeActivations"
        dimensions  = { Function = fn.name }
        statistic   = "Sum"
        comparison  = "GreaterThanOrEqualToThreshold"
        threshold   = 1
      }
    }
  ]...)

  node_alarms = merge([
    for node in local.cache_node_ids : {
      "${node}-cpu" = {
        description = "Cache node ${node}: engine CPU above ${var.cache_cpu_threshold_percent}%."
        namespace   = "AWS/ElastiCache"
        metric_name = "EngineCPUUtilization"
        dimensions  = { CacheClusterId = node }
        statistic   = "Average"
        comparison  = "GreaterThanThreshold"
        threshold   = var.cache_cpu_threshold_percent
      }
      "${node}-memory" = {
        description = "Cache node ${node}: memory above ${var.cache_memory_threshold_percent}% of maxmemory."
        namespace   = "AWS/ElastiCache"
        metric_name = "DatabaseMemoryUsagePercentage"
        dimensions  = { CacheClusterId = node }
        statistic   = "Average"
        comparison  = "GreaterThanThreshold"
        threshold   = var.cache_memory_threshold_percent
      }
      "${node}-evictions" = {
        description = "Cache node ${node} evicted keys: rate-limit state is being lost."
        namespace   = "AWS/ElastiCache"
        metric_name = "Evictions"
        dimensions  = { CacheClusterId = node }
        statistic   = "Sum"
        comparison  = "GreaterThanThreshold"
        threshold   = 0
      }
    }
  ]...)

  serverless_alarms = local.serverless ? {
    "cache-evictions" = {
      description = "Serverless cache ${local.cache_id} evicted keys: rate-limit state is being lost."
      namespace   = "AWS/ElastiCache"
      metric_name = "Evictions"
      dimensions  = { clusterId = local.cache_id }
      statistic   = "Sum"
      comparison  = "GreaterThanThreshold"
      threshold   = 0
    }
    "cache-throttled-commands" = {
      description = "Serverless cache ${local.cache_id} throttled commands: raise its ECPU limit."
      namespace   = "AWS/ElastiCache"
      metric_name = "ThrottledCmds"
      dimensions  = { clusterId = local.cache_id }
      statistic   = "Sum"
      comparison  = "GreaterThanThreshold"
      threshold   = 0
    }
  } : {}

  alarms = var.create_alarms ? merge(local.function_alarms, local.node_alarms, local.serverless_alarms) : {}
}

resource "aws_cloudwatch_metric_alarm" "this" {
  for_each = local.alarms

  alarm_name        = "${var.name}-${each.key}"
  alarm_description = each.value.description

  namespace   = each.value.namespace
  metric_name = each.value.metric_name
  dimensions  = each.value.dimensions
  statistic   = each.value.statistic

  comparison_operator = each.value.comparison
  threshold           = each.value.threshold
  period              = var.alarm_period
  evaluation_periods  = var.alarm_evaluation_periods
  datapoints_to_alarm = 1
  treat_missing_data  = "notBreaching"

  alarm_actions = var.alarm_actions
  ok_actions    = var.alarm_actions

  tags = local.tags
}

################################################################################
# Dashboard
################################################################################

locals {
  region = data.aws_region.current.name

  function_widgets = [
    for key, fn in local.functions : {
      type   = "metric"
      width  = 12
      height = 6
      properties = {
        title  = "${fn.name}: invocations, errors, throttles, failure mode"
        region = local.region
        stat   = "Sum"
        period = 60
        metrics = [
          ["AWS/Lambda", "Invocations", "FunctionName", fn.name],
          ["AWS/Lambda", "Errors", "FunctionName", fn.name],
          ["AWS/Lambda", "Throttles", "FunctionName", fn.name],
          [var.metrics_namespace, "FailureModeActivations", "Function", fn.name],
        ]
      }
    }
  ]

  duration_widget = {
    type   = "metric"
    width  = 12
    height = 6
    properties = {
      title  = "Function duration p99 (ms)"
      region = local.region
      stat   = "p99"
      period = 60
      metrics = [
        for key, fn in local.functions : ["AWS/Lambda", "Duration", "FunctionName", fn.name]
      ]
    }
  }

  api_widget = {
    type   = "metric"
    width  = 12
    height = 6
    properties = {
      title  = "REST API ${aws_api_gateway_rest_api.this.name}: requests, 4xx (429 = rate limited), 5xx"
      region = local.region
      stat   = "Sum"
      period = 60
      metrics = [
        ["AWS/ApiGateway", "Count", "ApiName", aws_api_gateway_rest_api.this.name, "Stage", var.stage_name],
        ["AWS/ApiGateway", "4XXError", "ApiName", aws_api_gateway_rest_api.this.name, "Stage", var.stage_name],
        ["AWS/ApiGateway", "5XXError", "ApiName", aws_api_gateway_rest_api.this.name, "Stage", var.stage_name],
      ]
    }
  }

  serverless_cache_widgets = [
    for title in ["Serverless cache ${local.cache_id}: ECPUs, throttled commands, evictions"] : {
      type   = "metric"
      width  = 12
      height = 6
      properties = {
        title  = title
        region = local.region
        stat   = "Sum"
        period = 60
        metrics = [
          ["AWS/ElastiCache", "ElastiCacheProcessingUnits", "clusterId", local.cache_id],
          ["AWS/ElastiCache", "ThrottledCmds", "clusterId", local.cache_id],
          ["AWS/ElastiCache", "Evictions", "clusterId", local.cache_id],
        ]
      }
    } if local.serverless
  ]

  node_cache_widgets = [
    for metric in ["EngineCPUUtilization", "DatabaseMemoryUsagePercentage", "Evictions", "CurrConnections"] : {
      type   = "metric"
      width  = 12
      height = 6
      properties = {
        title   = "Cache ${local.cache_id}: ${metric}"
        region  = local.region
        stat    = metric == "Evictions" ? "Sum" : "Maximum"
        period  = 60
        metrics = [for node in local.cache_node_ids : ["AWS/ElastiCache", metric, "CacheClusterId", node]]
      }
    } if !local.serverless
  ]
}

resource "aws_cloudwatch_dashboard" "this" {
  count = var.create_dashboard ? 1 : 0

  dashboard_name = var.name
  dashboard_body = jsonencode({
    widgets = concat(local.function_widgets, [local.duration_widget, local.api_widget], local.serverless_cache_widgets, local.node_cache_widgets)
  })
}
