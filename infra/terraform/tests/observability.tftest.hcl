# Alarms on the functions (errors, throttles, failure-mode activations from the
# EMF metric) and the dashboard. The cache alarms depend on the cache mode and
# are tested in cache.tftest.hcl.

mock_provider "aws" {
  source          = "./tests/mocks"
  override_during = plan
}

variables {
  vpc_id             = "vpc-0123456789abcdef0"
  subnet_ids         = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
  authorizer_package = "tests/fixtures/placeholder.zip"
  limiter_package    = "tests/fixtures/placeholder.zip"
  alarm_actions      = ["arn:aws:sns:eu-west-1:123456789012:oncall"]
}

run "alarms_and_dashboard" {
  command = plan

  assert {
    condition = (
      aws_cloudwatch_metric_alarm.this["authorizer-errors"].namespace == "AWS/Lambda" &&
      aws_cloudwatch_metric_alarm.this["authorizer-errors"].metric_name == "Errors" &&
      aws_cloudwatch_metric_alarm.this["authorizer-errors"].dimensions == tomap({ FunctionName = "tollgate-authorizer" }) &&
      aws_cloudwatch_metric_alarm.this["authorizer-throttles"].metric_name == "Throttles"
    )
    error_message = "The authorizer needs error and throttle alarms."
  }

  assert {
    condition = (
      aws_cloudwatch_metric_alarm.this["authorizer-failure-mode"].namespace == "Tollgate" &&
      aws_cloudwatch_metric_alarm.this["authorizer-failure-mode"].metric_name == "FailureModeActivations" &&
      aws_cloudwatch_metric_alarm.this["authorizer-failure-mode"].dimensions == tomap({ Function = "tollgate-authorizer" })
    )
    error_message = "The failure-mode alarm must watch the EMF metric Tollgate/FailureModeActivations by Function."
  }

  assert {
    condition     = alltrue([for alarm in aws_cloudwatch_metric_alarm.this : alarm.alarm_actions == toset(var.alarm_actions) && alarm.ok_actions == toset(var.alarm_actions)])
    error_message = "Every alarm must notify the alarm actions."
  }

  assert {
    condition     = length(aws_cloudwatch_metric_alarm.this) == 2 * 3 + 2 * 3
    error_message = "Expected 3 alarms per function and 3 per cache node."
  }

  assert {
    condition     = aws_cloudwatch_dashboard.this[0].dashboard_name == "tollgate" && length(jsondecode(aws_cloudwatch_dashboard.this[0].dashboard_body).widgets) == 8
    error_message = "The dashboard must show both functions, durations, the API and four cache metrics."
  }
}

run "alarms_and_dashboard_off" {
  command = plan

  variables {
    create_alarms    = false
    create_dashboard = false
  }

  assert {
    condition     = length(aws_cloudwatch_metric_alarm.this) == 0 && length(aws_cloudwatch_dashboard.this) == 0
    error_message = "create_alarms and create_dashboard must switch them off."
  }
}
