package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
	"github.com/tetratelabs/wazero"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// filterHost is what the filter's tests drive. The SDK's host emulator, which runs
// the filter natively, satisfies it as it is; wasmFilter runs the compiled module in
// wasmhost behind the same methods.
type filterHost interface {
	StartPlugin() types.OnPluginStartStatus
	GetCriticalLogs() []string
	GetErrorLogs() []string
	GetWarnLogs() []string
	InitializeHttpContext() uint32
	CallOnRequestHeaders(contextID uint32, headers [][2]string, endOfStream bool) types.Action
	CallOnResponseHeaders(contextID uint32, headers [][2]string, endOfStream bool) types.Action
	CallOnResponseTrailers(contextID uint32, trailers [][2]string) types.Action
	CompleteHttpContext(contextID uint32)
	GetCalloutAttributesFromContext(contextID uint32) []proxytest.HttpCalloutAttribute
	CallOnHttpCallResponse(calloutID uint32, headers, trailers [][2]string, body []byte)
	GetCurrentHttpStreamAction(contextID uint32) types.Action
	GetSentLocalResponse(contextID uint32) *proxytest.LocalHttpResponse
	GetCurrentResponseHeaders(contextID uint32) [][2]string
	GetCounterMetric(name string) (uint64, error)
	GetTickPeriod() uint32
	Tick()
}

// A backend runs the filter: natively on the SDK's emulator, or compiled.
type backend string

const (
	native backend = "native" // the filter's Go code on proxytest
	wasm   backend = "wasm"   // dist-style tollgate.wasm on wasmhost, with the test's clock
)

// backends are what every filter test runs on.
var backends = []backend{native, wasm}

// forBackends runs test once per backend, as subtests named after it.
func forBackends(t *testing.T, test func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range backends {
		t.Run(string(b), func(t *testing.T) { test(t, b) })
	}
}

// sourceAddress is the client address every test request comes from.
const sourceAddress = "192.0.2.7:41234"

// newFilter makes a host for the plugin configuration on backend b, without
// starting the plugin. clock is the filter's clock.
func newFilter(t *testing.T, b backend, config string, clock func() time.Time) filterHost {
	t.Helper()
	return newFilterFrom(t, b, config, clock, sourceAddress)
}

// newFilterFrom is newFilter for requests from the client address addr (the
// source.address property).
func newFilterFrom(t *testing.T, b backend, config string, clock func() time.Time, addr string) filterHost {
	t.Helper()
	switch b {
	case native:
		opt := proxytest.NewEmulatorOption().
			WithVMContext(&vmContext{now: clock}).
			WithPluginConfiguration([]byte(config)).
			WithProperty([]string{"source", "address"}, []byte(addr))
		host, reset := proxytest.NewHostEmulator(opt)
		t.Cleanup(reset)
		return host
	case wasm:
		return newWasmFilter(t, wasmhost.Options{
			PluginConfig: []byte(config),
			Properties:   map[string][]byte{"source.address": []byte(addr)},
			Clock:        clock,
		})
	}
	t.Fatalf("unknown backend %q", b)
	return nil
}

// newWasmFilter makes a VM of the compiled filter, closed when the test ends, without
// starting the plugin.
func newWasmFilter(t *testing.T, opts wasmhost.Options) *wasmFilter {
	t.Helper()
	vm, err := filterRuntime(t).NewVM(context.Background(), opts)
	if err != nil {
		t.Fatalf("NewVM: %v", err)
	}
	t.Cleanup(func() { vm.Close(context.Background()) })
	return &wasmFilter{t: t, vm: vm}
}

// The compiled filter: built once per test binary into a temporary directory, and
// compiled by wazero once.
var compiled struct {
	once    sync.Once
	dir     string
	path    string
	runtime *wasmhost.Runtime
	err     error
}

// TestMain removes the compiled filter after the tests.
func TestMain(m *testing.M) {
	code := m.Run()
	if compiled.dir != "" {
		os.RemoveAll(compiled.dir)
	}
	os.Exit(code)
}

// filterWasm builds the filter with GOOS=wasip1 GOARCH=wasm -buildmode=c-shared, as
// `make wasm` does, once per test binary, and returns the module's path. A failed
// build fails the test: no filter test may pass only natively. With TOLLGATE_WASM set
// (e.g. TOLLGATE_WASM=$PWD/dist/tollgate.wasm after make wasm; a relative path is
// relative to wasmfilter/), the tests run that module instead of building one.
func filterWasm(t testing.TB) string {
	t.Helper()
	compiled.once.Do(func() {
		if compiled.path = os.Getenv("TOLLGATE_WASM"); compiled.path == "" {
			if compiled.dir, compiled.err = os.MkdirTemp("", "tollgate-wasm-"); compiled.err != nil {
				return
			}
			compiled.path = filepath.Join(compiled.dir, "tollgate.wasm")
			if compiled.err = wasmhost.Build(context.Background(), ".", compiled.path); compiled.err != nil {
				return
			}
		}
		wasm, err := os.ReadFile(compiled.path)
		if err != nil {
			compiled.err = err
			return
		}
		// poll_oneoff fails as in Envoy (proxy-wasm-cpp-host before its PR #533), so
		// that a Go runtime that polls (golang/go#78513) fails here too.
		compiled.runtime, compiled.err = wasmhost.NewRuntime(context.Background(), wasm,
			wasmhost.RuntimeOptions{Cache: wazero.NewCompilationCache(), PollOneoffENOSYS: true})
	})
	if compiled.err != nil {
		t.Fatalf("build the filter as a proxy-wasm module: %v", compiled.err)
	}
	return compiled.path
}

