package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/tetratelabs/wazero"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// The cost of the compiled filter in wazero: the module's size, what a VM costs to
// start (Envoy starts one per worker), the filter's CPU time per request and its
// linear memory over a VM's life. `make bench` runs these and reports them
// (scripts/bench, the "filter" section); CI can run them briefly:
//
//	go test -run '^$' -bench . -benchtime 100x ./wasmfilter/
//
// Each runs the module built with internal/jsonv (the filter as shipped) and the one
// built with -tags encjson, which reads the callout answers with encoding/json
// instead, so that the two readers are weighed in one run.

// readers are the JSON readers of the answers, by name: the build tags of each.
var readers = []struct {
	name string
	tags []string
}{
	{"jsonv", nil},
	{"encjson", []string{"encjson"}},
}

// A variant is the filter built with one reader, and compiled once.
type variant struct {
	wasm    []byte
	runtime *wasmhost.Runtime
}

var variants struct {
	mu sync.Mutex
	m  map[string]*variant
}

// filterVariant returns the filter built with the tags (none: the module the tests
// run, TOLLGATE_WASM included).
func filterVariant(tb testing.TB, name string, tags []string) *variant {
	tb.Helper()
	variants.mu.Lock()
	defer variants.mu.Unlock()
	if v, ok := variants.m[name]; ok {
		return v
	}
	v := &variant{}
	if len(tags) == 0 {
		wasm, err := os.ReadFile(filterWasm(tb))
		if err != nil {
			tb.Fatal(err)
		}
		v.wasm, v.runtime = wasm, filterRuntime(tb)
	} else {
		out := filepath.Join(tb.TempDir(), "tollgate-"+name+".wasm")
		if err := wasmhost.Build(context.Background(), ".", out, tags...); err != nil {
			tb.Fatalf("build the filter with -tags %v: %v", tags, err)
		}
		wasm, err := os.ReadFile(out)
		if err != nil {
			tb.Fatal(err)
		}
		v.wasm = wasm
		if v.runtime, err = wasmhost.NewRuntime(context.Background(), wasm,
			wasmhost.RuntimeOptions{Cache: wazero.NewCompilationCache(), PollOneoffENOSYS: true}); err != nil {
			tb.Fatal(err)
		}
	}
	if variants.m == nil {
		variants.m = map[string]*variant{}
	}
	variants.m[name] = v
	return v
}

// benchConfig is a filter as envoy.yaml sets it up: four attributes, the deny cache
// on, failing open.
const benchConfig = `{
	"cluster": "tollgate_decision",
	"domain": "public-api",
	"attributes": [
		{"name": "api_key", "from": "header", "header": "x-api-key"},
		{"name": "remote_address", "from": "source.address"},
		{"name": "path", "from": "path"},
		{"name": "method", "from": "method"}
	]
}`

// The traffic of the mix: benchClients distinct API keys, visited in a fixed
// scrambled order, one request every benchStep of the filter's clock, so that each
// client comes back every 5 s. The service allows three requests of a client and
// denies the fourth for 6 s: the client's next visit is a deny-cache hit, the one
// after that is asked again. Per five requests: three allowed, one denied by the
// service (a local 429, cached) and one from the deny cache.
const (
	benchClients = 10000
	benchStep    = 500 * time.Microsecond
	benchRetry   = "6000"
)

// A kind of request of the mix.
type requestKind int

const (
	kindAllowed requestKind = iota // 200, headers added to the response
	kindDenied                     // the service's 429, answered locally and cached
	kindCached                     // a 429 from the deny cache, no callout
	kindMixed                      // the traffic described above
)

// benchVM is one VM of the filter driven as Envoy drives it, with the callout
// answered at once and the filter's clock advanced by benchStep a request.
type benchVM struct {
	vm      *wasmhost.VM
	now     time.Time
	callout uint32 // the last callout dispatched
	called  bool
	keys    []string
	reqs    [][][2]string // the request headers of each client
	visits  []int         // per client: requests the service has seen
	next    int           // the next request's number
}

