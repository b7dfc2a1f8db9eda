// Command wasmfilter is tollgate's Envoy filter, a proxy-wasm plugin built with TinyGo
// (see README.md and scripts/build-wasm.sh).
//
// For each request it reads the configured attributes (request headers, the client
// address, the path, the method), asks the decision service over an HTTP callout
// (POST /v1/check), and then lets the request through with the RateLimit headers added
// to its response, holds it for the leaky bucket's delay (traffic shaping), or answers
// 429 itself. Denied clients are remembered in Envoy's shared data until their retry
// time, so they cost no callout meanwhile. When the callout fails the configured
// failure mode decides: open, closed, or local limits run inside the VM with the Go
// models of shared/algo.
//
// The plugin must stay within what TinyGo compiles for wasi: no net/http, no
// encoding/json, no goroutines, and no panics it would need to recover from (TinyGo on
// wasi has no recover).
package main

import (
	"time"

	"github.com/tetratelabs/proxy-wasm-go-sdk/proxywasm"
)

func main() {
	proxywasm.SetVMContext(&vmContext{now: time.Now})
}
