#!/usr/bin/env bash
# invoke.sh — run a tollgate Lambda function locally on an event, against an embedded
# Redis (miniredis) and a minimal Lambda Runtime API, and print its answers.
#
#   scripts/invoke.sh [-n N] [-policy FILE] [-function authorizer|limiter] [-logs] EVENT.json
#   EVENT=events/rest-request-authorizer.json N=5 POLICY=lambda/authorizer/testdata/policy.yaml scripts/invoke.sh
#
# The make target: make invoke EVENT=events/<file>.json [N=5] [POLICY=...]
# All N invocations run in one process, so the limit visibly runs out.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

args=()
if [[ -n "${N:-}" ]]; then args+=(-n "$N"); fi
if [[ -n "${POLICY:-}" ]]; then args+=(-policy "$POLICY"); fi
if [[ -n "${FUNCTION:-}" ]]; then args+=(-function "$FUNCTION"); fi
if [[ $# -eq 0 ]]; then
	if [[ -z "${EVENT:-}" ]]; then
		echo "usage: scripts/invoke.sh [-n N] [-policy FILE] EVENT.json   (or EVENT=events/<file>.json)" >&2
		echo "events:" >&2
		ls events/*.json >&2
		exit 2
	fi
	set -- "$EVENT"
fi
# The tools are a module of their own (scripts/go.mod); invoke reads paths from the root.
exec "${GO:-go}" -C scripts run ./invoke "${args[@]}" "$@"