var (
	benchAllowHeaders = [][2]string{
		{":status", "200"}, {"content-type", "application/json"},
		{"ratelimit-policy", `"per-key";q=100;w=60`}, {"ratelimit", `"per-key";r=42;t=17`},
		{"x-ratelimit-limit", "100"}, {"x-ratelimit-remaining", "42"}, {"x-ratelimit-reset", "17"},
	}
	benchAllowBody   = []byte(`{"allowed":true,"domain":"public-api","rule":"per-key","limit":100,"remaining":42,"reset_after_ms":17000,"retry_after_ms":0,"delay_ms":0,"degraded":false}`)
	benchDenyHeaders = [][2]string{
		{":status", "429"}, {"content-type", "application/json"},
		{"ratelimit-policy", `"per-key";q=100;w=60`}, {"ratelimit", `"per-key";r=0;t=6`},
		{"x-ratelimit-limit", "100"}, {"x-ratelimit-remaining", "0"}, {"x-ratelimit-reset", "6"},
		{"retry-after", "6"},
	}
	benchDenyBody        = []byte(`{"allowed":false,"domain":"public-api","rule":"per-key","limit":100,"remaining":0,"reset_after_ms":6000,"retry_after_ms":` + benchRetry + `,"delay_ms":0,"degraded":false}`)
	benchUpstreamHeaders = [][2]string{{":status", "200"}, {"content-type", "text/plain"}, {"content-length", "9"}}
)

// newBenchVM starts a VM of v with benchConfig.
func newBenchVM(tb testing.TB, v *variant) *benchVM {
	tb.Helper()
	bv := &benchVM{now: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC), visits: make([]int, benchClients)}
	vm, err := v.runtime.NewVM(context.Background(), wasmhost.Options{
		PluginConfig: []byte(benchConfig),
		Properties:   map[string][]byte{"source.address": []byte("192.0.2.7:41234")},
		Clock:        func() time.Time { return bv.now },
		OnHttpCall:   func(c wasmhost.Callout) { bv.callout, bv.called = c.ID, true },
	})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { vm.Close(context.Background()) })
	if ok, err := vm.StartPlugin(); err != nil || !ok {
		tb.Fatalf("StartPlugin() = %v, %v; critical logs: %q", ok, err, vm.Logs(wasmhost.LogCritical))
	}
	bv.vm = vm
	for i := range benchClients {
		key := "key-" + strconv.Itoa(i)
		bv.keys = append(bv.keys, key)
		bv.reqs = append(bv.reqs, [][2]string{
			{":authority", "api.example.com"}, {":path", "/search?q=tollgate&page=2"}, {":method", "GET"},
			{":scheme", "https"}, {"user-agent", "curl/8.5.0"}, {"accept", "*/*"},
			{"x-api-key", key}, {"x-request-id", "0f8fad5b-d9cb-469f-a165-70867728950e"},
		})
	}
	return bv
}

// request runs one request of kind k through the VM, from its request headers to the
// end of its stream, and returns what became of it.
func (bv *benchVM) request(k requestKind) (requestKind, error) {
	n := bv.next
	bv.next++
	client := n * 7919 % benchClients // 7919 is prime: every client once per benchClients requests
	switch k {
	case kindMixed:
		bv.now = bv.now.Add(benchStep)
	case kindAllowed:
		bv.now = bv.now.Add(benchStep)
		client = 0
	case kindDenied:
		bv.now = bv.now.Add(7 * time.Second) // past the last denial's retry time
		client = 0
	case kindCached:
		client = 0 // and the clock stands still, so that the denial stays live
	}
	vm := bv.vm
	id, err := vm.NewHttpContext(nil)
	if err != nil {
		return 0, err
	}
	bv.called = false
	a, err := vm.RequestHeaders(id, bv.reqs[client], true)
	if err != nil {
		return 0, err
	}
	got := kindCached
	if a == wasmhost.ActionPause && bv.called {
		bv.visits[client]++
		deny := k == kindDenied || k == kindMixed && bv.visits[client]%4 == 0
		if deny {
			got = kindDenied
			err = vm.RespondCallout(bv.callout, benchDenyHeaders, nil, benchDenyBody)
		} else {
			got = kindAllowed
			err = vm.RespondCallout(bv.callout, benchAllowHeaders, nil, benchAllowBody)
		}
		if err != nil {
			return 0, err
		}
	}
	if got == kindAllowed {
		if _, err := vm.ResponseHeaders(id, benchUpstreamHeaders, false); err != nil {
			return 0, err
		}
	}
	return got, vm.CompleteHttpContext(id)
}

