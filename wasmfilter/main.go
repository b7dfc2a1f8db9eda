// Command wasmfilter is tollgate's Envoy filter, a proxy-wasm plugin built with the
// upstream Go toolchain (GOOS=wasip1 GOARCH=wasm -buildmode=c-shared; see README.md and
// scripts/build-wasm.sh) on github.com/proxy-wasm/proxy-wasm-go-sdk.
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
// The plugin must stay small and wasip1-safe: no net/http, no encoding/json, no
// goroutines (the host calls in one thread and an export that blocks would hang the
// VM), and no panic on any input — a panic traps the VM, and Envoy then fails every
// request of that worker until the plugin is reloaded.
package main

import (
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
)

// init registers the VM: a module built with -buildmode=c-shared runs its package
// initializers from _initialize, and never runs main.
func init() {
	proxywasm.SetVMContext(&vmContext{now: time.Now})
}

// main is required of a main package; the host never calls it.
func main() {}
