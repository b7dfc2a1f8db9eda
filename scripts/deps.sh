#!/usr/bin/env bash
# deps.sh makes sure the programs the test suite runs are on PATH, installing the
# missing ones from Debian's packages when it can: redis-server and redis-cli
# (package redis-server), and redis-sentinel (package redis-sentinel). `make test`
# and .ci/run both call it; this is the one place that knows the list.
#
# It installs with apt-get (apt-get update, then apt-get install -y) as root, or
# through sudo when sudo is present (prompting only on a terminal). When it cannot
# install, it says what is missing and how to install it, then:
#   - with CI=true, exits 1: CI must run every real-Redis test;
#   - otherwise exits 0, and the tests that need a missing program skip with a
#     message saying so.
# TOLLGATE_NO_INSTALL=1 only checks, never installs.
set -euo pipefail

# program:package pairs the tests need.
needs=(redis-server:redis-server redis-cli:redis-server redis-sentinel:redis-sentinel)

# missing_packages prints the packages of the programs that are not on PATH, once each.
missing_packages() {
	local pair prog pkg seen=" "
	for pair in "${needs[@]}"; do
		prog=${pair%%:*} pkg=${pair#*:}
		if ! command -v "$prog" >/dev/null 2>&1 && [[ $seen != *" $pkg "* ]]; then
			seen+="$pkg "
			echo "$pkg"
		fi
	done
}

# as_root runs a command as root: directly, or through sudo (non-interactive
# unless stdin is a terminal). It fails when neither is possible.
as_root() {
	if [[ $(id -u) -eq 0 ]]; then
		"$@"
	elif ! command -v sudo >/dev/null 2>&1; then
		echo "deps: not root and no sudo" >&2
		return 1
	elif [[ -t 0 ]]; then
		sudo "$@"
	else
		sudo -n "$@"
	fi
}

install() {
	if [[ ${TOLLGATE_NO_INSTALL:-} == 1 ]]; then
		echo "deps: TOLLGATE_NO_INSTALL=1: not installing" >&2
		return 1
	fi
	if ! command -v apt-get >/dev/null 2>&1; then
		echo "deps: no apt-get on this machine" >&2
		return 1
	fi
	echo "deps: installing $*"
	as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
		as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}

mapfile -t pkgs < <(missing_packages)
if [[ ${#pkgs[@]} -eq 0 ]]; then
	exit 0
fi
install "${pkgs[@]}" || true
mapfile -t pkgs < <(missing_packages)
if [[ ${#pkgs[@]} -eq 0 ]]; then
	exit 0
fi

echo "deps: could not install ${pkgs[*]}; install it yourself: sudo apt-get install -y ${pkgs[*]}" >&2
if [[ ${CI:-} == true ]]; then
	echo "deps: CI=true: failing, since CI must run every real-Redis test" >&2
	exit 1
fi
echo "deps: the tests that need them will skip, each saying so" >&2
