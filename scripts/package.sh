#!/usr/bin/env bash
# package.sh — build each Lambda function as a `bootstrap` binary for the provided.al2023
# runtime and zip it with the policy, one zip per function under dist/:
#
#   dist/authorizer.zip   bootstrap (./lambda/authorizer) + policy.yaml
#   dist/limiter.zip      bootstrap (./lambda/limiter)    + policy.yaml
#
# Built for linux/arm64 (Graviton; GOARCH=amd64 for x86_64 functions) with
# CGO_ENABLED=0, -tags lambda.norpc (no net/rpc: the binary speaks only the Runtime
# API), -trimpath and -ldflags='-s -w'. The policy is $POLICY (default
# lambda/policy.yaml), stored as policy.yaml beside bootstrap, where the functions
# look for it by default. Zips are made with zip when installed, else python3's
# zipfile; file times are fixed so that the same inputs give the same zip.
#
# Usage: scripts/package.sh [FUNCTION...]   (default: authorizer limiter)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

GO=${GO:-go}
GOARCH=${GOARCH:-arm64}
POLICY=${POLICY:-lambda/policy.yaml}
DIST=${DIST:-dist}
functions=("$@")
if [[ ${#functions[@]} -eq 0 ]]; then functions=(authorizer limiter); fi

if [[ ! -f "$POLICY" ]]; then
	echo "package: policy $POLICY not found (set POLICY=path/to/policy.yaml)" >&2
	exit 1
fi

# zipdir ZIP DIR: zip the files of DIR (flat), keeping bootstrap executable.
zipdir() {
	local zip=$1 dir=$2
	rm -f "$zip"
	if command -v zip >/dev/null 2>&1; then
		(cd "$dir" && zip -q -X -9 "$OLDPWD/$zip" bootstrap policy.yaml)
	elif command -v python3 >/dev/null 2>&1; then
		python3 - "$zip" "$dir" <<'PY'
import os, sys, zipfile
out, src = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as z:
    for name in ("bootstrap", "policy.yaml"):
        info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
        info.external_attr = (0o755 if name == "bootstrap" else 0o644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        with open(os.path.join(src, name), "rb") as f:
            z.writestr(info, f.read())
PY
	else
		echo "package: neither zip nor python3 is installed (apt-get install zip)" >&2
		return 1
	fi
}

size() { stat -c %s "$1"; }
human() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }

mkdir -p "$DIST"
failed=()
for fn in "${functions[@]}"; do
	stage="$DIST/.stage/$fn"
	rm -rf "$stage"
	mkdir -p "$stage"
	if ! CGO_ENABLED=0 GOOS=linux GOARCH="$GOARCH" "$GO" build -tags lambda.norpc -trimpath \
		-ldflags='-s -w' -o "$stage/bootstrap" "./lambda/$fn"; then
		echo "package: ./lambda/$fn does not build; not packaged" >&2
		failed+=("$fn")
		continue
	fi
	cp "$POLICY" "$stage/policy.yaml"
	chmod 0755 "$stage/bootstrap"
	chmod 0644 "$stage/policy.yaml"
	touch -t 202001010000 "$stage/bootstrap" "$stage/policy.yaml"
	zipdir "$DIST/$fn.zip" "$stage"
	echo "$DIST/$fn.zip: $(human "$(size "$DIST/$fn.zip")") (bootstrap linux/$GOARCH $(human "$(size "$stage/bootstrap")"))"
done
rm -rf "$DIST/.stage"

if [[ ${#failed[@]} -gt 0 ]]; then
	echo "package: not packaged: ${failed[*]}" >&2
	exit 1
fi
