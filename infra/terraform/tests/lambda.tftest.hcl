# The two functions: runtime and package, logging, VPC, concurrency, extra
# environment, and the decision service's Function URL.

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

run "functions_and_function_url" {
  command = plan

  variables {
    limiter_function_url_allowed_principals = ["arn:aws:iam::123456789012:role/envoy"]
  }

  assert {
    condition = alltrue([
      for fn in aws_lambda_function.this :
      fn.runtime == "provided.al2023" && fn.architectures == tolist(["arm64"]) && fn.handler == "bootstrap"
    ])
    error_message = "Both functions must run bootstrap on provided.al2023/arm64."
  }

  assert {
    condition     = aws_lambda_function.this["authorizer"].source_code_hash == filebase64sha256("tests/fixtures/placeholder.zip")
    error_message = "The function must redeploy when its zip changes."
  }

  assert {
    condition     = alltrue([for fn in aws_lambda_function.this : fn.logging_config[0].log_format == "JSON" && fn.logging_config[0].application_log_level == "INFO"])
    error_message = "The functions must log in JSON so Lambda can filter by level."
  }

  assert {
    condition     = aws_lambda_function.this["authorizer"].logging_config[0].log_group == "/aws/lambda/tollgate-authorizer" && aws_cloudwatch_log_group.this["authorizer"].retention_in_days == 30
    error_message = "The authorizer must log to its own log group with a retention."
  }

  assert {
    condition     = aws_lambda_function.this["authorizer"].vpc_config[0].subnet_ids == toset(var.subnet_ids)
    error_message = "The functions must run in the given private subnets."
  }

  assert {
    condition     = alltrue([for fn in aws_lambda_function.this : fn.reserved_concurrent_executions == -1])
    error_message = "Without reserved concurrency the functions must use the unreserved pool."
  }

  assert {
    condition = (
      aws_lambda_function_url.limiter[0].function_name == "tollgate-limiter" &&
      aws_lambda_function_url.limiter[0].authorization_type == "AWS_IAM" &&
      aws_lambda_function_url.limiter[0].invoke_mode == "RESPONSE_STREAM"
    )
    error_message = "The decision service must be exposed by an AWS_IAM, RESPONSE_STREAM Function URL."
  }

  assert {
    condition = (
      aws_lambda_permission.limiter_function_url["arn:aws:iam::123456789012:role/envoy"].action == "lambda:InvokeFunctionUrl" &&
      aws_lambda_permission.limiter_function_url["arn:aws:iam::123456789012:role/envoy"].function_url_auth_type == "AWS_IAM"
    )
    error_message = "Listed principals must be allowed to invoke the Function URL."
  }

  assert {
    condition     = length(aws_lambda_permission.limiter_function_url_public) == 0
    error_message = "An AWS_IAM Function URL must not be public."
  }
}

run "concurrency_environment_and_no_function_url" {
  command = plan

  variables {
    authorizer_reserved_concurrency = 100
    create_limiter_function_url     = false
    policy_json                     = "{\"rules\":[]}"
    environment_variables = {
      TOLLGATE_LOG_LEVEL = "debug"
      REDIS_POOL_SIZE    = "20"
      AWS_MAX_ATTEMPTS   = "5"
    }
  }

  assert {
    condition     = aws_lambda_function.this["authorizer"].reserved_concurrent_executions == 100 && aws_lambda_function.this["limiter"].reserved_concurrent_executions == -1
    error_message = "Reserved concurrency must apply to the authorizer only."
  }

  assert {
    condition = (
      aws_lambda_function.this["limiter"].environment[0].variables.TOLLGATE_LOG_LEVEL == "debug" &&
      aws_lambda_function.this["limiter"].environment[0].variables.REDIS_POOL_SIZE == "20" &&
      aws_lambda_function.this["limiter"].environment[0].variables.AWS_MAX_ATTEMPTS == "5" &&
      startswith(aws_lambda_function.this["limiter"].environment[0].variables.REDIS_URL, "rediss://master.")
    )
    error_message = "Extra variables (including REDIS_* and AWS_* names the module and Lambda leave free) must be added next to the cache wiring."
  }

  assert {
    condition     = aws_lambda_function.this["authorizer"].environment[0].variables.TOLLGATE_POLICY_JSON == "{\"rules\":[]}" && !contains(keys(aws_lambda_function.this["authorizer"].environment[0].variables), "TOLLGATE_POLICY")
    error_message = "policy_json must become TOLLGATE_POLICY_JSON, without TOLLGATE_POLICY."
  }

  assert {
    condition     = length(aws_lambda_function_url.limiter) == 0 && output.limiter_function_url == null
    error_message = "create_limiter_function_url = false must create no Function URL."
  }
}

