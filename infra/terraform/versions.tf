terraform {
  # 1.11 is the first release with write-only arguments (secret_string_wo).
  required_version = ">= 1.11"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}
