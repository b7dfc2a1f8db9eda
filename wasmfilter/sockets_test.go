package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// countingHandler counts the requests a handler serves and remembers the last
// X-Tollgate-Delay-Ms it answered.
type countingHandler struct {
	next  http.Handler
	n     atomic.Int64
	mu    sync.Mutex
	delay string
}

func (c *countingHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.n.Add(1)
	c.next.ServeHTTP(w, r)
	c.mu.Lock()
	c.delay = w.Header().Get("X-Tollgate-Delay-Ms")
	c.mu.Unlock()
}

func (c *countingHandler) lastDelay() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.delay
}

const socketsPolicy = `
domain: public-api
failure: {mode: open, timeout: 2s}
rules:
  - name: per-key
    match: {api_key: "*", path: /search}
    limits:
      - {algorithm: sliding_log, rate: 5/min}
  - name: uploads
    match: {api_key: "*", path: /upload}
    limits:
      - {algorithm: leaky_bucket, rate: 10/s, burst: 5}
`

// socketsConfig is baseConfig with a timeout generous enough for a loaded CI machine
// (these tests are about answers, not time), ticks every 5 ms, and local limits.
var socketsConfig = strings.Replace(cfg(`"tick_ms": 5, "failure_mode": "local",
	"local_limits": [{"name": "local-per-key", "key": ["api_key"], "algorithm": "fixed_window", "rate": "1/min"}]`),
	`"timeout_ms": 250`, `"timeout_ms": 2000`, 1)

