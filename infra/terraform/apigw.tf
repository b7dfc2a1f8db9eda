################################################################################
# REST API with the tollgate REQUEST authorizer
################################################################################

locals {
  # Header name => authorizer context key. The authorizer returns these keys
  # in its context on Allow and on Deny: limit, remaining, reset, retryAfter,
  # rateLimit, rateLimitPolicy, rule.
  rate_limit_headers = {
    "RateLimit"             = "rateLimit"
    "RateLimit-Policy"      = "rateLimitPolicy"
    "X-RateLimit-Limit"     = "limit"
    "X-RateLimit-Remaining" = "remaining"
    "X-RateLimit-Reset"     = "reset"
  }

  identity_hint = join(" and ", [
    for source in split(",", var.authorizer_identity_source) :
    replace(trimprefix(trimspace(source), "method.request."), ".", " ")
  ])

  gateway_responses = {
    # The authorizer denies when a limit is exhausted: answer 429 with the
    # decision's headers instead of API Gateway's default 403.
    ACCESS_DENIED = {
      status_code = "429"
      headers = merge(
        { "Retry-After" = "context.authorizer.retryAfter" },
        { for header, key in local.rate_limit_headers : header => "context.authorizer.${key}" },
      )
      body = jsonencode({
        message     = "rate limited"
        rule        = "$context.authorizer.rule"
        retry_after = "$context.authorizer.retryAfter"
      })
    }
    # The identity source is missing or empty: API Gateway answers before
    # calling the authorizer, so nothing was counted.
    UNAUTHORIZED = {
      status_code = "401"
      headers     = {}
      body = jsonencode({
        message = "missing identity: send ${local.identity_hint}"
      })
    }
    # The authorizer failed (timeout, crash): the failure policy in the
    # function did not get to decide.
    AUTHORIZER_FAILURE = {
      status_code = "503"
      headers     = { "Retry-After" = "'1'" }
      body = jsonencode({
        message = "rate limiter unavailable"
      })
    }
  }

  rest_resources = {
    root  = aws_api_gateway_rest_api.this.root_resource_id
    proxy = aws_api_gateway_resource.proxy.id
  }
}

resource "aws_api_gateway_rest_api" "this" {
  name        = "${var.name}-api"
  description = "Example API behind the tollgate rate-limiting authorizer"

  endpoint_configuration {
    types = [var.rest_api_endpoint_type]
  }

  tags = local.tags
}

resource "aws_api_gateway_authorizer" "this" {
  name        = "${var.name}-authorizer"
  rest_api_id = aws_api_gateway_rest_api.this.id

  type           = "REQUEST"
  authorizer_uri = aws_lambda_function.this["authorizer"].invoke_arn

  # Set explicitly: the provider's default is the Authorization header.
  identity_source = var.authorizer_identity_source

  # Every request must reach the limiter; a cached decision would not be counted.
  authorizer_result_ttl_in_seconds = var.authorizer_result_ttl_in_seconds
}

resource "aws_lambda_permission" "rest_authorizer" {
  statement_id  = "AllowRestApiAuthorizer"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this["authorizer"].function_name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_api_gateway_rest_api.this.execution_arn}/authorizers/${aws_api_gateway_authorizer.this.id}"
}

resource "aws_api_gateway_gateway_response" "this" {
  for_each = local.gateway_responses

  rest_api_id   = aws_api_gateway_rest_api.this.id
  response_type = each.key
  status_code   = each.value.status_code

  response_parameters = { for header, source in each.value.headers : "gatewayresponse.header.${header}" => source }
  response_templates  = { "application/json" = each.value.body }
}

resource "aws_api_gateway_resource" "proxy" {
  rest_api_id = aws_api_gateway_rest_api.this.id
  parent_id   = aws_api_gateway_rest_api.this.root_resource_id
  path_part   = "{proxy+}"
}

resource "aws_api_gateway_method" "this" {
  for_each = local.rest_resources

  rest_api_id   = aws_api_gateway_rest_api.this.id
  resource_id   = each.value
  http_method   = "ANY"
  authorization = "CUSTOM"
  authorizer_id = aws_api_gateway_authorizer.this.id

  request_parameters = each.key == "proxy" ? { "method.request.path.proxy" = true } : {}
}

resource "aws_api_gateway_integration" "this" {
  for_each = local.rest_resources

  rest_api_id = aws_api_gateway_rest_api.this.id
  resource_id = each.value
  http_method = aws_api_gateway_method.this[each.key].http_method

  # HTTP_PROXY to the backend when one is given, else a MOCK that answers 200.
  type                    = local.backend ? "HTTP_PROXY" : "MOCK"
  integration_http_method = local.backend ? "ANY" : null
  uri = local.backend ? (
    each.key == "proxy" ? "${trimsuffix(var.backend_url, "/")}/{proxy}" : var.backend_url
  ) : null

  # The backend learns the decision through request headers.
  request_parameters = local.backend ? merge(
    each.key == "proxy" ? { "integration.request.path.proxy" = "method.request.path.proxy" } : {},
    { for header, key in local.rate_limit_headers : "integration.request.header.${header}" => "context.authorizer.${key}" },
  ) : {}

  request_templates = local.backend ? null : {
    "application/json" = jsonencode({ statusCode = 200 })
  }
}

