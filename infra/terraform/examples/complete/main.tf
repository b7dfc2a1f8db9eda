provider "aws" {
  region = var.region

  # Only for offline plans with fake credentials; see var.offline.
  skip_credentials_validation = var.offline
  skip_requesting_account_id  = var.offline
  skip_metadata_api_check     = var.offline

  default_tags {
    tags = local.tags
  }
}

locals {
  tags = {
    Example    = var.name
    Repository = "github.com/tollgate-dev/tollgate"
  }

  # Two private subnets in two Availability Zones: enough for Multi-AZ.
  private_subnets = {
    a = "10.42.0.0/20"
    b = "10.42.16.0/20"
  }
}

################################################################################
# Network (a platform team would pass its existing VPC instead)
################################################################################

resource "aws_vpc" "this" {
  cidr_block           = "10.42.0.0/16"
  enable_dns_support   = true
  enable_dns_hostnames = true

  tags = { Name = var.name }
}

resource "aws_subnet" "private" {
  for_each = local.private_subnets

  vpc_id            = aws_vpc.this.id
  cidr_block        = each.value
  availability_zone = "${var.region}${each.key}"

  tags = { Name = "${var.name}-private-${each.key}" }
}

resource "aws_sns_topic" "alarms" {
  name = "${var.name}-alarms"
}

################################################################################
# tollgate
################################################################################

module "tollgate" {
  source = "../.."

  name       = var.name
  vpc_id     = aws_vpc.this.id
  subnet_ids = [for subnet in aws_subnet.private : subnet.id]

  # Valkey in cluster mode: two shards with one replica each, IAM authentication.
  engine               = "valkey"
  engine_version       = "8.0"
  node_type            = "cache.t4g.small"
  cluster_mode_enabled = true
  shards               = 2
  replicas             = 1
  auth_mode            = "iam"

  authorizer_package              = var.authorizer_package
  limiter_package                 = var.limiter_package
  authorizer_reserved_concurrency = 50
  application_log_level           = "INFO"
  log_retention_in_days           = 14

  authorizer_identity_source = "method.request.header.x-api-key"
  backend_url                = var.backend_url
  enable_http_api            = var.backend_url != null

  limiter_function_url_authorization_type = "AWS_IAM"
  limiter_function_url_invoke_mode        = "RESPONSE_STREAM"

  metrics_namespace = "Tollgate"
  alarm_actions     = [aws_sns_topic.alarms.arn]
}