run "public_function_url_with_opt_in" {
  command = plan

  variables {
    limiter_function_url_authorization_type = "NONE"
    allow_public_function_url               = true
  }

  assert {
    condition     = aws_lambda_function_url.limiter[0].authorization_type == "NONE"
    error_message = "With the opt-in, the Function URL must be public."
  }

  assert {
    condition = (
      aws_lambda_permission.limiter_function_url_public[0].principal == "*" &&
      aws_lambda_permission.limiter_function_url_public[0].function_url_auth_type == "NONE"
    )
    error_message = "A public Function URL needs the resource policy that lets anyone invoke it."
  }
}

run "policy_in_an_ssm_parameter" {
  command = plan

  variables {
    policy_parameter       = "domain: public-api\nrules: []\n"
    policy_refresh_seconds = 60
  }

  assert {
    condition = (
      aws_ssm_parameter.policy[0].name == "/tollgate/policy" &&
      aws_ssm_parameter.policy[0].type == "String" &&
      aws_ssm_parameter.policy[0].tier == "Standard" &&
      aws_ssm_parameter.policy[0].value == var.policy_parameter
    )
    error_message = "policy_parameter must become a Standard String parameter /<name>/policy holding the document."
  }

  assert {
    condition = alltrue([
      for fn in aws_lambda_function.this :
      fn.environment[0].variables.TOLLGATE_POLICY_SSM == "/tollgate/policy" &&
      fn.environment[0].variables.TOLLGATE_POLICY_POLL == "60s" &&
      !contains(keys(fn.environment[0].variables), "TOLLGATE_POLICY") &&
      !contains(keys(fn.environment[0].variables), "TOLLGATE_POLICY_JSON")
    ])
    error_message = "Both functions must read the parameter (TOLLGATE_POLICY_SSM) every policy_refresh_seconds (TOLLGATE_POLICY_POLL), and no other policy source."
  }

  assert {
    condition = alltrue([
      for key, fn in local.functions :
      length([for st in jsondecode(aws_iam_role_policy.this[key].policy).Statement : st if st.Sid == "ReadPolicyParameter" && st.Action == ["ssm:GetParameter"] && st.Resource == ["arn:aws:ssm:eu-west-1:123456789012:parameter/tollgate/policy"]]) == 1
    ])
    error_message = "Each function's role must allow ssm:GetParameter on the policy parameter, and nothing wider."
  }
}

run "large_policy_parameter_is_advanced" {
  command = plan

  variables {
    policy_parameter = join("", ["domain: d\nrules: []\n", join("", [for i in range(600) : "# padding\n"])])
  }

  assert {
    condition     = aws_ssm_parameter.policy[0].tier == "Advanced"
    error_message = "A policy over 4 KB needs an Advanced parameter."
  }
}

run "no_parameter_by_default" {
  command = plan

  assert {
    condition     = length(aws_ssm_parameter.policy) == 0 && alltrue([for fn in aws_lambda_function.this : !contains(keys(fn.environment[0].variables), "TOLLGATE_POLICY_SSM")])
    error_message = "Without policy_parameter the module must create no parameter and set no TOLLGATE_POLICY_SSM."
  }
}