# The MOCK integration needs its own method and integration responses; they
# also carry the decision's headers to the client.
resource "aws_api_gateway_method_response" "ok" {
  for_each = local.backend ? {} : local.rest_resources

  rest_api_id = aws_api_gateway_rest_api.this.id
  resource_id = each.value
  http_method = aws_api_gateway_method.this[each.key].http_method
  status_code = "200"

  response_models     = { "application/json" = "Empty" }
  response_parameters = { for header, key in local.rate_limit_headers : "method.response.header.${header}" => true }
}

resource "aws_api_gateway_integration_response" "ok" {
  for_each = local.backend ? {} : local.rest_resources

  rest_api_id = aws_api_gateway_rest_api.this.id
  resource_id = each.value
  http_method = aws_api_gateway_method.this[each.key].http_method
  status_code = aws_api_gateway_method_response.ok[each.key].status_code

  response_parameters = { for header, key in local.rate_limit_headers : "method.response.header.${header}" => "context.authorizer.${key}" }
  response_templates = {
    "application/json" = jsonencode({
      message   = "allowed by tollgate"
      rule      = "$context.authorizer.rule"
      remaining = "$context.authorizer.remaining"
    })
  }

  depends_on = [aws_api_gateway_integration.this]
}

resource "aws_api_gateway_deployment" "this" {
  rest_api_id = aws_api_gateway_rest_api.this.id
  description = "tollgate example API"

  triggers = {
    redeployment = sha1(jsonencode([
      aws_api_gateway_authorizer.this,
      aws_api_gateway_gateway_response.this,
      aws_api_gateway_resource.proxy,
      aws_api_gateway_method.this,
      aws_api_gateway_integration.this,
      aws_api_gateway_method_response.ok,
      aws_api_gateway_integration_response.ok,
    ]))
  }

  lifecycle {
    create_before_destroy = true
  }

  depends_on = [
    aws_api_gateway_gateway_response.this,
    aws_api_gateway_integration.this,
    aws_api_gateway_integration_response.ok,
  ]
}

resource "aws_api_gateway_stage" "this" {
  rest_api_id   = aws_api_gateway_rest_api.this.id
  deployment_id = aws_api_gateway_deployment.this.id
  stage_name    = var.stage_name
  description   = "tollgate example API"

  tags = local.tags
}

################################################################################
# HTTP API (v2) with a payload 2.0 simple-response authorizer
################################################################################

resource "aws_apigatewayv2_api" "this" {
  count = var.enable_http_api ? 1 : 0

  name          = "${var.name}-http-api"
  description   = "Example HTTP API behind the tollgate rate-limiting authorizer"
  protocol_type = "HTTP"

  tags = local.tags
}

resource "aws_apigatewayv2_authorizer" "this" {
  count = var.enable_http_api ? 1 : 0

  api_id          = aws_apigatewayv2_api.this[0].id
  name            = "${var.name}-authorizer"
  authorizer_type = "REQUEST"
  authorizer_uri  = aws_lambda_function.this["authorizer"].invoke_arn

  authorizer_payload_format_version = "2.0"
  enable_simple_responses           = true
  identity_sources                  = var.http_api_identity_sources
  authorizer_result_ttl_in_seconds  = var.authorizer_result_ttl_in_seconds
}

resource "aws_lambda_permission" "http_authorizer" {
  count = var.enable_http_api ? 1 : 0

  statement_id  = "AllowHttpApiAuthorizer"
  action        = "lambda:InvokeFunction"
  function_name = aws_lambda_function.this["authorizer"].function_name
  principal     = "apigateway.amazonaws.com"
  source_arn    = "${aws_apigatewayv2_api.this[0].execution_arn}/authorizers/${aws_apigatewayv2_authorizer.this[0].id}"
}

resource "aws_apigatewayv2_integration" "this" {
  count = var.enable_http_api ? 1 : 0

  api_id             = aws_apigatewayv2_api.this[0].id
  description        = "Backend behind tollgate"
  integration_type   = "HTTP_PROXY"
  integration_method = "ANY"
  integration_uri    = var.backend_url

  # Keep the client's path, and tell the backend the decision.
  request_parameters = merge(
    { "overwrite:path" = "$request.path" },
    { for header, key in local.rate_limit_headers : "overwrite:header.${header}" => "$context.authorizer.${key}" },
  )
}

resource "aws_apigatewayv2_route" "this" {
  count = var.enable_http_api ? 1 : 0

  api_id             = aws_apigatewayv2_api.this[0].id
  route_key          = "$default"
  target             = "integrations/${aws_apigatewayv2_integration.this[0].id}"
  authorization_type = "CUSTOM"
  authorizer_id      = aws_apigatewayv2_authorizer.this[0].id
}

resource "aws_apigatewayv2_stage" "this" {
  count = var.enable_http_api ? 1 : 0

  api_id      = aws_apigatewayv2_api.this[0].id
  name        = "$default"
  auto_deploy = true

  tags = local.tags
}
