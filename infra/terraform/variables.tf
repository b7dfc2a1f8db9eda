################################################################################
# General
################################################################################

variable "name" {
  description = "Name prefix for every resource; also the replication group or serverless cache ID. Lower-case letters, digits and single hyphens, starting with a letter, at most 28 characters."
  type        = string
  default     = "tollgate"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{0,26}[a-z0-9]$", var.name)) && !strcontains(var.name, "--")
    error_message = "The name must be 2 to 28 lower-case letters, digits or single hyphens, start with a letter and not end with a hyphen (ElastiCache IDs allow 40 characters and the module appends suffixes)."
  }
}

variable "tags" {
  description = "Tags added to every resource that takes tags."
  type        = map(string)
  default     = {}
}

################################################################################
# Network
################################################################################

variable "vpc_id" {
  description = "ID of the existing VPC that holds the cache and the Lambdas."
  type        = string

  validation {
    condition     = can(regex("^vpc-[0-9a-f]+$", var.vpc_id))
    error_message = "The vpc_id must look like vpc-0123456789abcdef0."
  }
}

variable "subnet_ids" {
  description = "IDs of private subnets (ideally one per Availability Zone) for the cache and the Lambdas' network interfaces. Multi-AZ caches and serverless caches need at least two."
  type        = list(string)

  validation {
    condition     = length(var.subnet_ids) > 0
    error_message = "The subnet_ids list must name at least one private subnet."
  }

  validation {
    condition     = alltrue([for id in var.subnet_ids : can(regex("^subnet-[0-9a-f]+$", id))])
    error_message = "Every entry of subnet_ids must look like subnet-0123456789abcdef0."
  }
}

variable "lambda_https_egress_cidr_blocks" {
  description = "IPv4 CIDR blocks the Lambdas may reach on port 443, used only with auth_mode = \"auth_token\" to read the token from Secrets Manager (through a NAT gateway or an interface endpoint). IAM authentication signs its token locally and needs no egress besides the cache."
  type        = list(string)
  default     = ["0.0.0.0/0"]

  validation {
    condition     = alltrue([for cidr in var.lambda_https_egress_cidr_blocks : can(cidrhost(cidr, 0))])
    error_message = "Every entry of lambda_https_egress_cidr_blocks must be an IPv4 CIDR block such as 10.0.0.0/16."
  }
}

################################################################################
# Cache
################################################################################

variable "serverless" {
  description = "Create an ElastiCache Serverless cache instead of a replication group. Node type, replicas and shards are then ignored; the cache always speaks TLS and is cluster-mode compatible."
  type        = bool
  default     = false
}

variable "engine" {
  description = "Cache engine: \"valkey\" or \"redis\" (Redis OSS)."
  type        = string
  default     = "valkey"

  validation {
    condition     = contains(["valkey", "redis"], var.engine)
    error_message = "The engine must be \"valkey\" or \"redis\"."
  }
}

variable "engine_version" {
  description = "Engine version as MAJOR.MINOR (serverless caches use only the major part). Null picks 8.0 for valkey and 7.1 for redis; IAM authentication needs valkey 7.2+ or redis 7.0+."
  type        = string
  default     = null

  validation {
    condition     = var.engine_version == null || can(regex("^[0-9]+\\.[0-9]+$", var.engine_version))
    error_message = "The engine_version must look like 8.0 or 7.1."
  }
}

variable "node_type" {
  description = "Instance class of the cache nodes (replication group only)."
  type        = string
  default     = "cache.t4g.small"

  validation {
    condition     = can(regex("^cache\\.[a-z0-9]+\\.[a-z0-9]+$", var.node_type))
    error_message = "The node_type must be an ElastiCache node type such as cache.t4g.small or cache.r7g.large."
  }
}

variable "port" {
  description = "Port the cache listens on (replication group only; serverless caches listen on 6379)."
  type        = number
  default     = 6379

  validation {
    condition     = var.port >= 1024 && var.port <= 65535 && floor(var.port) == var.port
    error_message = "The port must be a whole number from 1024 to 65535."
  }
}