// prime brings a VM to the state kind k measures: client 0 in the deny cache for
// kindCached.
func (bv *benchVM) prime(tb testing.TB, k requestKind) {
	tb.Helper()
	if k != kindCached {
		return
	}
	if got, err := bv.request(kindDenied); err != nil || got != kindDenied {
		tb.Fatalf("prime the deny cache: %v, %v", got, err)
	}
}

var kindNames = map[requestKind]string{kindAllowed: "allowed", kindDenied: "denied", kindCached: "deny-cache", kindMixed: "mix"}

// BenchmarkVMStart measures what Envoy pays for a VM of the filter: compiling the
// module (once per runtime; reported as compile-ms, one compile without a cache),
// then per op instantiating it (the Go runtime's _initialize), proxy_on_vm_start and
// the plugin's start (proxy_on_configure: parsing benchConfig). module-bytes is the
// module's size, start-linear-bytes the linear memory of a VM just started.
func BenchmarkVMStart(b *testing.B) {
	for _, r := range readers {
		b.Run("reader="+r.name, func(b *testing.B) {
			v := filterVariant(b, r.name, r.tags)
			ctx := context.Background()
			t0 := time.Now()
			rt, err := wasmhost.NewRuntime(ctx, v.wasm, wasmhost.RuntimeOptions{PollOneoffENOSYS: true})
			if err != nil {
				b.Fatal(err)
			}
			compile := time.Since(t0)
			rt.Close(ctx)
			var linear uint32
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				vm, err := v.runtime.NewVM(ctx, wasmhost.Options{PluginConfig: []byte(benchConfig)})
				if err != nil {
					b.Fatal(err)
				}
				if ok, err := vm.StartPlugin(); err != nil || !ok {
					b.Fatalf("StartPlugin() = %v, %v", ok, err)
				}
				b.StopTimer()
				linear = vm.MemorySize()
				vm.Close(ctx)
				b.StartTimer()
			}
			b.ReportMetric(float64(compile.Microseconds())/1000, "compile-ms")
			b.ReportMetric(float64(len(v.wasm)), "module-bytes")
			b.ReportMetric(float64(linear), "start-linear-bytes")
		})
	}
}

// BenchmarkRequest measures the filter's CPU time per request in wazero: a request's
// headers (attributes read, deny cache looked up, the callout's body written and
// dispatched), the callout's answer given at once (no network), the response's
// headers and the end of the stream. The time includes wasmhost's side of each host
// call (copying header maps in and out), as Envoy pays its own; allocs/op are the
// host's (wasmhost's and wazero's), not the guest's. linear-bytes is the VM's linear
// memory after the run (b.N requests), linear-bytes-1k after 1,000 requests.
func BenchmarkRequest(b *testing.B) {
	for _, r := range readers {
		for _, k := range []requestKind{kindAllowed, kindDenied, kindCached, kindMixed} {
			b.Run("reader="+r.name+"/"+kindNames[k], func(b *testing.B) {
				bv := newBenchVM(b, filterVariant(b, r.name, r.tags))
				bv.prime(b, k)
				var linear1k uint32
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; b.Loop(); i++ {
					got, err := bv.request(k)
					if err != nil {
						b.Fatal(err)
					}
					if k != kindMixed && got != k {
						b.Fatalf("request %d: %s, want %s", i, kindNames[got], kindNames[k])
					}
					if i == 999 {
						linear1k = bv.vm.MemorySize()
					}
				}
				b.StopTimer()
				if linear1k > 0 {
					b.ReportMetric(float64(linear1k), "linear-bytes-1k")
				}
				b.ReportMetric(float64(bv.vm.MemorySize()), "linear-bytes")
			})
		}
	}
}

