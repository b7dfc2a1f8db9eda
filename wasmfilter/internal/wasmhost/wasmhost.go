// Package wasmhost is a small proxy-wasm host (ABI 0.2.1) on wazero, for running a
// compiled plugin such as tollgate's filter in tests and benchmarks (wasmfilter's
// tests; a benchmark under scripts/ may import it too). The filter never imports it.
//
// It implements the env.proxy_* imports an HTTP filter uses — logs, properties,
// header maps, buffers, local responses, HTTP callouts, ticks, the effective context,
// metrics and shared data with compare-and-swap — and drives the proxy_on_* exports
// the way Envoy does. Unlike the SDK's proxytest wrapper, it sets the module's wall
// and monotonic clocks (WASI clock_time_get) from a clock the caller chooses, so tests
// of time-dependent behaviour advance the plugin's time themselves.
//
// A Runtime compiles a module once; each VM is one instance of it, as Envoy runs one
// VM per worker thread. A VM is safe for use by several goroutines: its methods run
// one at a time, as Envoy's worker thread does. A guest that traps (a panic, an
// out-of-bounds access, proc_exit) makes the call return an error, and the VM stays
// broken: every later call returns that error.
package wasmhost

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tetratelabs/wazero"
	"github.com/tetratelabs/wazero/api"
	"github.com/tetratelabs/wazero/imports/wasi_snapshot_preview1"
	"github.com/tetratelabs/wazero/sys"
)

// Build compiles the Go package in dir into a proxy-wasm module at out, as
// `make wasm` does: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared. Build
// tags, if any, select a variant of the package (go build -tags).
func Build(ctx context.Context, dir, out string, tags ...string) error {
	goBin, err := exec.LookPath("go")
	if err != nil {
		return fmt.Errorf("wasmhost: build %s: the go command is not on PATH: %w", dir, err)
	}
	args := []string{"build", "-buildmode=c-shared", "-trimpath", "-o", out}
	if len(tags) > 0 {
		args = append(args, "-tags", strings.Join(tags, ","))
	}
	cmd := exec.CommandContext(ctx, goBin, append(args, ".")...)
	cmd.Dir = dir
	// GOFLAGS is cleared so that a -race of the calling test does not reach the wasm build.
	cmd.Env = append(os.Environ(), "GOOS=wasip1", "GOARCH=wasm", "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("wasmhost: GOOS=wasip1 GOARCH=wasm go build -buildmode=c-shared %s: %w\n%s", dir, err, b)
	}
	return nil
}

// Runtime holds one compiled proxy-wasm module, from which NewVM makes instances.
// A Runtime is safe for simultaneous use.
type Runtime struct {
	r        wazero.Runtime
	compiled wazero.CompiledModule
}

// RuntimeOptions configure a Runtime. The zero value is wazero's full WASI and no
// compilation cache.
type RuntimeOptions struct {
	// Cache, when not nil, shares compiled code with other runtimes of the same
	// process (wazero.NewCompilationCache).
	Cache wazero.CompilationCache
	// PollOneoffENOSYS makes WASI's poll_oneoff fail with ENOSYS, as Envoy's
	// proxy-wasm-cpp-host does before its PR #533, instead of wazero's working one.
	// Go's runtime polls from its scheduler (golang/go#78513).
	PollOneoffENOSYS bool
}

// errnoNOSYS is WASI's ENOSYS.
const errnoNOSYS = 52