variable "replicas" {
  description = "Read replicas per shard, 0 to 5. Any replica turns on automatic failover and Multi-AZ."
  type        = number
  default     = 1

  validation {
    condition     = var.replicas >= 0 && var.replicas <= 5 && floor(var.replicas) == var.replicas
    error_message = "The replicas must be a whole number from 0 to 5."
  }
}

variable "cluster_mode_enabled" {
  description = "Run the replication group in cluster mode (sharded). The functions then get REDIS_CLUSTER=true and connect to the configuration endpoint."
  type        = bool
  default     = false
}

variable "shards" {
  description = "Number of shards (node groups) when cluster_mode_enabled is true."
  type        = number
  default     = 1

  validation {
    condition     = var.shards >= 1 && var.shards <= 500 && floor(var.shards) == var.shards
    error_message = "The shards must be a whole number from 1 to 500."
  }

  validation {
    condition     = var.shards == 1 || var.cluster_mode_enabled
    error_message = "More than one shard needs cluster_mode_enabled = true."
  }
}

variable "parameter_group_name" {
  description = "Cache parameter group of the replication group. Null uses the engine's default group for the major version (default.valkey8, default.valkey8.cluster.on, ...)."
  type        = string
  default     = null

  validation {
    condition     = var.parameter_group_name == null || can(regex("^[A-Za-z]([A-Za-z0-9.-]{0,253}[A-Za-z0-9])?$", var.parameter_group_name))
    error_message = "The parameter_group_name must be null or a parameter group name: 1 to 255 letters, digits, hyphens or periods, starting with a letter and ending with a letter or digit."
  }
}

variable "kms_key_arn" {
  description = "ARN of a customer managed KMS key for at-rest encryption of the cache. Null uses the AWS owned key; at-rest encryption is on either way."
  type        = string
  default     = null

  validation {
    condition     = var.kms_key_arn == null || can(regex("^arn:aws[a-z-]*:kms:", var.kms_key_arn))
    error_message = "The kms_key_arn must be a KMS key ARN (arn:aws:kms:...)."
  }
}

variable "snapshot_retention_limit" {
  description = "Days of automatic snapshots to keep; 0 turns them off. Rate-limit counters live for seconds to hours, so snapshots are rarely worth it."
  type        = number
  default     = 0

  validation {
    condition     = var.snapshot_retention_limit >= 0 && var.snapshot_retention_limit <= 35
    error_message = "The snapshot_retention_limit must be from 0 to 35 days."
  }
}

variable "maintenance_window" {
  description = "Weekly maintenance window of the replication group: ddd:hh24:mi-ddd:hh24:mi in UTC, at least 60 minutes, e.g. sun:05:00-sun:06:00. Null lets AWS choose."
  type        = string
  default     = null

  validation {
    condition     = var.maintenance_window == null || can(regex("^(sun|mon|tue|wed|thu|fri|sat):([01][0-9]|2[0-3]):[0-5][0-9]-(sun|mon|tue|wed|thu|fri|sat):([01][0-9]|2[0-3]):[0-5][0-9]$", lower(var.maintenance_window)))
    error_message = "The maintenance_window must be null or ddd:hh24:mi-ddd:hh24:mi in UTC, e.g. sun:05:00-sun:06:00 (days sun, mon, tue, wed, thu, fri, sat)."
  }

  # ElastiCache's shortest window is 60 minutes. Minutes of the week of the end
  # minus those of the start, modulo a week (windows may wrap past Saturday).
  validation {
    condition = var.maintenance_window == null || try(
      (
        sum([
          for i, part in split("-", lower(var.maintenance_window)) :
          (i == 0 ? -1 : 1) * (
            index(["sun", "mon", "tue", "wed", "thu", "fri", "sat"], split(":", part)[0]) * 1440 +
            tonumber(split(":", part)[1]) * 60 +
            tonumber(split(":", part)[2])
          )
        ]) + 10080
      ) % 10080 >= 60,
      true # a malformed window is reported by the format check above
    )
    error_message = "The maintenance_window must last at least 60 minutes (ElastiCache's minimum), e.g. sun:05:00-sun:06:00."
  }
}

variable "apply_immediately" {
  description = "Apply cache modifications at once instead of in the next maintenance window."
  type        = bool
  default     = false
}

