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
