# API Gateway: the REST API's uncached REQUEST authorizer, its gateway
# responses (429 with the decision's headers, 401 for a missing identity), the
# MOCK or HTTP_PROXY integration, and the optional HTTP API.

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

run "rest_api_defaults" {
  command = plan

  # Authorizer: REQUEST, uncached, explicit identity source.
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

  assert {
    condition     = alltrue([for m in aws_api_gateway_method.this : m.authorization == "CUSTOM" && m.authorizer_id == aws_api_gateway_authorizer.this.id])
    error_message = "Every method must go through the tollgate authorizer."
  }

  # Gateway responses.
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

  # MOCK integration when there is no backend.
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

  # Permission, deployment, stage.
  assert {
    condition     = aws_lambda_permission.rest_authorizer.source_arn == "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5/authorizers/auth01"
    error_message = "API Gateway may invoke the authorizer only as this API's authorizer."
  }

  assert {
    condition     = aws_lambda_permission.rest_authorizer.principal == "apigateway.amazonaws.com" && aws_lambda_permission.rest_authorizer.action == "lambda:InvokeFunction"
    error_message = "The authorizer permission must let API Gateway invoke the function."
  }

  assert {
    condition     = contains(keys(aws_api_gateway_deployment.this.triggers), "redeployment")
    error_message = "The deployment must carry a redeployment trigger."
  }

  assert {
    condition     = aws_api_gateway_stage.this.stage_name == "v1" && aws_api_gateway_stage.this.deployment_id == aws_api_gateway_deployment.this.id
    error_message = "The stage must serve the current deployment."
  }

  # The HTTP API is opt-in.
  assert {
    condition     = length(aws_apigatewayv2_api.this) == 0 && output.http_api_invoke_url == null
    error_message = "The HTTP API must be opt-in."
  }
}

run "backend_and_http_api" {
  command = plan

  variables {
    backend_url                = "https://backend.example.com/"
    enable_http_api            = true
    authorizer_identity_source = "method.request.header.Authorization,method.request.querystring.tenant"
  }

  # REST API: HTTP_PROXY to the backend.
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

  # REST API: a custom identity source.
  assert {
    condition     = aws_api_gateway_authorizer.this.identity_source == "method.request.header.Authorization,method.request.querystring.tenant"
    error_message = "The identity_source must come from the variable."
  }

  assert {
    condition     = strcontains(aws_api_gateway_gateway_response.this["UNAUTHORIZED"].response_templates["application/json"], "header Authorization and querystring tenant")
    error_message = "The 401 body must name every identity source."
  }

  # HTTP API: payload 2.0 simple responses, uncached.
  assert {
    condition = (
      aws_apigatewayv2_authorizer.this[0].authorizer_type == "REQUEST" &&
      aws_apigatewayv2_authorizer.this[0].authorizer_payload_format_version == "2.0" &&
      aws_apigatewayv2_authorizer.this[0].enable_simple_responses == true &&
      aws_apigatewayv2_authorizer.this[0].authorizer_result_ttl_in_seconds == 0
    )
    error_message = "The HTTP API authorizer must be an uncached payload 2.0 simple-response REQUEST authorizer."
  }

  assert {
    condition     = aws_apigatewayv2_authorizer.this[0].identity_sources == toset(["$request.header.x-api-key"])
    error_message = "The HTTP API authorizer's identity sources must be set explicitly."
  }

  assert {
    condition = (
      aws_apigatewayv2_route.this[0].authorization_type == "CUSTOM" &&
      aws_apigatewayv2_route.this[0].authorizer_id == aws_apigatewayv2_authorizer.this[0].id &&
      aws_apigatewayv2_route.this[0].target == "integrations/int001"
    )
    error_message = "The HTTP API route must go through the authorizer to the backend."
  }

  assert {
    condition = (
      aws_apigatewayv2_integration.this[0].integration_type == "HTTP_PROXY" &&
      aws_apigatewayv2_integration.this[0].integration_uri == "https://backend.example.com/" &&
      aws_apigatewayv2_integration.this[0].request_parameters["overwrite:header.RateLimit"] == "$context.authorizer.rateLimit"
    )
    error_message = "The HTTP API must proxy to the backend and pass the decision's headers."
  }

  assert {
    condition     = aws_lambda_permission.http_authorizer[0].source_arn == "arn:aws:execute-api:eu-west-1:123456789012:f6g7h8i9j0/authorizers/auth02"
    error_message = "API Gateway may invoke the authorizer only as this HTTP API's authorizer."
  }
}