variable "serverless_max_data_storage_gb" {
  description = "Upper limit of data storage of the serverless cache in GB. Null leaves it unlimited."
  type        = number
  default     = null

  validation {
    condition     = var.serverless_max_data_storage_gb == null || try(var.serverless_max_data_storage_gb >= 1, false)
    error_message = "The serverless_max_data_storage_gb must be at least 1."
  }
}

variable "serverless_max_ecpu_per_second" {
  description = "Upper limit of ElastiCache Processing Units per second of the serverless cache. Null leaves it unlimited."
  type        = number
  default     = null

  validation {
    condition     = var.serverless_max_ecpu_per_second == null || try(var.serverless_max_ecpu_per_second >= 1000, false)
    error_message = "The serverless_max_ecpu_per_second must be at least 1000."
  }
}

################################################################################
# Cache authentication
################################################################################

variable "auth_mode" {
  description = "How the functions authenticate to the cache: \"iam\" (RBAC user group with an IAM-authenticated user; the functions get REDIS_IAM_USER and REDIS_CACHE_NAME) or \"auth_token\" (AUTH token kept in Secrets Manager; the functions get REDIS_AUTH_SECRET_ARN). Serverless caches need \"iam\"."
  type        = string
  default     = "iam"

  validation {
    condition     = contains(["iam", "auth_token"], var.auth_mode)
    error_message = "The auth_mode must be \"iam\" or \"auth_token\"."
  }

  validation {
    condition     = var.auth_mode == "iam" || !var.serverless
    error_message = "Serverless caches authenticate through a user group: use auth_mode = \"iam\" with serverless = true."
  }
}

variable "auth_token" {
  description = "AUTH token for auth_mode = \"auth_token\": 16 to 128 printable ASCII characters without spaces, @, \" or /. It is written to Secrets Manager as a write-only value; the replication group's auth_token argument is not write-only in provider 5.x, so the token is also in state (marked sensitive)."
  type        = string
  default     = null
  sensitive   = true

  validation {
    condition     = var.auth_mode != "auth_token" || var.auth_token != null
    error_message = "The auth_token is required when auth_mode = \"auth_token\"."
  }

  validation {
    condition     = var.auth_token == null || can(regex("^[!#-.0-?A-~]{16,128}$", var.auth_token))
    error_message = "The auth_token must be 16 to 128 printable ASCII characters without spaces, @, \" or /."
  }
}

variable "auth_token_version" {
  description = "Version of the AUTH token written to Secrets Manager; increase it whenever auth_token changes so the write-only secret value is written again."
  type        = number
  default     = 1

  validation {
    condition     = var.auth_token_version >= 1 && floor(var.auth_token_version) == var.auth_token_version
    error_message = "The auth_token_version must be a whole number of at least 1."
  }
}

variable "secret_recovery_window_in_days" {
  description = "Days Secrets Manager keeps the deleted AUTH token secret before removing it: 0 (at once) or 7 to 30."
  type        = number
  default     = 7

  validation {
    condition     = var.secret_recovery_window_in_days == 0 || (var.secret_recovery_window_in_days >= 7 && var.secret_recovery_window_in_days <= 30)
    error_message = "The secret_recovery_window_in_days must be 0 or from 7 to 30."
  }
}

variable "iam_user_access_string" {
  description = "Redis ACL access string of the IAM-authenticated user the functions connect as."
  type        = string
  default     = "on ~* +@all -@dangerous"

  validation {
    condition     = startswith(var.iam_user_access_string, "on ")
    error_message = "The iam_user_access_string must start with \"on \" or the functions cannot log in."
  }
}

################################################################################
# Lambda functions
################################################################################

variable "authorizer_package" {
  description = "Path of the authorizer's deployment zip (a linux/arm64 bootstrap binary plus policy.yaml, from `make package`), relative to the working directory, e.g. \"../../dist/authorizer.zip\"."
  type        = string

  validation {
    condition     = endswith(var.authorizer_package, ".zip")
    error_message = "The authorizer_package must be the path of a .zip file."
  }
}

variable "limiter_package" {
  description = "Path of the decision service's deployment zip (a linux/arm64 bootstrap binary plus policy.yaml, from `make package`), relative to the working directory, e.g. \"../../dist/limiter.zip\"."
  type        = string

  validation {
    condition     = endswith(var.limiter_package, ".zip")
    error_message = "The limiter_package must be the path of a .zip file."
  }
}