// NewRuntime compiles a proxy-wasm module.
func NewRuntime(ctx context.Context, wasm []byte, opts RuntimeOptions) (*Runtime, error) {
	cfg := wazero.NewRuntimeConfig()
	if opts.Cache != nil {
		cfg = cfg.WithCompilationCache(opts.Cache)
	}
	r := wazero.NewRuntimeWithConfig(ctx, cfg)
	wasi := r.NewHostModuleBuilder(wasi_snapshot_preview1.ModuleName)
	wasi_snapshot_preview1.NewFunctionExporter().ExportFunctions(wasi)
	if opts.PollOneoffENOSYS {
		wasi.NewFunctionBuilder().
			WithGoModuleFunction(api.GoModuleFunc(func(_ context.Context, _ api.Module, stack []uint64) { stack[0] = errnoNOSYS }),
				[]api.ValueType{i32, i32, i32, i32}, []api.ValueType{i32}).
			Export("poll_oneoff")
	}
	if _, err := wasi.Instantiate(ctx); err != nil {
		r.Close(ctx)
		return nil, fmt.Errorf("wasmhost: instantiate WASI: %w", err)
	}
	if err := exportABI(ctx, r); err != nil {
		r.Close(ctx)
		return nil, err
	}
	compiled, err := r.CompileModule(ctx, wasm)
	if err != nil {
		r.Close(ctx)
		return nil, fmt.Errorf("wasmhost: compile the module: %w", err)
	}
	exports := compiled.ExportedFunctions()
	for _, name := range []string{"proxy_abi_version_0_2_0", "proxy_abi_version_0_2_1"} {
		if _, ok := exports[name]; ok {
			return &Runtime{r: r, compiled: compiled}, nil
		}
	}
	r.Close(ctx)
	return nil, errors.New("wasmhost: the module exports no proxy_abi_version_0_2_x function; is it a proxy-wasm plugin?")
}

// Module returns the compiled module, to inspect its imports and exports.
func (rt *Runtime) Module() wazero.CompiledModule { return rt.compiled }

// Close releases the runtime and every VM made from it.
func (rt *Runtime) Close(ctx context.Context) error { return rt.r.Close(ctx) }

// Options configure a VM. The zero value is a VM with no configuration, the system
// clock and shared data of its own.
type Options struct {
	// PluginConfig is what proxy_on_configure reads (Envoy's plugin configuration).
	PluginConfig []byte
	// VMConfig is what proxy_on_vm_start reads.
	VMConfig []byte
	// Properties answer proxy_get_property, keyed by the path's segments joined
	// with "." (e.g. "source.address"). A stream's own properties (NewHttpContext)
	// come first.
	Properties map[string][]byte
	// Clock is the plugin's wall and monotonic clock; nil means time.Now. A fake
	// clock must never go backwards.
	Clock func() time.Time
	// Shared is the shared data of the VM; VMs given the same value share it, as
	// Envoy's VMs of one vm_id do. Nil means a store of the VM's own.
	Shared *SharedData
	// OnHttpCall, when set, is called for each callout the plugin dispatches, with
	// the VM locked: it must not call the VM (answer from another goroutine).
	OnHttpCall func(Callout)
	// OnStreamChange, when set, is called with the VM locked when a paused stream
	// is continued or answered locally: it must not call the VM.
	OnStreamChange func(contextID uint32)
}

// Action is what a stream callback returns: Continue or Pause.
type Action uint32

const (
	ActionContinue Action = 0
	ActionPause    Action = 1
)

func (a Action) String() string {
	switch a {
	case ActionContinue:
		return "Continue"
	case ActionPause:
		return "Pause"
	}
	return fmt.Sprintf("Action(%d)", uint32(a))
}

// Log levels of proxy_log.
const (
	LogTrace uint32 = iota
	LogDebug
	LogInfo
	LogWarn
	LogError
	LogCritical
)

// A Callout is an HTTP call the plugin dispatched (proxy_http_call).
type Callout struct {
	ID        uint32
	ContextID uint32 // the context that was effective when it was dispatched
	Upstream  string // the Envoy cluster
	Headers   [][2]string
	Body      []byte
	Trailers  [][2]string
	Timeout   time.Duration
}

// A LocalResponse is a reply the plugin sent itself (proxy_send_local_response).
type LocalResponse struct {
	StatusCode       uint32
	StatusCodeDetail string
	Headers          [][2]string
	Body             []byte
	GRPCStatus       int32
}

type stream struct {
	requestHeaders   [][2]string
	responseHeaders  [][2]string
	responseTrailers [][2]string
	properties       map[string][]byte
	action           Action
	local            *LocalResponse
	callouts         []Callout
}

type metric struct {
	name  string
	kind  uint32
	value uint64
}

// calloutAnswer is the answer being delivered by proxy_on_http_call_response.
type calloutAnswer struct {
	headers, trailers [][2]string
	body              []byte
}

