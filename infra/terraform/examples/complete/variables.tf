variable "region" {
  description = "AWS Region to deploy into."
  type        = string
  default     = "eu-west-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-[a-z]+)+-[0-9]$", var.region))
    error_message = "The region must be an AWS Region name such as eu-west-1."
  }
}

variable "name" {
  description = "Name prefix of the stack."
  type        = string
  default     = "tollgate-example"
}

variable "authorizer_package" {
  description = "Path of the authorizer zip built by `make package`, relative to this directory."
  type        = string
  default     = "../../../../dist/authorizer.zip"
}

variable "limiter_package" {
  description = "Path of the decision service zip built by `make package`, relative to this directory."
  type        = string
  default     = "../../../../dist/limiter.zip"
}

variable "backend_url" {
  description = "Backend behind the APIs. Null answers allowed requests from a MOCK integration and leaves the HTTP API out."
  type        = string
  default     = null
}

variable "offline" {
  description = "Skip the provider's credential, account-ID and metadata-API checks so `terraform plan -refresh=false` runs with fake credentials and no network (scripts/tf-check.sh). Leave false for real deployments."
  type        = bool
  default     = false
}
