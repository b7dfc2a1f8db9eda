#!/usr/bin/env bash
# Builds the Envoy filter (wasmfilter/) as dist/tollgate.wasm with the Go toolchain alone:
# `make wasm`.
#
# The filter uses github.com/proxy-wasm/proxy-wasm-go-sdk, which targets the upstream Go
# compiler (Go 1.24+: GOOS=wasip1, //go:wasmexport). -buildmode=c-shared makes a WASI
# reactor: it exports _initialize and the proxy_on_* callbacks instead of running main.
# The module needs Envoy 1.33 or later (see wasmfilter/README.md). Set GO to use another
# go binary.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

go=${GO:-go}
out=dist/tollgate.wasm

if ! command -v "$go" >/dev/null 2>&1; then
	echo "make wasm: the go command is not installed (no '$go' on PATH); install Go 1.26 (https://go.dev/dl/)" >&2
	exit 1
fi

mkdir -p "$(dirname "$out")"
GOOS=wasip1 GOARCH=wasm CGO_ENABLED=0 "$go" build -buildmode=c-shared -trimpath -o "$out" ./wasmfilter
echo "built $out ($(wc -c <"$out") bytes) with $("$go" env GOVERSION) (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared)"