// VM is one instance of the module with its host state: streams, callouts,
// metrics, the tick and the logs.
type VM struct {
	mu      sync.Mutex
	ctx     context.Context // carries the VM to the host functions
	mod     api.Module
	opts    Options
	stderr  *bytes.Buffer
	broken  error
	rootID  uint32
	nextID  uint32
	current uint32 // the effective context

	streams map[uint32]*stream
	pending map[uint32]Callout // callouts not answered yet, by ID
	// rootCallouts are the callouts dispatched with the root context effective
	// (from a tick, or from the answer of another such callout).
	rootCallouts []Callout
	answer       *calloutAnswer
	metrics      []metric // metric ID i+1
	tick         uint32
	logs         [][]string // by level
	shared       *SharedData
	malloc       api.Function
	// exports caches the exports called: wazero makes a new call engine, with its
	// own stack, for each ExportedFunction.
	exports map[string]api.Function
}

type vmKey struct{}

// NewVM instantiates the module (running _initialize) and creates its root context.
// Call StartPlugin next.
func (rt *Runtime) NewVM(ctx context.Context, opts Options) (*VM, error) {
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.Shared == nil {
		opts.Shared = NewSharedData()
	}
	vm := &VM{opts: opts, stderr: &bytes.Buffer{}, rootID: 1, nextID: 2,
		streams: map[uint32]*stream{}, pending: map[uint32]Callout{}, exports: map[string]api.Function{},
		logs: make([][]string, LogCritical+1), shared: opts.Shared}
	vm.ctx = context.WithValue(context.WithoutCancel(ctx), vmKey{}, vm)
	clock := opts.Clock
	start := clock()
	cfg := wazero.NewModuleConfig().
		WithName("").
		WithStartFunctions("_initialize").
		WithStdout(vm.stderr).
		WithStderr(vm.stderr).
		WithWalltime(func() (int64, int32) {
			t := clock()
			return t.Unix(), int32(t.Nanosecond())
		}, sys.ClockResolution(1)).
		// The monotonic clock starts at 1 s, so that no reading is zero.
		WithNanotime(func() int64 { return int64(clock().Sub(start)) + int64(time.Second) }, sys.ClockResolution(1))
	mod, err := rt.r.InstantiateModule(vm.ctx, rt.compiled, cfg)
	if err != nil {
		return nil, fmt.Errorf("wasmhost: instantiate the module: %w%s", err, vm.output())
	}
	vm.mod = mod
	vm.malloc = mod.ExportedFunction("proxy_on_memory_allocate")
	if vm.malloc == nil {
		mod.Close(ctx)
		return nil, errors.New("wasmhost: the module does not export proxy_on_memory_allocate")
	}
	if _, err := vm.call(0, "proxy_on_context_create", uint64(vm.rootID), 0); err != nil {
		return nil, err
	}
	return vm, nil
}

// Close releases the VM's instance.
func (vm *VM) Close(ctx context.Context) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.mod.Close(ctx)
}

// MemorySize returns the size of the VM's linear memory in bytes. A wasm memory
// only grows, so this is the most the guest has ever needed at once: Envoy keeps a
// VM as long as its configuration, and this must level off.
func (vm *VM) MemorySize() uint32 {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.mod.Memory().Size()
}

// output returns what the guest wrote to stdout and stderr (a panic's message), to
// append to an error.
func (vm *VM) output() string {
	if vm.stderr.Len() == 0 {
		return ""
	}
	return "\nguest output:\n" + vm.stderr.String()
}

// call calls an export with context as the effective context. The VM must be locked.
func (vm *VM) call(context uint32, name string, params ...uint64) (uint64, error) {
	if vm.broken != nil {
		return 0, vm.broken
	}
	fn := vm.exports[name]
	if fn == nil {
		if fn = vm.mod.ExportedFunction(name); fn == nil {
			return 0, fmt.Errorf("wasmhost: the module does not export %s", name)
		}
		vm.exports[name] = fn
	}
	vm.current = context
	res, err := fn.Call(vm.ctx, params...)
	if err != nil {
		vm.broken = fmt.Errorf("wasmhost: %s%v trapped: %w%s", name, params, err, vm.output())
		return 0, vm.broken
	}
	if len(res) == 0 {
		return 0, nil
	}
	return res[0], nil
}