variable "authorizer_memory_size" {
  description = "Memory of the authorizer function in MB (CPU scales with it)."
  type        = number
  default     = 256

  validation {
    condition     = var.authorizer_memory_size >= 128 && var.authorizer_memory_size <= 10240
    error_message = "The authorizer_memory_size must be from 128 to 10240 MB."
  }
}

variable "authorizer_timeout" {
  description = "Timeout of the authorizer function in seconds, at most 10 (an HTTP API waits no longer for its authorizer). Keep it short so the failure policy, not the timeout, decides."
  type        = number
  default     = 3

  validation {
    condition     = var.authorizer_timeout >= 1 && var.authorizer_timeout <= 10
    error_message = "The authorizer_timeout must be from 1 to 10 seconds."
  }
}

variable "authorizer_reserved_concurrency" {
  description = "Reserved concurrent executions of the authorizer. Null leaves the function on the account's unreserved pool."
  type        = number
  default     = null

  validation {
    condition     = var.authorizer_reserved_concurrency == null || try(var.authorizer_reserved_concurrency >= 0, false)
    error_message = "The authorizer_reserved_concurrency must be null or at least 0."
  }
}

variable "limiter_memory_size" {
  description = "Memory of the decision service function in MB."
  type        = number
  default     = 256

  validation {
    condition     = var.limiter_memory_size >= 128 && var.limiter_memory_size <= 10240
    error_message = "The limiter_memory_size must be from 128 to 10240 MB."
  }
}

variable "limiter_timeout" {
  description = "Timeout of the decision service function in seconds."
  type        = number
  default     = 5

  validation {
    condition     = var.limiter_timeout >= 1 && var.limiter_timeout <= 900
    error_message = "The limiter_timeout must be from 1 to 900 seconds."
  }
}

variable "limiter_reserved_concurrency" {
  description = "Reserved concurrent executions of the decision service. Null leaves the function on the account's unreserved pool."
  type        = number
  default     = null

  validation {
    condition     = var.limiter_reserved_concurrency == null || try(var.limiter_reserved_concurrency >= 0, false)
    error_message = "The limiter_reserved_concurrency must be null or at least 0."
  }
}

variable "policy_file" {
  description = "Value of TOLLGATE_POLICY for both functions: the path of the policy file (YAML or JSON) inside the function, e.g. /var/task/strict.yaml for another file packaged in the zip. Null leaves it unset so the functions use the policy.yaml next to bootstrap."
  type        = string
  default     = null

  validation {
    condition     = var.policy_file == null || try(length(trimspace(var.policy_file)) > 0, false)
    error_message = "The policy_file must be null or a non-empty path."
  }
}

variable "policy_json" {
  description = "Value of TOLLGATE_POLICY_JSON for both functions: an inline policy document in JSON, used instead of a file (e.g. jsonencode({...})). Lambda allows 4 KB of environment in all. Excludes policy_file."
  type        = string
  default     = null

  validation {
    condition     = var.policy_json == null || can(jsondecode(var.policy_json))
    error_message = "The policy_json must be a JSON document."
  }

  validation {
    condition     = var.policy_json == null || var.policy_file == null
    error_message = "Set policy_file or policy_json, not both: the functions refuse TOLLGATE_POLICY together with TOLLGATE_POLICY_JSON."
  }
}

variable "policy_parameter" {
  description = "A policy document (YAML or JSON, e.g. file(\"policy.yaml\")) to keep in an SSM Parameter Store parameter the module creates, /<name>/policy. Both functions read it (TOLLGATE_POLICY_SSM) and read it again at most every policy_refresh_seconds, so changing the parameter changes the limits without a deploy; an invalid value is refused and logged, and the running policy stays. Up to 4 KB it is a Standard parameter, up to 8 KB an Advanced one. Excludes policy_file and policy_json."
  type        = string
  default     = null

  validation {
    condition     = var.policy_parameter == null || try(length(trimspace(var.policy_parameter)) > 0 && length(var.policy_parameter) <= 8192, false)
    error_message = "The policy_parameter must be null or a non-empty document of at most 8192 bytes (an Advanced SSM parameter's limit); package a larger policy with the functions and use policy_file."
  }

  validation {
    condition     = var.policy_parameter == null || (var.policy_file == null && var.policy_json == null)
    error_message = "Set one of policy_file, policy_json and policy_parameter: the functions refuse more than one policy source."
  }
}

