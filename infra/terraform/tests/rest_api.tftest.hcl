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

run "authorizer_is_uncached_request_authorizer" {
  command = plan

  assert {
    condition     = aws_api_gateway_authorizer.this.type == "REQUEST"
    error_message = "The REST authorizer must be a REQUEST authorizer."
  }

  assert {
    condition     = aws_api_gateway_authorizer.this.authorizer_result_ttl_in_seconds == 0
    error_message = "The REST authorizer must not cache results (TTL 0)."
  }

  assert {
    condition     = aws_api_gateway_authorizer.this.identity_source == "method.request.header.x-api-key"
    error_message = "The REST authorizer's identity_source must be set explicitly to the x-api-key header."
  }
}

run "access_denied_becomes_429_with_decision_headers" {
  command = plan

  assert {
    condition     = aws_api_gateway_gateway_response.this["ACCESS_DENIED"].status_code == "429"
    error_message = "ACCESS_DENIED (the authorizer's Deny) must answer 429."
  }

  assert {
    condition = (
      aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_parameters["gatewayresponse.header.Retry-After"] == "context.authorizer.retryAfter" &&
      aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_parameters["gatewayresponse.header.RateLimit"] == "context.authorizer.rateLimit" &&
      aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_parameters["gatewayresponse.header.RateLimit-Policy"] == "context.authorizer.rateLimitPolicy"
    )
    error_message = "The 429 response must map Retry-After, RateLimit and RateLimit-Policy from the authorizer context."
  }

  assert {
    condition = (
      aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_parameters["gatewayresponse.header.X-RateLimit-Limit"] == "context.authorizer.limit" &&
      aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_parameters["gatewayresponse.header.X-RateLimit-Remaining"] == "context.authorizer.remaining" &&
      aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_parameters["gatewayresponse.header.X-RateLimit-Reset"] == "context.authorizer.reset"
    )
    error_message = "The 429 response must map the X-RateLimit-* headers from the authorizer context."
  }

  assert {
    condition = jsondecode(aws_api_gateway_gateway_response.this["ACCESS_DENIED"].response_templates["application/json"]) == {
      message     = "rate limited"
      rule        = "$context.authorizer.rule"
      retry_after = "$context.authorizer.retryAfter"
    }
    error_message = "The 429 body must say it was rate limited, by which rule, and when to retry."
  }

  assert {
    condition     = aws_api_gateway_gateway_response.this["UNAUTHORIZED"].status_code == "401"
    error_message = "UNAUTHORIZED (missing identity) must answer 401."
  }

  assert {
    condition     = strcontains(aws_api_gateway_gateway_response.this["UNAUTHORIZED"].response_templates["application/json"], "header x-api-key")
    error_message = "The 401 body must name the missing identity source."
  }
}

run "mock_integration_without_backend" {
  command = plan

  assert {
    condition     = alltrue([for i in aws_api_gateway_integration.this : i.type == "MOCK" && i.uri == null])
    error_message = "Without backend_url every integration must be a MOCK."
  }

  assert {
    condition     = length(aws_api_gateway_method_response.ok) == 2 && length(aws_api_gateway_integration_response.ok) == 2
    error_message = "The MOCK integrations need a 200 method and integration response on / and /{proxy+}."
  }

  assert {
    condition     = aws_api_gateway_integration_response.ok["proxy"].response_parameters["method.response.header.RateLimit"] == "context.authorizer.rateLimit"
    error_message = "Allowed MOCK responses must carry the RateLimit header from the authorizer context."
  }

  assert {
    condition     = alltrue([for m in aws_api_gateway_method.this : m.authorization == "CUSTOM" && m.authorizer_id == aws_api_gateway_authorizer.this.id])
    error_message = "Every method must go through the tollgate authorizer."
  }
}

run "http_proxy_integration_with_backend" {
  command = plan

  variables {
    backend_url = "https://backend.example.com/"
  }

  assert {
    condition     = aws_api_gateway_integration.this["proxy"].type == "HTTP_PROXY" && aws_api_gateway_integration.this["proxy"].uri == "https://backend.example.com/{proxy}"
    error_message = "With backend_url the /{proxy+} integration must proxy to BACKEND/{proxy}."
  }

  assert {
    condition     = aws_api_gateway_integration.this["root"].uri == "https://backend.example.com/"
    error_message = "With backend_url the / integration must proxy to the backend URL."
  }

  assert {
    condition     = aws_api_gateway_integration.this["proxy"].request_parameters["integration.request.header.X-RateLimit-Remaining"] == "context.authorizer.remaining"
    error_message = "The backend must receive the decision's X-RateLimit-Remaining header."
  }

  assert {
    condition     = length(aws_api_gateway_method_response.ok) == 0
    error_message = "HTTP_PROXY integrations need no method responses."
  }
}

run "authorizer_permission_and_redeployment" {
  command = plan

  assert {
    condition     = aws_lambda_permission.rest_authorizer.source_arn == "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/authorizers/${aws_api_gateway_authorizer.this.id}"
    error_message = "API Gateway may invoke the authorizer only as this API's authorizer."
  }

  assert {
    condition     = aws_lambda_permission.rest_authorizer.principal == "apigateway.amazonaws.com" && aws_lambda_permission.rest_authorizer.action == "lambda:InvokeFunction"
    error_message = "The authorizer permission must let API Gateway invoke the function."
  }

  assert {
    condition     = keys(aws_api_gateway_deployment.this.triggers) == ["redeployment"]
    error_message = "The deployment must carry a redeployment trigger."
  }

  assert {
    condition     = aws_api_gateway_stage.this.stage_name == "v1" && aws_api_gateway_stage.this.deployment_id == aws_api_gateway_deployment.this.id
    error_message = "The stage must serve the current deployment."
  }
}

run "custom_identity_source" {
  command = plan

  variables {
    authorizer_identity_source = "method.request.header.Authorization,method.request.querystring.tenant"
  }

  assert {
    condition     = aws_api_gateway_authorizer.this.identity_source == "method.request.header.Authorization,method.request.querystring.tenant"
    error_message = "The identity_source must come from the variable."
  }

  assert {
    condition     = strcontains(aws_api_gateway_gateway_response.this["UNAUTHORIZED"].response_templates["application/json"], "header Authorization and querystring tenant")
    error_message = "The 401 body must name every identity source."
  }
}
