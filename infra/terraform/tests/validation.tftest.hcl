# Variable validations and preconditions reject bad input before anything is
# planned.

mock_provider "aws" {
  source          = "./tests/mocks"
  override_during = plan
}

variables {
  vpc_id             = "vpc-0123456789abcdef0"
  subnet_ids         = ["subnet-0123456789abcdef0", "subnet-0123456789abcdef1"]
  authorizer_package = "tests/fixtures/placeholder.zip"
  limiter_package    = "tests/fixtures/placeholder.zip"
}

run "rejects_unknown_engine" {
  command = plan

  variables {
    engine = "memcached"
  }

  expect_failures = [var.engine]
}

run "rejects_cached_authorizer_results" {
  command = plan

  variables {
    authorizer_result_ttl_in_seconds = 300
  }

  expect_failures = [var.authorizer_result_ttl_in_seconds]
}

run "rejects_empty_subnet_list" {
  command = plan

  variables {
    subnet_ids = []
  }

  expect_failures = [var.subnet_ids]
}

run "rejects_other_bad_variables" {
  command = plan

  variables {
    name                       = "Tollgate_Prod"
    authorizer_identity_source = "Authorization"
    auth_mode                  = "password"
    shards                     = 3
    enable_http_api            = true
    policy_file                = "/var/task/policy.yaml"
    policy_json                = "not json"
  }

  expect_failures = [
    var.name,
    var.authorizer_identity_source,
    var.auth_mode,
    var.shards,
    var.enable_http_api,
    var.policy_json,
  ]
}

run "auth_token_mode_needs_a_token" {
  command = plan

  variables {
    auth_mode = "auth_token"
  }

  expect_failures = [var.auth_token]
}

run "rejects_short_auth_token" {
  command = plan

  variables {
    auth_mode  = "auth_token"
    auth_token = "short"
  }

  expect_failures = [var.auth_token]
}

run "serverless_needs_iam_auth" {
  command = plan

  variables {
    serverless = true
    auth_mode  = "auth_token"
    auth_token = "correct-horse-battery-staple-42"
  }

  expect_failures = [var.auth_mode]
}

run "multi_az_needs_two_subnets" {
  command = plan

  variables {
    subnet_ids = ["subnet-0123456789abcdef0"]
  }

  expect_failures = [aws_elasticache_replication_group.this]
}

run "iam_auth_needs_engine_7" {
  command = plan

  variables {
    engine         = "redis"
    engine_version = "6.2"
  }

  expect_failures = [aws_elasticache_replication_group.this]
}

run "rejects_reserved_environment_variables" {
  command = plan

  variables {
    environment_variables = {
      _HANDLER             = "main"
      AWS_REGION           = "us-east-1"
      AWS_LAMBDA_LOG_LEVEL = "DEBUG"
      LAMBDA_TASK_ROOT     = "/tmp"
    }
  }

  expect_failures = [var.environment_variables]
}

run "rejects_environment_variables_the_module_sets" {
  command = plan

  variables {
    environment_variables = {
      REDIS_URL       = "redis://must-not-win:6379"
      TOLLGATE_POLICY = "/var/task/other.yaml"
    }
  }

  expect_failures = [var.environment_variables]
}

run "rejects_malformed_maintenance_window" {
  command = plan

  variables {
    maintenance_window = "sun:25:00-sun:26:00"
  }

  expect_failures = [var.maintenance_window]
}

run "rejects_maintenance_window_in_words" {
  command = plan

  variables {
    maintenance_window = "sunday 05:00-06:00"
  }

  expect_failures = [var.maintenance_window]
}

run "rejects_maintenance_window_under_an_hour" {
  command = plan

  variables {
    maintenance_window = "sun:05:00-sun:05:30"
  }

  expect_failures = [var.maintenance_window]
}

run "rejects_empty_parameter_group_name" {
  command = plan

  variables {
    parameter_group_name = ""
  }

  expect_failures = [var.parameter_group_name]
}

run "rejects_parameter_group_name_with_bad_characters" {
  command = plan

  variables {
    parameter_group_name = "my_params!"
  }

  expect_failures = [var.parameter_group_name]
}

run "accepts_maintenance_window_and_parameter_group" {
  command = plan

  variables {
    # Wraps past Saturday midnight: one hour long.
    maintenance_window   = "sat:23:30-sun:00:30"
    parameter_group_name = "tollgate-valkey8.custom"
  }

  assert {
    condition = (
      aws_elasticache_replication_group.this[0].maintenance_window == "sat:23:30-sun:00:30" &&
      aws_elasticache_replication_group.this[0].parameter_group_name == "tollgate-valkey8.custom"
    )
    error_message = "A valid maintenance_window and parameter_group_name must reach the replication group."
  }
}

run "public_function_url_needs_opt_in" {
  command = plan

  variables {
    limiter_function_url_authorization_type = "NONE"
  }

  expect_failures = [var.limiter_function_url_authorization_type]
}

run "rejects_other_metrics_namespace" {
  command = plan

  variables {
    metrics_namespace = "MyCompany/Tollgate"
  }

  expect_failures = [var.metrics_namespace]
}

run "rejects_two_policy_sources_and_a_bad_refresh" {
  command = plan

  variables {
    policy_file            = "/var/task/policy.yaml"
    policy_parameter       = "domain: d\nrules: []\n"
    policy_refresh_seconds = 0
  }

  expect_failures = [
    var.policy_parameter,
    var.policy_refresh_seconds,
  ]
}