variable "policy_refresh_seconds" {
  description = "How often, at most, each function reads the policy parameter again (TOLLGATE_POLICY_POLL), before an invocation. Each read is one ssm:GetParameter call per warm execution environment; SSM's default throughput is 40 calls per second per account and Region."
  type        = number
  default     = 30

  validation {
    condition     = try(var.policy_refresh_seconds >= 1 && var.policy_refresh_seconds <= 86400 && floor(var.policy_refresh_seconds) == var.policy_refresh_seconds, false)
    error_message = "The policy_refresh_seconds must be a whole number from 1 to 86400."
  }
}

variable "environment_variables" {
  description = "Extra environment variables for both functions. Names Lambda reserves (_HANDLER, _X_AMZN_TRACE_ID, AWS_REGION, AWS_DEFAULT_REGION, AWS_EXECUTION_ENV, the credential variables, AWS_LAMBDA_*, LAMBDA_*) and those the module sets (REDIS_URL, REDIS_CLUSTER, REDIS_AUTH_SECRET_ARN, REDIS_IAM_USER, REDIS_CACHE_NAME, REDIS_IAM_SERVERLESS, TOLLGATE_POLICY, TOLLGATE_POLICY_JSON, TOLLGATE_POLICY_SSM, TOLLGATE_POLICY_POLL) are rejected. Useful ones: REDIS_POOL_SIZE, REDIS_CONN_MAX_LIFETIME, TOLLGATE_METRICS."
  type        = map(string)
  default     = {}

  # Lambda refuses to create a function that sets a reserved name, and sets the
  # AWS_LAMBDA_* and LAMBDA_* variables itself (AWS_LAMBDA_LOG_LEVEL and
  # AWS_LAMBDA_LOG_FORMAT from logging_config). Other AWS_* names (SDK settings
  # such as AWS_MAX_ATTEMPTS) are allowed.
  validation {
    condition     = !anytrue([for key in keys(var.environment_variables) : contains(local.lambda_reserved_environment_names, key) || startswith(key, "AWS_LAMBDA_") || startswith(key, "LAMBDA_")])
    error_message = "The environment_variables must not set ${join(", ", sort([for key in keys(var.environment_variables) : key if contains(local.lambda_reserved_environment_names, key) || startswith(key, "AWS_LAMBDA_") || startswith(key, "LAMBDA_")]))}: Lambda reserves or sets these names itself (_HANDLER, _X_AMZN_TRACE_ID, AWS_REGION, AWS_DEFAULT_REGION, AWS_EXECUTION_ENV, AWS_ACCESS_KEY, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and every AWS_LAMBDA_* and LAMBDA_* name)."
  }

  validation {
    condition     = length(setintersection(keys(var.environment_variables), local.module_environment_names)) == 0
    error_message = "The environment_variables must not set ${join(", ", sort(setintersection(keys(var.environment_variables), local.module_environment_names)))}: the module sets these names itself and would override the entries (the REDIS_* wiring comes from the cache and auth_mode, TOLLGATE_POLICY from policy_file, TOLLGATE_POLICY_JSON from policy_json, TOLLGATE_POLICY_SSM and TOLLGATE_POLICY_POLL from policy_parameter)."
  }
}

variable "application_log_level" {
  description = "Lowest application log level Lambda passes on (the functions log JSON, so Lambda can filter)."
  type        = string
  default     = "INFO"

  validation {
    condition     = contains(["TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL"], var.application_log_level)
    error_message = "The application_log_level must be one of TRACE, DEBUG, INFO, WARN, ERROR, FATAL."
  }
}

variable "system_log_level" {
  description = "Lowest Lambda platform log level passed on."
  type        = string
  default     = "WARN"

  validation {
    condition     = contains(["DEBUG", "INFO", "WARN"], var.system_log_level)
    error_message = "The system_log_level must be one of DEBUG, INFO, WARN."
  }
}