// TestSocketsEndToEnd runs the compiled filter in wasmhost's proxy over real sockets:
// a client sends HTTP requests to the proxy, the filter's callouts go over HTTP to the
// real decision service on a real redis-server, and the requests it lets through
// reach a real upstream. Allowed requests reach the upstream and come back with the
// RateLimit headers; the sixth request of a key is the filter's local 429 with the
// service's Retry-After; the seventh comes from the deny cache without a callout; a
// leaky bucket's delay holds a request at least that long; and with the decision
// service gone the filter's failure mode (local limits) decides.
func TestSocketsEndToEnd(t *testing.T) {
	h, _ := decisionHandler(t, socketsPolicy)
	service := &countingHandler{next: h}
	decisionSrv := httptest.NewServer(service)
	t.Cleanup(decisionSrv.Close)

	var upstreamHits atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		w.Header().Set("Content-Type", "text/plain")
		io.WriteString(w, r.URL.Path+" ok")
	}))
	t.Cleanup(upstream.Close)

	proxy, err := wasmhost.NewProxy(context.Background(), filterRuntime(t), wasmhost.ProxyConfig{
		VM:       wasmhost.Options{PluginConfig: []byte(socketsConfig)},
		Upstream: upstream.URL,
		Clusters: map[string]string{"tollgate_decision": decisionSrv.URL},
	})
	if err != nil {
		t.Fatalf("NewProxy: %v", err)
	}
	t.Cleanup(func() { proxy.Close() })
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)

	send := func(apiKey, path string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, front.URL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("X-Api-Key", apiKey)
		// A request the filter holds for ever (a broken tick) fails here, not at the
		// suite's timeout.
		client := &http.Client{Timeout: 10 * time.Second}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s (key %s): %v", path, apiKey, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: read the body: %v", path, err)
		}
		if err := proxy.Err(); err != nil {
			t.Fatalf("GET %s: the VM failed: %v", path, err)
		}
		return resp, string(body)
	}
	metric := func(name string) uint64 {
		t.Helper()
		v, err := proxy.VM().Metric("tollgate." + name)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	for i := 1; i <= 5; i++ {
		resp, body := send("k1", "/search")
		if resp.StatusCode != 200 || body != "/search ok" {
			t.Fatalf("request %d: %d %q, want 200 from the upstream", i, resp.StatusCode, body)
		}
		if got, want := resp.Header.Get("X-RateLimit-Remaining"), strconv.Itoa(5-i); got != want {
			t.Errorf("request %d: X-RateLimit-Remaining = %q, want %q", i, got, want)
		}
		if got := resp.Header.Get("RateLimit-Policy"); got != `"per-key";q=5;w=60` {
			t.Errorf("request %d: RateLimit-Policy = %q, want the service's", i, got)
		}
		if n := len(resp.Header.Values("RateLimit")); n != 1 {
			t.Errorf("request %d: %d RateLimit headers, want 1", i, n)
		}
	}
	if got := upstreamHits.Load(); got != 5 {
		t.Errorf("upstream hits after 5 allowed requests = %d, want 5", got)
	}

	resp, body := send("k1", "/search")
	if resp.StatusCode != 429 {
		t.Fatalf("request 6: status %d, want the filter's 429", resp.StatusCode)
	}
	retry, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > 60 {
		t.Errorf("request 6: Retry-After = %q, want 1 to 60 seconds", resp.Header.Get("Retry-After"))
	}
	var denial map[string]any
	if err := json.Unmarshal([]byte(body), &denial); err != nil || denial["rule"] != "per-key" {
		t.Errorf("request 6: body %s, want JSON naming rule per-key (%v)", body, err)
	}

	callouts, served := proxy.Callouts(), service.n.Load()
	resp, _ = send("k1", "/search")
	if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
		t.Errorf("request 7: status %d, Retry-After %q; want 429 from the deny cache", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	if got := proxy.Callouts(); got != callouts {
		t.Errorf("request 7 made %d callouts, want 0 (the deny cache answers)", got-callouts)
	}
	if got := service.n.Load(); got != served {
		t.Errorf("the decision service served %d requests for request 7, want 0", got-served)
	}
	if got := upstreamHits.Load(); got != 5 {
		t.Errorf("upstream hits after two denials = %d, want 5", got)
	}
	if got := metric("deny_cache_hits"); got != 1 {
		t.Errorf("tollgate.deny_cache_hits = %d, want 1", got)
	}

	// Shaping: the second upload right after the first waits its turn in the bucket.
	if resp, _ := send("k2", "/upload"); resp.StatusCode != 200 {
		t.Fatalf("first upload: status %d, want 200", resp.StatusCode)
	}
	start := time.Now()
	resp, _ = send("k2", "/upload")
	held := time.Since(start)
	delay, err := strconv.Atoi(service.lastDelay())
	if err != nil || delay < 1 {
		t.Fatalf("second upload: the service's X-Tollgate-Delay-Ms = %q, want a delay", service.lastDelay())
	}
	if resp.StatusCode != 200 {
		t.Fatalf("second upload: status %d, want 200 after its delay", resp.StatusCode)
	}
	if want := time.Duration(delay) * time.Millisecond; held < want {
		t.Errorf("second upload: answered after %v, want it held at least the service's %v", held, want)
	}
	if got := metric("shaped"); got != 1 {
		t.Errorf("tollgate.shaped = %d, want 1", got)
	}

	// The decision service goes away: Envoy's 503 sends the filter to its local limits.
	decisionSrv.Close()
	hits := upstreamHits.Load()
	if resp, body := send("k3", "/search"); resp.StatusCode != 200 || body != "/search ok" {
		t.Errorf("service down, first k3 request: %d %q, want 200 from the upstream (local limit 1/min)", resp.StatusCode, body)
	} else if got := resp.Header.Get("RateLimit-Policy"); got != `"local-per-key";q=1;w=60` {
		t.Errorf("service down: RateLimit-Policy = %q, want the local limit's", got)
	}
	if resp, _ := send("k3", "/search"); resp.StatusCode != 429 {
		t.Errorf("service down, second k3 request: status %d, want the local limit's 429", resp.StatusCode)
	}
	if got := upstreamHits.Load() - hits; got != 1 {
		t.Errorf("service down: %d requests reached the upstream, want 1", got)
	}
	if got := metric("failure_mode_activations"); got != 2 {
		t.Errorf("tollgate.failure_mode_activations = %d, want 2", got)
	}
}

// TestSocketsSettle runs the compiled filter with a settle block in wasmhost's proxy
// over real sockets: the upstream reports each response's tokens in a header or, for
// a streamed answer, a trailer; the filter settles them with the real decision
// service on a real redis-server from its tick on the wall clock, and the tenant that
// overshoots its 1000 tokens is denied.
func TestSocketsSettle(t *testing.T) {
	h, _ := decisionHandler(t, tokensPolicy)
	service := &countingHandler{next: h}
	decisionSrv := httptest.NewServer(service)
	t.Cleanup(decisionSrv.Close)
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tokens := r.URL.Query().Get("tokens")
		if r.URL.Path == "/v1/stream" {
			w.Header().Set("Trailer", "X-Usage-Total")
			io.WriteString(w, "data: …\n\n")
			w.Header().Set("X-Usage-Total", tokens)
			return
		}
		w.Header().Set("X-Tokens-Used", tokens)
		io.WriteString(w, "done")
	}))
	t.Cleanup(upstream.Close)
	config := strings.Replace(cfg(`"tick_ms": 5, "settle": {"cost_header": "x-tokens-used", "cost_trailer": "x-usage-total"}`),
		`"timeout_ms": 250`, `"timeout_ms": 2000`, 1)
	proxy, err := wasmhost.NewProxy(context.Background(), filterRuntime(t), wasmhost.ProxyConfig{
		VM:       wasmhost.Options{PluginConfig: []byte(config)},
		Upstream: upstream.URL,
		Clusters: map[string]string{"tollgate_decision": decisionSrv.URL},
	})
	if err != nil {
		t.Fatalf("NewProxy: %v", err)
	}
	t.Cleanup(func() { proxy.Close() })
	front := httptest.NewServer(proxy)
	t.Cleanup(front.Close)

	send := func(path string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, front.URL+path, nil)
		req.Header.Set("X-Api-Key", "tenant-1")
		resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err := proxy.Err(); err != nil {
			t.Fatalf("GET %s: the VM failed: %v", path, err)
		}
		return resp
	}
	settled := func(want uint64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			n, err := proxy.VM().Metric("tollgate.settled")
			if err != nil {
				t.Fatal(err)
			}
			if n == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("tollgate.settled = %d after 10 s, want %d", n, want)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	if resp := send("/v1/chat?tokens=300"); resp.StatusCode != 200 || resp.Header.Get("X-Tokens-Used") != "300" {
		t.Fatalf("first request: %d, X-Tokens-Used %q; want 200 from the upstream", resp.StatusCode, resp.Header.Get("X-Tokens-Used"))
	}
	settled(1)
	if resp := send("/v1/stream?tokens=500"); resp.StatusCode != 200 || resp.Trailer.Get("X-Usage-Total") != "500" {
		t.Fatalf("streamed request: %d, trailer X-Usage-Total %q; want 200 with the trailer (headers %v, trailers %v)", resp.StatusCode, resp.Trailer.Get("X-Usage-Total"), resp.Header, resp.Trailer)
	}
	settled(2)
	// 1 + 300 + 1 + 500 + this check's 1 = 803 of 1000.
	if resp := send("/v1/chat?tokens=250"); resp.StatusCode != 200 || resp.Header.Get("X-RateLimit-Remaining") != "197" {
		t.Fatalf("third request: %d, X-RateLimit-Remaining %q; want 200 and 197", resp.StatusCode, resp.Header.Get("X-RateLimit-Remaining"))
	}
	settled(3)
	// 1053 of 1000: in debt, denied.
	if resp := send("/v1/chat?tokens=1"); resp.StatusCode != 429 {
		t.Fatalf("after the overshoot: %d, want 429", resp.StatusCode)
	}
	if units, _ := proxy.VM().Metric("tollgate.settled_units"); units != 1050 {
		t.Errorf("tollgate.settled_units = %d, want 1050", units)
	}
	// 4 checks and 3 settlements reached the service.
	if got := service.n.Load(); got != 7 {
		t.Errorf("the decision service served %d requests, want 7", got)
	}
}
