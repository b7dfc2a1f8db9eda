#!/usr/bin/env bash
# tf-check.sh checks the Terraform stack under infra/terraform without touching
# AWS: fmt, init and validate of the module and of examples/complete, the
# module's `terraform test` (mock provider), and an offline
# `terraform plan -refresh=false` of examples/complete with fake credentials.
#
# Providers come from a filesystem mirror when TF_PLUGIN_MIRROR names one or
# one is found on the machine, else from the registry. Everything Terraform
# writes (data dirs, plans, placeholder zips) goes to a temporary directory;
# the only files left in the tree are the gitignored .terraform.lock.hcl.
#
# It is quiet unless a step fails: each step's output (without colour codes) goes
# to a log that is printed when a step fails, and a success is one line with the
# test and plan counts. TF_CHECK_VERBOSE=1 prints everything as it runs.
set -euo pipefail

repo_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo_root"

module=infra/terraform
example=$module/examples/complete

if ! command -v terraform >/dev/null 2>&1; then
	echo "tf-check: skipping: terraform not installed"
	exit 0
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/tf-check.XXXXXX")
trap 'rm -rf "$work"' EXIT

log=$work/log
: >"$log"

# run writes a command, exactly as it runs it, and its output to the log (and to
# stdout with TF_CHECK_VERBOSE=1); when it fails, it prints the whole log and exits.
run() {
	{
		printf '+'
		printf ' %q' "$@"
		printf '\n'
	} >>"$log"
	local status=0
	if [[ ${TF_CHECK_VERBOSE:-} == 1 ]]; then
		"$@" 2>&1 | tee -a "$log" || status=$?
	else
		"$@" >>"$log" 2>&1 || status=$?
	fi
	if ((status != 0)); then
		if [[ ${TF_CHECK_VERBOSE:-} != 1 ]]; then
			cat "$log"
		fi
		echo "tf-check: FAILED (exit status $status): $*" >&2
		exit 1
	fi
}

# Provider installation: a filesystem mirror if there is one.
mirror=${TF_PLUGIN_MIRROR:-}
if [[ -z $mirror ]]; then
	provider=$(find / -xdev -path '*registry.terraform.io/hashicorp/aws*' -name 'terraform-provider-aws*' -print -quit 2>/dev/null || true)
	if [[ -n $provider ]]; then
		mirror=${provider%%/registry.terraform.io/*}
	fi
fi
if [[ -n $mirror ]]; then
	if [[ ! -d $mirror/registry.terraform.io ]]; then
		echo "tf-check: $mirror holds no registry.terraform.io directory; TF_PLUGIN_MIRROR must name the directory that contains it" >&2
		exit 1
	fi
	cat >"$work/terraformrc" <<EOF
provider_installation {
  filesystem_mirror {
    path = "$mirror"
  }
}
EOF
	export TF_CLI_CONFIG_FILE=$work/terraformrc
	echo "tf-check: providers from the filesystem mirror $mirror" >>"$log"
elif [[ -n ${TF_CLI_CONFIG_FILE:-} && ! -f $TF_CLI_CONFIG_FILE ]]; then
	# A CLI config variable naming a missing file only produces warnings.
	unset TF_CLI_CONFIG_FILE
	echo "tf-check: providers from the registry" >>"$log"
else
	echo "tf-check: providers from the registry" >>"$log"
fi

export TF_IN_AUTOMATION=1
export TF_INPUT=0

run terraform fmt -no-color -check -recursive -diff "$module"

# Module: init, validate, test (mock provider, plan-only runs).
run env TF_DATA_DIR="$work/module" terraform -chdir="$module" init -no-color -backend=false
run env TF_DATA_DIR="$work/module" terraform -chdir="$module" validate -no-color
run env TF_DATA_DIR="$work/module" terraform -chdir="$module" test -no-color

# Example: init, validate, and an offline plan with placeholder packages.
run env TF_DATA_DIR="$work/example" terraform -chdir="$example" init -no-color -backend=false
run env TF_DATA_DIR="$work/example" terraform -chdir="$example" validate -no-color

# The plan hashes the zips, so they must exist: tiny placeholders stand in for
# the output of `make package`.
for fn in authorizer limiter; do
	if command -v zip >/dev/null 2>&1; then
		mkdir -p "$work/package/$fn"
		printf '#!/bin/sh\necho "placeholder %s package: run make package" >&2\nexit 1\n' "$fn" >"$work/package/$fn/bootstrap"
		printf '# placeholder policy\n' >"$work/package/$fn/policy.yaml"
		(cd "$work/package/$fn" && zip -q -X "$work/$fn.zip" bootstrap policy.yaml)
	else
		# An empty zip archive: just the end-of-central-directory record.
		printf 'PK\005\006\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0' >"$work/$fn.zip"
	fi
done

# Fake credentials and no shared AWS config: the plan must need no AWS call.
run env -u AWS_PROFILE -u AWS_SESSION_TOKEN \
	TF_DATA_DIR="$work/example" \
	AWS_ACCESS_KEY_ID=AKIAFAKEFAKEFAKEFAKE \
	AWS_SECRET_ACCESS_KEY=fake-secret-access-key \
	AWS_CONFIG_FILE=/dev/null \
	AWS_SHARED_CREDENTIALS_FILE=/dev/null \
	AWS_EC2_METADATA_DISABLED=true \
	terraform -chdir="$example" plan -no-color -refresh=false -lock=false \
	-var offline=true \
	-var "authorizer_package=$work/authorizer.zip" \
	-var "limiter_package=$work/limiter.zip" \
	-out="$work/example.tfplan"

# One line for a success: what was checked, with terraform test's and the plan's counts.
tests=$(grep -Eo '^Success! [0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1 || true)
plan=$(grep -Eo '^Plan: [0-9]+ to add, [0-9]+ to change, [0-9]+ to destroy' "$log" | tail -n 1 || true)
echo "tf-check: ok: fmt, validate, test (${tests#Success! }), offline plan of examples/complete (${plan#Plan: }) (TF_CHECK_VERBOSE=1 shows it all)"