variable "log_retention_in_days" {
  description = "Retention of the functions' CloudWatch log groups in days."
  type        = number
  default     = 30

  validation {
    condition     = contains([1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_in_days)
    error_message = "The log_retention_in_days must be a value CloudWatch Logs accepts (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653)."
  }
}

################################################################################
# API Gateway (REST)
################################################################################

variable "authorizer_identity_source" {
  description = "Identity source of the REST API's REQUEST authorizer, comma-separated. API Gateway answers 401 without calling the authorizer when one is missing."
  type        = string
  default     = "method.request.header.x-api-key"

  validation {
    condition = alltrue([
      for source in split(",", var.authorizer_identity_source) :
      can(regex("^(method\\.request\\.(header|querystring|multivalueheader|multivaluequerystring)|stageVariables|context)\\.[A-Za-z0-9_.-]+$", trimspace(source)))
    ])
    error_message = "Every authorizer_identity_source entry must look like method.request.header.NAME, method.request.querystring.NAME, stageVariables.NAME or context.NAME."
  }
}

variable "authorizer_result_ttl_in_seconds" {
  description = "Authorizer result cache TTL. Must stay 0: a cached Allow would let requests past the limiter without being counted."
  type        = number
  default     = 0

  validation {
    condition     = var.authorizer_result_ttl_in_seconds == 0
    error_message = "The authorizer_result_ttl_in_seconds must be 0: API Gateway would reuse cached decisions and skip the rate limiter."
  }
}

variable "backend_url" {
  description = "Base URL of the backend the example API forwards allowed requests to (HTTP_PROXY). Null answers with a MOCK integration instead (REST API only)."
  type        = string
  default     = null

  validation {
    condition     = var.backend_url == null || can(regex("^https?://[^/]+", var.backend_url))
    error_message = "The backend_url must start with http:// or https:// and name a host."
  }
}

variable "rest_api_endpoint_type" {
  description = "Endpoint type of the REST API: REGIONAL or EDGE."
  type        = string
  default     = "REGIONAL"

  validation {
    condition     = contains(["REGIONAL", "EDGE"], var.rest_api_endpoint_type)
    error_message = "The rest_api_endpoint_type must be REGIONAL or EDGE."
  }
}

variable "stage_name" {
  description = "Name of the REST API stage."
  type        = string
  default     = "v1"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,128}$", var.stage_name))
    error_message = "The stage_name may hold only letters, digits, hyphens and underscores."
  }
}

################################################################################
# API Gateway (HTTP API)
################################################################################

variable "enable_http_api" {
  description = "Also create an HTTP API (v2) with a payload 2.0 simple-response authorizer in front of backend_url. HTTP APIs deny with 403 and have no gateway responses."
  type        = bool
  default     = false

  validation {
    condition     = !var.enable_http_api || var.backend_url != null
    error_message = "The HTTP API has no MOCK integration: set backend_url when enable_http_api = true."
  }
}

variable "http_api_identity_sources" {
  description = "Identity sources of the HTTP API authorizer. API Gateway answers 401 without calling the authorizer when one is missing."
  type        = list(string)
  default     = ["$request.header.x-api-key"]

  validation {
    condition     = length(var.http_api_identity_sources) > 0 && alltrue([for source in var.http_api_identity_sources : can(regex("^\\$(request\\.(header|querystring)|context|stageVariables)\\.[A-Za-z0-9_.-]+$", source))])
    error_message = "Every http_api_identity_sources entry must look like $request.header.NAME, $request.querystring.NAME, $context.NAME or $stageVariables.NAME."
  }
}

################################################################################
# Decision service exposure (Envoy)
################################################################################

variable "create_limiter_function_url" {
  description = "Expose the decision service through a Lambda Function URL, the endpoint the Envoy filter calls."
  type        = bool
  default     = true
}

variable "limiter_function_url_authorization_type" {
  description = "Auth type of the decision service's Function URL: AWS_IAM (callers sign with SigV4) or NONE (public: anyone on the internet may call it; needs allow_public_function_url = true)."
  type        = string
  default     = "AWS_IAM"

  validation {
    condition     = contains(["AWS_IAM", "NONE"], var.limiter_function_url_authorization_type)
    error_message = "The limiter_function_url_authorization_type must be AWS_IAM or NONE."
  }

  validation {
    condition     = var.limiter_function_url_authorization_type != "NONE" || var.allow_public_function_url
    error_message = "A Function URL with authorization_type NONE lets anyone on the internet call the decision service (and spend its rate limits): set allow_public_function_url = true to opt in, or keep AWS_IAM."
  }
}

