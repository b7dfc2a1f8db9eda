################################################################################
# Security groups: only the Lambdas' group reaches the cache port
################################################################################

resource "aws_security_group" "lambda" {
  name_prefix = "${var.name}-lambda-"
  description = "tollgate Lambda functions"
  vpc_id      = var.vpc_id

  tags = merge(local.tags, { Name = "${var.name}-lambda" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "cache" {
  name_prefix = "${var.name}-cache-"
  description = "tollgate ElastiCache; reachable only from the tollgate Lambda functions"
  vpc_id      = var.vpc_id

  tags = merge(local.tags, { Name = "${var.name}-cache" })

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_vpc_security_group_ingress_rule" "cache_from_lambda" {
  security_group_id            = aws_security_group.cache.id
  description                  = "Cache port from the tollgate Lambda functions"
  ip_protocol                  = "tcp"
  from_port                    = local.cache_port_range.from
  to_port                      = local.cache_port_range.to
  referenced_security_group_id = aws_security_group.lambda.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "lambda_to_cache" {
  security_group_id            = aws_security_group.lambda.id
  description                  = "Cache port of the tollgate cache"
  ip_protocol                  = "tcp"
  from_port                    = local.cache_port_range.from
  to_port                      = local.cache_port_range.to
  referenced_security_group_id = aws_security_group.cache.id

  tags = local.tags
}

resource "aws_vpc_security_group_egress_rule" "lambda_https" {
  for_each = local.token_auth ? toset(var.lambda_https_egress_cidr_blocks) : toset([])

  security_group_id = aws_security_group.lambda.id
  description       = "HTTPS to Secrets Manager (AUTH token)"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
  cidr_ipv4         = each.value

  tags = local.tags
}
