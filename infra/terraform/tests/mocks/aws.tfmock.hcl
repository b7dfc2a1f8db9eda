# Shared mock values for the AWS provider: computed attributes that the module
# reads back (ARNs, endpoints) get realistic shapes instead of random strings.

mock_data "aws_region" {
  defaults = {
    name = "eu-west-1"
  }
}

mock_resource "aws_cloudwatch_log_group" {
  defaults = {
    arn = "arn:aws:logs:eu-west-1:123456789012:log-group:/aws/lambda/mock"
  }
}

mock_resource "aws_iam_role" {
  defaults = {
    arn = "arn:aws:iam::123456789012:role/mock"
  }
}

mock_resource "aws_secretsmanager_secret" {
  defaults = {
    arn = "arn:aws:secretsmanager:eu-west-1:123456789012:secret:tollgate-redis-auth-token-AbCdEf"
  }
}

mock_resource "aws_elasticache_replication_group" {
  defaults = {
    arn                            = "arn:aws:elasticache:eu-west-1:123456789012:replicationgroup:tollgate"
    primary_endpoint_address       = "master.tollgate.abc123.euw1.cache.amazonaws.com"
    configuration_endpoint_address = "clustercfg.tollgate.abc123.euw1.cache.amazonaws.com"
  }
}

mock_resource "aws_elasticache_serverless_cache" {
  defaults = {
    arn = "arn:aws:elasticache:eu-west-1:123456789012:serverlesscache:tollgate"
    endpoint = [{
      address = "tollgate-abc123.serverless.euw1.cache.amazonaws.com"
      port    = 6379
    }]
  }
}

mock_resource "aws_elasticache_user" {
  defaults = {
    arn = "arn:aws:elasticache:eu-west-1:123456789012:user:tollgate-app"
  }
}

mock_resource "aws_lambda_function" {
  defaults = {
    arn        = "arn:aws:lambda:eu-west-1:123456789012:function:mock"
    invoke_arn = "arn:aws:apigateway:eu-west-1:lambda:path/2015-03-31/functions/arn:aws:lambda:eu-west-1:123456789012:function:mock/invocations"
  }
}

mock_resource "aws_api_gateway_rest_api" {
  defaults = {
    id               = "a1b2c3d4e5"
    root_resource_id = "r00t1d"
    execution_arn    = "arn:aws:execute-api:eu-west-1:123456789012:a1b2c3d4e5"
  }
}

mock_resource "aws_apigatewayv2_api" {
  defaults = {
    id            = "f6g7h8i9j0"
    execution_arn = "arn:aws:execute-api:eu-west-1:123456789012:f6g7h8i9j0"
  }
}

mock_resource "aws_api_gateway_authorizer" {
  defaults = {
    id = "auth01"
  }
}

mock_resource "aws_api_gateway_resource" {
  defaults = {
    id = "prox01"
  }
}

mock_resource "aws_api_gateway_deployment" {
  defaults = {
    id = "dep001"
  }
}

mock_resource "aws_apigatewayv2_authorizer" {
  defaults = {
    id = "auth02"
  }
}

mock_resource "aws_apigatewayv2_integration" {
  defaults = {
    id = "int001"
  }
}

# Distinct IDs for the two security groups, so tests can tell them apart.
override_resource {
  target          = aws_security_group.lambda
  override_during = plan
  values = {
    id  = "sg-0aaaaaaaaaaaaaaaa"
    arn = "arn:aws:ec2:eu-west-1:123456789012:security-group/sg-0aaaaaaaaaaaaaaaa"
  }
}

override_resource {
  target          = aws_security_group.cache
  override_during = plan
  values = {
    id  = "sg-0bbbbbbbbbbbbbbbb"
    arn = "arn:aws:ec2:eu-west-1:123456789012:security-group/sg-0bbbbbbbbbbbbbbbb"
  }
}

mock_resource "aws_ssm_parameter" {
  defaults = {
    arn = "arn:aws:ssm:eu-west-1:123456789012:parameter/tollgate/policy"
  }
}