// filterRuntime returns the compiled filter, ready for VMs.
func filterRuntime(t testing.TB) *wasmhost.Runtime {
	t.Helper()
	filterWasm(t)
	return compiled.runtime
}

// wasmFilter drives the compiled filter in a wasmhost VM. A trap fails the test.
type wasmFilter struct {
	t  *testing.T
	vm *wasmhost.VM
}

func (w *wasmFilter) must(err error) {
	w.t.Helper()
	if err != nil {
		w.t.Fatalf("the compiled filter failed: %v", err)
	}
}

func (w *wasmFilter) StartPlugin() types.OnPluginStartStatus {
	w.t.Helper()
	ok, err := w.vm.StartPlugin()
	w.must(err)
	if ok {
		return types.OnPluginStartStatusOK
	}
	return types.OnPluginStartStatusFailed
}

func (w *wasmFilter) GetCriticalLogs() []string { return w.vm.Logs(wasmhost.LogCritical) }
func (w *wasmFilter) GetErrorLogs() []string    { return w.vm.Logs(wasmhost.LogError) }
func (w *wasmFilter) GetWarnLogs() []string     { return w.vm.Logs(wasmhost.LogWarn) }

func (w *wasmFilter) InitializeHttpContext() uint32 {
	w.t.Helper()
	id, err := w.vm.NewHttpContext(nil)
	w.must(err)
	return id
}

func (w *wasmFilter) CallOnRequestHeaders(id uint32, headers [][2]string, endOfStream bool) types.Action {
	w.t.Helper()
	a, err := w.vm.RequestHeaders(id, headers, endOfStream)
	w.must(err)
	return types.Action(a)
}

func (w *wasmFilter) CallOnResponseHeaders(id uint32, headers [][2]string, endOfStream bool) types.Action {
	w.t.Helper()
	a, err := w.vm.ResponseHeaders(id, headers, endOfStream)
	w.must(err)
	return types.Action(a)
}

func (w *wasmFilter) CallOnResponseTrailers(id uint32, trailers [][2]string) types.Action {
	w.t.Helper()
	a, err := w.vm.ResponseTrailers(id, trailers)
	w.must(err)
	return types.Action(a)
}

func (w *wasmFilter) CompleteHttpContext(id uint32) {
	w.t.Helper()
	w.must(w.vm.CompleteHttpContext(id))
}

// GetCalloutAttributesFromContext returns a stream's callouts, or, for
// proxytest.PluginContextID, the plugin's (as proxytest files them).
func (w *wasmFilter) GetCalloutAttributesFromContext(id uint32) []proxytest.HttpCalloutAttribute {
	if id == proxytest.PluginContextID {
		id = w.vm.RootID()
	}
	var out []proxytest.HttpCalloutAttribute
	for _, c := range w.vm.Callouts(id) {
		out = append(out, proxytest.HttpCalloutAttribute{CalloutID: c.ID, Upstream: c.Upstream, Headers: c.Headers, Trailers: c.Trailers, Body: c.Body})
	}
	return out
}

func (w *wasmFilter) CallOnHttpCallResponse(calloutID uint32, headers, trailers [][2]string, body []byte) {
	w.t.Helper()
	w.must(w.vm.RespondCallout(calloutID, headers, trailers, body))
}

func (w *wasmFilter) GetCurrentHttpStreamAction(id uint32) types.Action {
	return types.Action(w.vm.StreamAction(id))
}

func (w *wasmFilter) GetSentLocalResponse(id uint32) *proxytest.LocalHttpResponse {
	lr := w.vm.LocalResponseOf(id)
	if lr == nil {
		return nil
	}
	return &proxytest.LocalHttpResponse{StatusCode: lr.StatusCode, StatusCodeDetail: lr.StatusCodeDetail, Data: lr.Body, Headers: lr.Headers, GRPCStatus: lr.GRPCStatus}
}

func (w *wasmFilter) GetCurrentResponseHeaders(id uint32) [][2]string {
	return w.vm.ResponseHeadersOf(id)
}

func (w *wasmFilter) GetCounterMetric(name string) (uint64, error) { return w.vm.Metric(name) }

func (w *wasmFilter) GetTickPeriod() uint32 { return w.vm.TickPeriod() }

func (w *wasmFilter) Tick() {
	w.t.Helper()
	w.must(w.vm.Tick())
}

// String names the backend in messages.
func (w *wasmFilter) String() string { return fmt.Sprintf("wasm VM %p", w.vm) }