// BenchmarkJSONReader weighs encoding/json against internal/jsonv as the reader of the
// callout answers: each op is one request on a VM of each build, in alternating
// order, so that load from elsewhere slows both alike. It reports each one's time per
// request and the ratio encjson/jsonv; allowed answers every request with a parsed
// body, mix is BenchmarkRequest's mix (a fifth of it from the deny cache, parsing
// nothing).
func BenchmarkJSONReader(b *testing.B) {
	for _, k := range []requestKind{kindAllowed, kindMixed} {
		b.Run(kindNames[k], func(b *testing.B) {
			vms := make([]*benchVM, len(readers))
			for i, r := range readers {
				vms[i] = newBenchVM(b, filterVariant(b, r.name, r.tags))
			}
			spent := make([]time.Duration, len(readers))
			b.ResetTimer()
			for n := 0; b.Loop(); n++ {
				for j := range vms {
					i := (j + n) % len(vms) // who goes first alternates
					t0 := time.Now()
					if _, err := vms[i].request(k); err != nil {
						b.Fatal(err)
					}
					spent[i] += time.Since(t0)
				}
			}
			for i, r := range readers {
				b.ReportMetric(float64(spent[i].Nanoseconds())/float64(b.N), r.name+"-ns/req")
			}
			b.ReportMetric(float64(spent[1])/float64(spent[0]), "encjson/jsonv")
		})
	}
}

// TestLinearMemoryLevelsOff runs 100,000 requests of the benchmarks' mix (distinct
// clients, allowed, denied and cached) through one VM: its linear memory, which only
// grows, must be no larger after them than after the first 10,000 plus one 4 MiB
// heap arena of Go's, or something is kept per request or per client.
func TestLinearMemoryLevelsOff(t *testing.T) {
	bv := newBenchVM(t, filterVariant(t, readers[0].name, readers[0].tags))
	var at10k uint32
	seen := map[requestKind]int{}
	for i := range 100000 {
		got, err := bv.request(kindMixed)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		seen[got]++
		if i == 9999 {
			at10k = bv.vm.MemorySize()
		}
	}
	at100k := bv.vm.MemorySize()
	t.Logf("linear memory: %d bytes after 10,000 requests, %d after 100,000; requests %v", at10k, at100k, seen)
	if at100k > at10k+4<<20 {
		t.Errorf("linear memory grew from %d bytes after 10,000 requests to %d after 100,000; want at most 4 MiB more", at10k, at100k)
	}
	for _, k := range []requestKind{kindAllowed, kindDenied, kindCached} {
		if seen[k] < 10000 {
			t.Errorf("the mix made %d %s requests of 100,000, want at least 10,000", seen[k], kindNames[k])
		}
	}
}

// BenchmarkSettledRequest costs, on the compiled module, a request that settles its
// response's cost (headers → check callout → 200 → response headers with the cost →
// done → tick → settlement callout → 200) beside the same request without a settle
// block.
func BenchmarkSettledRequest(b *testing.B) {
	for _, tc := range []struct {
		name, extra string
	}{{"plain", ""}, {"settled", `"settle": {"cost_header": "x-tokens-used"}`}} {
		b.Run(tc.name, func(b *testing.B) {
			var last wasmhost.Callout // the newest callout, check or settlement
			vm, err := filterRuntime(b).NewVM(context.Background(), wasmhost.Options{PluginConfig: []byte(cfg(tc.extra)),
				OnHttpCall: func(c wasmhost.Callout) { last = c }})
			if err != nil {
				b.Fatal(err)
			}
			defer vm.Close(context.Background())
			if ok, err := vm.StartPlugin(); !ok || err != nil {
				b.Fatalf("StartPlugin: %v, %v", ok, err)
			}
			req := [][2]string{{":method", "POST"}, {":path", "/v1/chat"}, {":authority", "api.example.com"}, {"x-api-key", "k1"}}
			resp := [][2]string{{":status", "200"}, {"x-tokens-used", "730"}}
			ok := [][2]string{{":status", "200"}, {"content-type", "application/json"}}
			settled := 0
			b.ReportAllocs()
			for b.Loop() {
				id, err := vm.NewHttpContext(nil)
				if err != nil {
					b.Fatal(err)
				}
				vm.RequestHeaders(id, req, true)
				vm.RespondCallout(last.ID, ok, nil, benchAllowBody)
				vm.ResponseHeaders(id, resp, false)
				if err := vm.CompleteHttpContext(id); err != nil {
					b.Fatal(err)
				}
				if tc.extra != "" {
					check := last.ID
					vm.Tick()
					if last.ContextID != vm.RootID() {
						b.Fatalf("request %d: the tick sent no settlement (last callout %d from context %d)", settled+1, check, last.ContextID)
					}
					settled++
					if err := vm.RespondCallout(last.ID, ok, nil, []byte(`{"allowed":true,"remaining":0}`)); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