variable "allow_public_function_url" {
  description = "Opt in to a public Function URL: must be true for limiter_function_url_authorization_type = \"NONE\", which lets anyone on the internet invoke the decision service."
  type        = bool
  default     = false
}

variable "limiter_function_url_invoke_mode" {
  description = "Invoke mode of the decision service's Function URL: RESPONSE_STREAM (what lambdaurl.Start serves) or BUFFERED."
  type        = string
  default     = "RESPONSE_STREAM"

  validation {
    condition     = contains(["RESPONSE_STREAM", "BUFFERED"], var.limiter_function_url_invoke_mode)
    error_message = "The limiter_function_url_invoke_mode must be RESPONSE_STREAM or BUFFERED."
  }
}

variable "limiter_function_url_allowed_principals" {
  description = "Principals (account IDs or IAM ARNs) granted lambda:InvokeFunctionUrl on an AWS_IAM Function URL through the function's resource policy. Principals of this account may instead be granted it by their own identity policy."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for p in var.limiter_function_url_allowed_principals : can(regex("^([0-9]{12}|arn:aws[a-z-]*:iam::[0-9]{12}:.+)$", p))])
    error_message = "Every limiter_function_url_allowed_principals entry must be a 12-digit account ID or an IAM ARN."
  }
}

################################################################################
# Observability
################################################################################

variable "metrics_namespace" {
  description = "CloudWatch namespace of the functions' embedded-metric-format (EMF) metrics, such as FailureModeActivations, that the alarms and the dashboard read. It must be Tollgate, the namespace the authorizer hard-codes (it reads no variable for it)."
  type        = string
  default     = "Tollgate"

  validation {
    condition     = var.metrics_namespace == "Tollgate"
    error_message = "The metrics_namespace must be \"Tollgate\": the authorizer always writes its metrics there, so alarms and dashboard widgets on any other namespace would never see data."
  }
}

variable "create_alarms" {
  description = "Create the CloudWatch alarms (function errors, throttles and failure-mode activations; cache CPU, memory and evictions)."
  type        = bool
  default     = true
}

variable "alarm_actions" {
  description = "ARNs (usually SNS topics) notified when an alarm fires and when it recovers."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for arn in var.alarm_actions : startswith(arn, "arn:")])
    error_message = "Every alarm_actions entry must be an ARN."
  }
}

variable "alarm_period" {
  description = "Period of the alarms' metric statistics in seconds."
  type        = number
  default     = 60

  validation {
    condition     = contains([10, 30], var.alarm_period) || (var.alarm_period >= 60 && var.alarm_period % 60 == 0)
    error_message = "The alarm_period must be 10, 30 or a multiple of 60 seconds."
  }
}

variable "alarm_evaluation_periods" {
  description = "Number of periods an alarm compares against its threshold."
  type        = number
  default     = 3

  validation {
    condition     = var.alarm_evaluation_periods >= 1 && floor(var.alarm_evaluation_periods) == var.alarm_evaluation_periods
    error_message = "The alarm_evaluation_periods must be a whole number of at least 1."
  }
}

variable "cache_cpu_threshold_percent" {
  description = "EngineCPUUtilization (percent, per node) above which the cache CPU alarm fires."
  type        = number
  default     = 80

  validation {
    condition     = var.cache_cpu_threshold_percent > 0 && var.cache_cpu_threshold_percent <= 100
    error_message = "The cache_cpu_threshold_percent must be above 0 and at most 100."
  }
}

variable "cache_memory_threshold_percent" {
  description = "DatabaseMemoryUsagePercentage (per node) above which the cache memory alarm fires."
  type        = number
  default     = 80

  validation {
    condition     = var.cache_memory_threshold_percent > 0 && var.cache_memory_threshold_percent <= 100
    error_message = "The cache_memory_threshold_percent must be above 0 and at most 100."
  }
}

variable "create_dashboard" {
  description = "Create a CloudWatch dashboard of the functions, the API and the cache."
  type        = bool
  default     = true
}