// StartPlugin runs proxy_on_vm_start and proxy_on_configure, and reports whether
// the plugin accepted its configuration (a false start is no error: read the
// critical logs for why).
func (vm *VM) StartPlugin() (bool, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	ok, err := vm.call(vm.rootID, "proxy_on_vm_start", uint64(vm.rootID), uint64(len(vm.opts.VMConfig)))
	if err != nil || ok == 0 {
		return false, err
	}
	ok, err = vm.call(vm.rootID, "proxy_on_configure", uint64(vm.rootID), uint64(len(vm.opts.PluginConfig)))
	return ok != 0, err
}

// NewHttpContext creates a stream; properties, when not nil, answer
// proxy_get_property for it before the VM's own (e.g. "source.address").
func (vm *VM) NewHttpContext(properties map[string][]byte) (uint32, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	id := vm.nextID
	vm.nextID++
	vm.streams[id] = &stream{properties: properties}
	if _, err := vm.call(vm.rootID, "proxy_on_context_create", uint64(id), uint64(vm.rootID)); err != nil {
		return 0, err
	}
	return id, nil
}

func (vm *VM) stream(id uint32) (*stream, error) {
	s, ok := vm.streams[id]
	if !ok {
		return nil, fmt.Errorf("wasmhost: no stream %d", id)
	}
	return s, nil
}

// RequestHeaders delivers a stream's request headers (proxy_on_request_headers).
func (vm *VM) RequestHeaders(id uint32, headers [][2]string, endOfStream bool) (Action, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	s, err := vm.stream(id)
	if err != nil {
		return 0, err
	}
	s.requestHeaders = slices.Clone(headers)
	a, err := vm.call(id, "proxy_on_request_headers", uint64(id), uint64(len(headers)), boolParam(endOfStream))
	s.action = Action(a)
	return s.action, err
}

// ResponseHeaders delivers a stream's response headers (proxy_on_response_headers);
// ResponseHeadersOf then returns them as the plugin left them.
func (vm *VM) ResponseHeaders(id uint32, headers [][2]string, endOfStream bool) (Action, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	s, err := vm.stream(id)
	if err != nil {
		return 0, err
	}
	s.responseHeaders = slices.Clone(headers)
	a, err := vm.call(id, "proxy_on_response_headers", uint64(id), uint64(len(headers)), boolParam(endOfStream))
	s.action = Action(a)
	return s.action, err
}

// ResponseTrailers delivers a stream's response trailers (proxy_on_response_trailers).
func (vm *VM) ResponseTrailers(id uint32, trailers [][2]string) (Action, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	s, err := vm.stream(id)
	if err != nil {
		return 0, err
	}
	s.responseTrailers = slices.Clone(trailers)
	a, err := vm.call(id, "proxy_on_response_trailers", uint64(id), uint64(len(trailers)))
	s.action = Action(a)
	return s.action, err
}

// RootID is the root (plugin) context's id: Callouts(RootID()) are the callouts the
// plugin dispatched outside any stream.
func (vm *VM) RootID() uint32 { return vm.rootID }

// CompleteHttpContext ends a stream as Envoy does: proxy_on_done, proxy_on_log,
// proxy_on_delete.
func (vm *VM) CompleteHttpContext(id uint32) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if _, err := vm.stream(id); err != nil {
		return err
	}
	for _, fn := range []string{"proxy_on_done", "proxy_on_log", "proxy_on_delete"} {
		if _, err := vm.call(id, fn, uint64(id)); err != nil {
			return err
		}
	}
	delete(vm.streams, id)
	return nil
}

// RespondCallout answers a pending callout (proxy_on_http_call_response). Envoy's
// own failures are answers too: nil headers for a reset, a 503 or 504 of its own.
func (vm *VM) RespondCallout(calloutID uint32, headers, trailers [][2]string, body []byte) error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if _, ok := vm.pending[calloutID]; !ok {
		return fmt.Errorf("wasmhost: no pending callout %d", calloutID)
	}
	delete(vm.pending, calloutID) // the ID may be handed out again from now on
	vm.answer = &calloutAnswer{headers: headers, trailers: trailers, body: body}
	defer func() { vm.answer = nil }()
	_, err := vm.call(vm.rootID, "proxy_on_http_call_response", uint64(vm.rootID), uint64(calloutID),
		uint64(len(headers)), uint64(len(body)), uint64(len(trailers)))
	return err
}

