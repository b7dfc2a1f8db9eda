#!/usr/bin/env bash
# Builds the Envoy filter (wasmfilter/) as dist/tollgate.wasm with TinyGo: `make wasm`.
#
# The filter uses github.com/tetratelabs/proxy-wasm-go-sdk, which only TinyGo compiles
# into a module Envoy can load. This module is Go 1.26, which TinyGo supports from
# release 0.41.0 (0.40.x stops at Go 1.25). Set TINYGO to use another tinygo binary.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

tinygo=${TINYGO:-tinygo}
min_version=0.41.0
out=dist/tollgate.wasm

if ! command -v "$tinygo" >/dev/null 2>&1; then
	cat >&2 <<EOF
make wasm: TinyGo is not installed (no '$tinygo' on PATH).

The filter compiles to an Envoy plugin only with TinyGo. Install TinyGo $min_version or
later (the first release that supports Go 1.26), with Go 1.26 on PATH:

  macOS:          brew tap tinygo-org/tools && brew install tinygo
  Debian/Ubuntu:  the tinygo_${min_version}_amd64.deb of the release, then
                  sudo dpkg -i tinygo_${min_version}_amd64.deb
  others:         https://tinygo.org/getting-started/install/

then run 'make wasm' again. Without TinyGo, 'go test ./wasmfilter/' still tests the
filter on the proxy-wasm host emulator, and 'GOOS=wasip1 GOARCH=wasm go build
./wasmfilter/' checks that it compiles for wasm.
EOF
	exit 1
fi

# "tinygo version 0.41.0 linux/amd64 (using go version go1.26.0 and LLVM version 20.1.1)"
version=$("$tinygo" version | awk '{print $3}')
if [[ "$(printf '%s\n%s\n' "$min_version" "$version" | sort -V | head -n1)" != "$min_version" ]]; then
	echo "make wasm: TinyGo $version is too old for Go 1.26; install TinyGo $min_version or later (https://tinygo.org/getting-started/install/)" >&2
	exit 1
fi

mkdir -p "$(dirname "$out")"
"$tinygo" build -o "$out" -scheduler=none -target=wasi ./wasmfilter
echo "built $out ($(wc -c <"$out") bytes) with TinyGo $version"