// Tick runs proxy_on_tick once.
func (vm *VM) Tick() error {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	_, err := vm.call(vm.rootID, "proxy_on_tick", uint64(vm.rootID))
	return err
}

// TickPeriod is the period the plugin set, in milliseconds; 0 when off.
func (vm *VM) TickPeriod() uint32 {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	return vm.tick
}

// Callouts returns the callouts a stream (or the root context, RootID) dispatched,
// answered or not.
func (vm *VM) Callouts(id uint32) []Callout {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if id == vm.rootID {
		return slices.Clone(vm.rootCallouts)
	}
	if s, ok := vm.streams[id]; ok {
		return slices.Clone(s.callouts)
	}
	return nil
}

// StreamAction is the stream's state: the action of its last callback, or
// Continue once the plugin resumed it.
func (vm *VM) StreamAction(id uint32) Action {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if s, ok := vm.streams[id]; ok {
		return s.action
	}
	return ActionContinue
}

// LocalResponseOf returns the local response the plugin sent for a stream, or nil.
func (vm *VM) LocalResponseOf(id uint32) *LocalResponse {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if s, ok := vm.streams[id]; ok && s.local != nil {
		lr := *s.local
		return &lr
	}
	return nil
}

// ResponseHeadersOf returns a stream's response headers.
func (vm *VM) ResponseHeadersOf(id uint32) [][2]string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if s, ok := vm.streams[id]; ok {
		return slices.Clone(s.responseHeaders)
	}
	return nil
}

// RequestHeadersOf returns a stream's request headers, as the plugin left them.
func (vm *VM) RequestHeadersOf(id uint32) [][2]string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if s, ok := vm.streams[id]; ok {
		return slices.Clone(s.requestHeaders)
	}
	return nil
}

// Metric returns the value of the metric the plugin defined as name.
func (vm *VM) Metric(name string) (uint64, error) {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	for _, m := range vm.metrics {
		if m.name == name {
			return m.value, nil
		}
	}
	return 0, fmt.Errorf("wasmhost: the plugin defined no metric %q", name)
}

// Logs returns what the plugin logged at a level (LogTrace … LogCritical).
func (vm *VM) Logs(level uint32) []string {
	vm.mu.Lock()
	defer vm.mu.Unlock()
	if int(level) >= len(vm.logs) {
		return nil
	}
	return slices.Clone(vm.logs[level])
}

func boolParam(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// SharedData is Envoy's shared key-value store of one vm_id: no expiry, and writes
// guarded by compare-and-swap. It is safe for simultaneous use.
type SharedData struct {
	mu      sync.Mutex
	entries map[string]sharedEntry
	nextCAS uint32
}

type sharedEntry struct {
	value []byte
	cas   uint32
}

// NewSharedData returns an empty store.
func NewSharedData() *SharedData { return &SharedData{entries: map[string]sharedEntry{}} }

// get returns the value and CAS of key, or NotFound.
func (d *SharedData) get(key string) ([]byte, uint32, status) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.entries[key]
	if !ok {
		return nil, 0, statusNotFound
	}
	return e.value, e.cas, statusOK
}

// set stores value under key, as Envoy's SharedData::set does: a key that is missing
// is written whatever cas is; a key that exists is written when cas is zero or equals
// its CAS, and otherwise the call fails with CasMismatch. Each write gives the entry a
// new CAS, never zero.
func (d *SharedData) set(key string, value []byte, cas uint32) status {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.entries[key]; ok && cas != 0 && cas != e.cas {
		return statusCasMismatch
	}
	d.nextCAS++
	if d.nextCAS == 0 {
		d.nextCAS++
	}
	d.entries[key] = sharedEntry{value: bytes.Clone(value), cas: d.nextCAS}
	return statusOK
}

// Set stores value under key as another plugin of the same vm_id may (a write with
// CAS 0), e.g. to put hostile bytes where the plugin reads.
func (d *SharedData) Set(key string, value []byte) { d.set(key, value, 0) }

// Get returns the value stored under key, and whether there is one.
func (d *SharedData) Get(key string) ([]byte, bool) {
	v, _, st := d.get(key)
	return bytes.Clone(v), st == statusOK
}

// Len returns the number of keys stored.
func (d *SharedData) Len() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.entries)
}
