package main

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/proxytest"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-dev/tollgate/shared/bounds"
)

// Every test of the filter runs on each backend (forBackends): natively on the SDK's
// proxytest emulator, and compiled to wasm in wasmhost. The proxytest emulator is one
// global host: these tests cannot run in parallel.

// fakeClock is the filter's clock in tests.
type fakeClock struct{ t time.Time }

func (c *fakeClock) Now() time.Time          { return c.t }
func (c *fakeClock) Advance(d time.Duration) { c.t = c.t.Add(d) }

const baseConfig = `{
	"cluster": "tollgate_decision",
	"authority": "tollgate-decision",
	"domain": "public-api",
	"timeout_ms": 250,
	"attributes": [
		{"name": "api_key", "from": "header", "header": "x-api-key"},
		{"name": "path", "from": "path"}
	]`

// cfg returns baseConfig with more top-level fields.
func cfg(extra string) string {
	if extra == "" {
		return baseConfig + "}"
	}
	return baseConfig + ",\n" + extra + "}"
}

// startFilter starts the plugin on a new host of backend b.
func startFilter(t *testing.T, b backend, config string) (filterHost, *fakeClock) {
	t.Helper()
	clock := &fakeClock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
	host := newFilter(t, b, config, clock.Now)
	if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
		t.Fatalf("StartPlugin() = %v, want OK; critical logs: %q", st, host.GetCriticalLogs())
	}
	return host, clock
}

// request starts a request and returns its context and the action of its headers.
func request(host filterHost, apiKey, path string) (uint32, types.Action) {
	id := host.InitializeHttpContext()
	hs := [][2]string{{":method", "GET"}, {":path", path}, {":authority", "api.example.com"}}
	if apiKey != "" {
		hs = append(hs, [2]string{"x-api-key", apiKey})
	}
	return id, host.CallOnRequestHeaders(id, hs, true)
}

// callouts returns the callouts a request dispatched.
func callouts(host filterHost, id uint32) []proxytest.HttpCalloutAttribute {
	return host.GetCalloutAttributesFromContext(id)
}

// onlyCallout returns the request's single callout.
func onlyCallout(t *testing.T, host filterHost, id uint32) proxytest.HttpCalloutAttribute {
	t.Helper()
	cs := callouts(host, id)
	if len(cs) != 1 {
		t.Fatalf("request %d dispatched %d callouts, want 1", id, len(cs))
	}
	return cs[0]
}

func allowHeaders() [][2]string {
	return [][2]string{
		{":status", "200"},
		{"content-type", "application/json"},
		{"RateLimit-Policy", `"per-key";q=100;w=60`},
		{"RateLimit", `"per-key";r=42;t=17`},
		{"X-RateLimit-Limit", "100"},
		{"X-RateLimit-Remaining", "42"},
		{"X-RateLimit-Reset", "17"},
	}
}

const allowBody = `{"allowed":true,"domain":"public-api","rule":"per-key","limit":100,"remaining":42,"reset_after_ms":17000,"retry_after_ms":0,"delay_ms":0,"degraded":false}`

func denyHeaders() [][2]string {
	return [][2]string{
		{":status", "429"},
		{"content-type", "application/json"},
		{"RateLimit-Policy", `"per-key";q=100;w=60`},
		{"RateLimit", `"per-key";r=0;t=17`},
		{"X-RateLimit-Limit", "100"},
		{"X-RateLimit-Remaining", "0"},
		{"X-RateLimit-Reset", "17"},
		{"Retry-After", "17"},
	}
}

const denyBody = `{"allowed":false,"domain":"public-api","rule":"per-key","limit":100,"remaining":0,"reset_after_ms":17000,"retry_after_ms":16500,"delay_ms":0,"degraded":false}`

// answer answers a request's only callout.
func answer(t *testing.T, host filterHost, id uint32, headers [][2]string, body string) {
	t.Helper()
	c := onlyCallout(t, host, id)
	host.CallOnHttpCallResponse(c.CalloutID, headers, nil, []byte(body))
}

func counter(t *testing.T, host filterHost, name string) uint64 {
	t.Helper()
	v, err := host.GetCounterMetric(name)
	if err != nil {
		t.Fatalf("GetCounterMetric(%q): %v", name, err)
	}
	return v
}

// wantCounters checks the named counters; counters not named must be zero.
func wantCounters(t *testing.T, host filterHost, want map[string]uint64) {
	t.Helper()
	for _, name := range []string{"allowed", "denied", "unavailable", "shaped", "callout_failures", "deny_cache_hits", "failure_mode_activations", "rejected"} {
		if got := counter(t, host, "tollgate."+name); got != want[name] {
			t.Errorf("counter tollgate.%s = %d, want %d", name, got, want[name])
		}
	}
}

// count returns how many headers are named name.
func count(headers [][2]string, name string) int {
	n := 0
	for _, h := range headers {
		if strings.EqualFold(h[0], name) {
			n++
		}
	}
	return n
}

func get(headers [][2]string, name string) string {
	v, _ := headerValue(headers, name)
	return v
}

func TestAllowedAddsHeadersOnce(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, _ := startFilter(t, b, cfg(""))
		id, action := request(host, "k1", "/search?q=tea")
		if action != types.ActionPause {
			t.Fatalf("OnHttpRequestHeaders = %v, want Pause while the callout is out", action)
		}

		c := onlyCallout(t, host, id)
		if c.Upstream != "tollgate_decision" {
			t.Errorf("callout cluster = %q, want tollgate_decision", c.Upstream)
		}
		for name, want := range map[string]string{":method": "POST", ":path": "/v1/check", ":authority": "tollgate-decision", "content-type": "application/json"} {
			if got := get(c.Headers, name); got != want {
				t.Errorf("callout header %s = %q, want %q", name, got, want)
			}
		}
		var body map[string]any
		if err := json.Unmarshal(c.Body, &body); err != nil {
			t.Fatalf("callout body %s is not JSON: %v", c.Body, err)
		}
		wantBody := map[string]any{"domain": "public-api", "attributes": map[string]any{"api_key": "k1", "path": "/search"}, "cost": float64(1)}
		if !reflect.DeepEqual(body, wantBody) {
			t.Errorf("callout body = %v, want %v", body, wantBody)
		}

		host.CallOnHttpCallResponse(c.CalloutID, allowHeaders(), nil, []byte(allowBody))
		if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
			t.Fatalf("after a 200 the stream action = %v, want Continue", got)
		}
		if lr := host.GetSentLocalResponse(id); lr != nil {
			t.Fatalf("after a 200 a local %d response was sent", lr.StatusCode)
		}

		upstream := [][2]string{{":status", "200"}, {"content-type", "text/plain"}}
		host.CallOnResponseHeaders(id, upstream, false)
		// A second pass (as after a 100-continue, or a retry) must not add them again.
		host.CallOnResponseHeaders(id, host.GetCurrentResponseHeaders(id), false)
		got := host.GetCurrentResponseHeaders(id)
		for _, h := range allowHeaders()[2:] {
			if n := count(got, h[0]); n != 1 {
				t.Errorf("response has %d %s headers, want 1: %v", n, h[0], got)
			}
			if v := get(got, h[0]); v != h[1] {
				t.Errorf("response header %s = %q, want %q", h[0], v, h[1])
			}
		}
		host.CompleteHttpContext(id)
		wantCounters(t, host, map[string]uint64{"allowed": 1})
	})
}

func TestDeniedRepliesLocally(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, _ := startFilter(t, b, cfg(""))
		id, _ := request(host, "k1", "/search")
		answer(t, host, id, denyHeaders(), denyBody)

		lr := host.GetSentLocalResponse(id)
		if lr == nil {
			t.Fatal("no local response after a 429 from the service")
		}
		if lr.StatusCode != 429 {
			t.Errorf("local response status = %d, want 429", lr.StatusCode)
		}
		for name, want := range map[string]string{
			"retry-after":           "17",
			"ratelimit":             `"per-key";r=0;t=17`,
			"ratelimit-policy":      `"per-key";q=100;w=60`,
			"x-ratelimit-remaining": "0",
			"content-type":          "application/json",
		} {
			if got := get(lr.Headers, name); got != want {
				t.Errorf("local response header %s = %q, want %q", name, got, want)
			}
		}
		var body map[string]any
		if err := json.Unmarshal(lr.Data, &body); err != nil {
			t.Fatalf("local response body %s is not JSON: %v", lr.Data, err)
		}
		if body["rule"] != "per-key" || body["retry_after_ms"] != float64(16500) || body["allowed"] != false {
			t.Errorf("local response body = %s, want rule per-key, retry_after_ms 16500, allowed false", lr.Data)
		}
		if got := host.GetCurrentHttpStreamAction(id); got != types.ActionPause {
			t.Errorf("after a local reply the stream action = %v, want Pause (never resumed)", got)
		}

		// The local reply passes through OnHttpResponseHeaders: nothing may be added.
		host.CallOnResponseHeaders(id, lr.Headers, true)
		if got := host.GetCurrentResponseHeaders(id); !reflect.DeepEqual(got, lr.Headers) {
			t.Errorf("the local reply's headers became %v, want them unchanged %v", got, lr.Headers)
		}
		wantCounters(t, host, map[string]uint64{"denied": 1})
	})
}

func TestDenyCache(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		t.Run("second request makes no callout", func(t *testing.T) {
			host, clock := startFilter(t, b, cfg(""))
			id, _ := request(host, "k1", "/search")
			answer(t, host, id, denyHeaders(), denyBody)

			clock.Advance(5 * time.Second)
			id2, action := request(host, "k1", "/search")
			if n := len(callouts(host, id2)); n != 0 {
				t.Fatalf("a cached denial dispatched %d callouts, want 0", n)
			}
			if action != types.ActionPause {
				t.Errorf("OnHttpRequestHeaders = %v, want Pause after a local reply", action)
			}
			lr := host.GetSentLocalResponse(id2)
			if lr == nil || lr.StatusCode != 429 {
				t.Fatalf("cached denial sent %+v, want a local 429", lr)
			}
			// 16.5 s retry, 5 s later: 11.5 s, rounded up.
			for name, want := range map[string]string{
				"retry-after":       "12",
				"ratelimit":         `"per-key";r=0;t=12`,
				"ratelimit-policy":  `"per-key";q=100;w=60`,
				"x-ratelimit-reset": "12",
			} {
				if got := get(lr.Headers, name); got != want {
					t.Errorf("cached 429 header %s = %q, want %q", name, got, want)
				}
			}
			host.CallOnResponseHeaders(id2, lr.Headers, true)
			if got := host.GetCurrentResponseHeaders(id2); count(got, "ratelimit") != 1 {
				t.Errorf("cached 429 passed OnHttpResponseHeaders with %d RateLimit headers, want 1", count(got, "ratelimit"))
			}

			// Another client, and the same client on another path, still ask.
			for _, r := range [][2]string{{"k2", "/search"}, {"k1", "/other"}} {
				id, _ := request(host, r[0], r[1])
				if n := len(callouts(host, id)); n != 1 {
					t.Errorf("request %v dispatched %d callouts, want 1", r, n)
				}
			}

			// After the retry time the client asks again.
			clock.Advance(11500 * time.Millisecond)
			id3, _ := request(host, "k1", "/search")
			if n := len(callouts(host, id3)); n != 1 {
				t.Errorf("after the retry time the request dispatched %d callouts, want 1", n)
			}
			wantCounters(t, host, map[string]uint64{"denied": 2, "deny_cache_hits": 1})
		})

		t.Run("key narrows the identity", func(t *testing.T) {
			host, _ := startFilter(t, b, cfg(`"deny_cache": {"key": ["api_key"], "max_entries": 64}`))
			id, _ := request(host, "k1", "/search")
			answer(t, host, id, denyHeaders(), denyBody)
			id2, _ := request(host, "k1", "/other")
			if n := len(callouts(host, id2)); n != 0 {
				t.Errorf("with key [api_key] another path of a denied key dispatched %d callouts, want 0", n)
			}
			// A request without the key attribute never uses the cache.
			id3, _ := request(host, "", "/search")
			if n := len(callouts(host, id3)); n != 1 {
				t.Errorf("a request without api_key dispatched %d callouts, want 1", n)
			}
		})

		t.Run("disabled", func(t *testing.T) {
			host, _ := startFilter(t, b, cfg(`"deny_cache": {"enabled": false}`))
			id, _ := request(host, "k1", "/search")
			answer(t, host, id, denyHeaders(), denyBody)
			id2, _ := request(host, "k1", "/search")
			if n := len(callouts(host, id2)); n != 1 {
				t.Errorf("with the deny cache off the second request dispatched %d callouts, want 1", n)
			}
			wantCounters(t, host, map[string]uint64{"denied": 1})
		})

		t.Run("slot collision replaces the entry", func(t *testing.T) {
			host, _ := startFilter(t, b, cfg(`"deny_cache": {"max_entries": 1}`))
			id, _ := request(host, "k1", "/search")
			answer(t, host, id, denyHeaders(), denyBody)
			id2, _ := request(host, "k2", "/search")
			answer(t, host, id2, denyHeaders(), denyBody)
			// One slot: k2's denial replaced k1's, so k1 asks again and k2 does not.
			id3, _ := request(host, "k1", "/search")
			if n := len(callouts(host, id3)); n != 1 {
				t.Errorf("k1 after its slot was taken dispatched %d callouts, want 1", n)
			}
			id4, _ := request(host, "k2", "/search")
			if n := len(callouts(host, id4)); n != 0 {
				t.Errorf("k2 dispatched %d callouts, want 0 (cached)", n)
			}
		})
	})
}

// calloutFailures are the ways a callout fails: Envoy's own 503 (no healthy
// upstream, connection refused), its 504 (the callout's timeout), a response without
// headers (a reset), and answers of the service that are neither 200, 429 nor its 503
// verdict — a 503 whose body is not {"reason":"unavailable",…} included.
var calloutFailures = []struct {
	name    string
	headers [][2]string
	body    string
}{
	{"503 unavailable", [][2]string{{":status", "503"}}, "no healthy upstream"},
	{"503 connect error", [][2]string{{":status", "503"}, {"content-type", "text/plain"}}, "upstream connect error or disconnect/reset before headers. reset reason: connection failure"},
	{"503 JSON without reason", [][2]string{{":status", "503"}, {"content-type", "application/json"}}, `{"error":"store unavailable: dial tcp 127.0.0.1:6379: connect: connection refused"}`},
	{"503 JSON string", [][2]string{{":status", "503"}}, `"unavailable"`},
	{"500 with a verdict body", [][2]string{{":status", "500"}, {"retry-after", "1"}}, unavailableBody},
	{"504 timeout", [][2]string{{":status", "504"}}, "upstream request timeout"},
	{"no headers", nil, ""},
	{"400 bad request", [][2]string{{":status", "400"}}, `{"error":"domain is required","field":"domain"}`},
	{"500", [][2]string{{":status", "500"}}, ""},
}

func TestFailureModes(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		local := `"local_limits": [{"name": "local-per-key", "key": ["api_key"], "algorithm": "fixed_window", "rate": "1/min"}]`
		for _, f := range calloutFailures {
			t.Run(f.name+"/open", func(t *testing.T) {
				host, _ := startFilter(t, b, cfg(`"failure_mode": "open"`))
				id, _ := request(host, "k1", "/search")
				answer(t, host, id, f.headers, f.body)
				if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
					t.Errorf("fail open: stream action = %v, want Continue", got)
				}
				if lr := host.GetSentLocalResponse(id); lr != nil {
					t.Errorf("fail open: sent a local %d", lr.StatusCode)
				}
				host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
				if got := host.GetCurrentResponseHeaders(id); count(got, "ratelimit") != 0 {
					t.Errorf("fail open: response headers %v, want no RateLimit", got)
				}
				wantCounters(t, host, map[string]uint64{"allowed": 1, "callout_failures": 1, "failure_mode_activations": 1})
			})
			t.Run(f.name+"/closed", func(t *testing.T) {
				host, _ := startFilter(t, b, cfg(`"failure_mode": "closed"`))
				id, _ := request(host, "k1", "/search")
				answer(t, host, id, f.headers, f.body)
				lr := host.GetSentLocalResponse(id)
				if lr == nil || lr.StatusCode != 503 {
					t.Fatalf("fail closed: local response %+v, want 503", lr)
				}
				if got := get(lr.Headers, "retry-after"); got != "1" {
					t.Errorf("fail closed: Retry-After = %q, want 1", got)
				}
				if !json.Valid(lr.Data) {
					t.Errorf("fail closed: body %q is not JSON", lr.Data)
				}
				wantCounters(t, host, map[string]uint64{"callout_failures": 1, "failure_mode_activations": 1})
			})
			t.Run(f.name+"/local", func(t *testing.T) {
				host, _ := startFilter(t, b, cfg(`"failure_mode": "local", `+local))
				id, _ := request(host, "k1", "/search")
				answer(t, host, id, f.headers, f.body)
				if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
					t.Fatalf("fail local, first request: stream action = %v, want Continue", got)
				}
				id2, _ := request(host, "k1", "/search")
				answer(t, host, id2, f.headers, f.body)
				lr := host.GetSentLocalResponse(id2)
				if lr == nil || lr.StatusCode != 429 {
					t.Fatalf("fail local, second request over 1/min: local response %+v, want 429", lr)
				}
				wantCounters(t, host, map[string]uint64{"allowed": 1, "denied": 1, "callout_failures": 2, "failure_mode_activations": 2})
			})
		}
	})
}

// unavailableBody is the decision service's answer when its store is down and its
// policy fails closed; it comes with status 503 and Retry-After: 1.
const unavailableBody = `{"allowed":false,"domain":"public-api","reason":"unavailable","limit":0,"remaining":0,"reset_after_ms":0,"retry_after_ms":1000,"delay_ms":0,"degraded":true,"limits":[]}`

// TestServiceUnavailableVerdict: a 503 whose body is the service's "unavailable"
// verdict is the service's decision to fail closed. Whatever the filter's own failure
// mode, the filter replies 503 with the service's Retry-After, consults no local
// limit and caches nothing.
func TestServiceUnavailableVerdict(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		local := `"local_limits": [{"name": "local-per-key", "key": ["api_key"], "algorithm": "fixed_window", "rate": "100/min"}]`
		tests := []struct {
			name           string
			config         string
			headers        [][2]string
			body           string
			wantRetryAfter string
			wantRetryMs    float64
		}{
			{"filter open", `"failure_mode": "open"`,
				[][2]string{{":status", "503"}, {"content-type", "application/json"}, {"Retry-After", "1"}}, unavailableBody, "1", 1000},
			{"filter closed", `"failure_mode": "closed"`,
				[][2]string{{":status", "503"}, {"Retry-After", "1"}}, unavailableBody, "1", 1000},
			{"filter local", `"failure_mode": "local", ` + local,
				[][2]string{{":status", "503"}, {"Retry-After", "1"}}, unavailableBody, "1", 1000},
			{"service retry of 7 s", "",
				[][2]string{{":status", "503"}, {"retry-after", "7"}}, `{"reason":"unavailable","retry_after_ms":7000}`, "7", 7000},
			{"retry_after_ms without Retry-After", "",
				[][2]string{{":status", "503"}}, `{"reason":"unavailable","retry_after_ms":2500}`, "3", 2500},
			{"neither: 1 second", "",
				[][2]string{{":status", "503"}, {"retry-after", "soon"}}, `{"allowed":false,"reason":"unavailable"}`, "1", 1000},
		}
		for _, tc := range tests {
			t.Run(tc.name, func(t *testing.T) {
				host, _ := startFilter(t, b, cfg(tc.config))
				for i := 1; i <= 2; i++ {
					id, _ := request(host, "k1", "/search")
					// The second request asks again: the verdict is not in the deny cache.
					answer(t, host, id, tc.headers, tc.body)
					lr := host.GetSentLocalResponse(id)
					if lr == nil || lr.StatusCode != 503 {
						t.Fatalf("request %d: local response %+v, want 503", i, lr)
					}
					if got := get(lr.Headers, "retry-after"); got != tc.wantRetryAfter {
						t.Errorf("request %d: Retry-After = %q, want %q", i, got, tc.wantRetryAfter)
					}
					if got := get(lr.Headers, "content-type"); got != "application/json" {
						t.Errorf("request %d: Content-Type = %q, want application/json", i, got)
					}
					var body map[string]any
					if err := json.Unmarshal(lr.Data, &body); err != nil {
						t.Fatalf("request %d: body %s is not JSON: %v", i, lr.Data, err)
					}
					want := map[string]any{"allowed": false, "error": "rate limiter unavailable", "domain": "public-api", "retry_after_ms": tc.wantRetryMs}
					if !reflect.DeepEqual(body, want) {
						t.Errorf("request %d: body = %v, want %v", i, body, want)
					}
					host.CallOnResponseHeaders(id, lr.Headers, true)
					if got := host.GetCurrentResponseHeaders(id); !reflect.DeepEqual(got, lr.Headers) {
						t.Errorf("request %d: the local reply's headers became %v, want them unchanged", i, got)
					}
				}
				wantCounters(t, host, map[string]uint64{"unavailable": 2})
			})
		}
	})
}

func TestLocalFallbackLimits(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		host, clock := startFilter(t, b, cfg(`"failure_mode": "local",
		"local_limits": [
			{"name": "local-per-key", "key": ["api_key"], "algorithm": "sliding_log", "rate": "2/min"},
			{"name": "local-global", "key": [], "algorithm": "token_bucket", "rate": "100/s"}
		]`))
		fail := func(apiKey string) uint32 {
			id, _ := request(host, apiKey, "/search")
			answer(t, host, id, [][2]string{{":status", "503"}}, "")
			return id
		}
		for i, want := range []string{"1", "0"} {
			id := fail("k1")
			if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
				t.Fatalf("request %d: stream action = %v, want Continue", i+1, got)
			}
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			got := host.GetCurrentResponseHeaders(id)
			if r := get(got, "x-ratelimit-remaining"); r != want {
				t.Errorf("request %d: X-RateLimit-Remaining = %q, want %q (the tighter local-per-key)", i+1, r, want)
			}
			if p := get(got, "ratelimit-policy"); p != `"local-per-key";q=2;w=60, "local-global";q=100;w=1` {
				t.Errorf("request %d: RateLimit-Policy = %q, want both local limits", i+1, p)
			}
		}
		clock.Advance(20 * time.Second)
		id := fail("k1")
		lr := host.GetSentLocalResponse(id)
		if lr == nil || lr.StatusCode != 429 {
			t.Fatalf("third request within the minute: local response %+v, want 429", lr)
		}
		if got := get(lr.Headers, "retry-after"); got != "40" {
			t.Errorf("third request: Retry-After = %q, want 40 (the first entry leaves the log 60 s after it came)", got)
		}
		// Another key has its own log; a request without api_key meets only the global limit.
		for _, k := range []string{"k2", ""} {
			if id := fail(k); host.GetCurrentHttpStreamAction(id) != types.ActionContinue {
				t.Errorf("request with api_key %q was not let through", k)
			}
		}
		clock.Advance(40 * time.Second)
		if id := fail("k1"); host.GetCurrentHttpStreamAction(id) != types.ActionContinue {
			t.Errorf("k1 after the window was not let through")
		}
	})
}

func TestShaping(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		// shaped answers a callout as the service answers a shaped request: the delay
		// in delay_ms, which the filter reads, and in X-Tollgate-Delay-Ms.
		shaped := func(t *testing.T, host filterHost, id uint32, delay string) {
			t.Helper()
			answer(t, host, id, append(allowHeaders(), [2]string{"X-Tollgate-Delay-Ms", delay}),
				strings.Replace(allowBody, `"delay_ms":0`, `"delay_ms":`+delay, 1))
		}

		t.Run("resumes after the delay", func(t *testing.T) {
			host, clock := startFilter(t, b, cfg(`"tick_ms": 100`))
			if p := host.GetTickPeriod(); p != 0 {
				t.Fatalf("tick period before any shaping = %d, want 0 (no idle ticks)", p)
			}
			id, _ := request(host, "k1", "/upload")
			shaped(t, host, id, "250")
			if got := host.GetCurrentHttpStreamAction(id); got != types.ActionPause {
				t.Fatalf("a shaped request's action = %v, want Pause until its delay passed", got)
			}
			if p := host.GetTickPeriod(); p != 100 {
				t.Fatalf("tick period while a request is held = %d, want 100", p)
			}
			for tick := 1; tick <= 2; tick++ {
				clock.Advance(100 * time.Millisecond)
				host.Tick()
				if got := host.GetCurrentHttpStreamAction(id); got != types.ActionPause {
					t.Fatalf("after tick %d (%d ms of 250) the action = %v, want Pause", tick, 100*tick, got)
				}
			}
			clock.Advance(100 * time.Millisecond)
			host.Tick()
			if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
				t.Fatalf("after tick 3 (300 ms of 250) the action = %v, want Continue", got)
			}
			if p := host.GetTickPeriod(); p != 0 {
				t.Errorf("tick period with nothing held = %d, want 0", p)
			}
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			if n := count(host.GetCurrentResponseHeaders(id), "ratelimit"); n != 1 {
				t.Errorf("shaped response has %d RateLimit headers, want 1", n)
			}
			wantCounters(t, host, map[string]uint64{"allowed": 1, "shaped": 1})
		})

		t.Run("delay from the body", func(t *testing.T) {
			host, clock := startFilter(t, b, cfg(`"tick_ms": 50`))
			id, _ := request(host, "k1", "/upload")
			answer(t, host, id, allowHeaders(), strings.Replace(allowBody, `"delay_ms":0`, `"delay_ms":120`, 1))
			clock.Advance(100 * time.Millisecond)
			host.Tick()
			if got := host.GetCurrentHttpStreamAction(id); got != types.ActionPause {
				t.Fatalf("after 100 ms of 120 the action = %v, want Pause", got)
			}
			clock.Advance(50 * time.Millisecond)
			host.Tick()
			if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
				t.Fatalf("after 150 ms of 120 the action = %v, want Continue", got)
			}
		})

		t.Run("requests leave in order of their delay", func(t *testing.T) {
			host, clock := startFilter(t, b, cfg(`"tick_ms": 10`))
			a, _ := request(host, "k1", "/a")
			b, _ := request(host, "k1", "/b")
			shaped(t, host, a, "40")
			shaped(t, host, b, "20")
			clock.Advance(25 * time.Millisecond)
			host.Tick()
			if host.GetCurrentHttpStreamAction(a) != types.ActionPause || host.GetCurrentHttpStreamAction(b) != types.ActionContinue {
				t.Fatalf("at 25 ms: a %v, b %v; want a held, b resumed", host.GetCurrentHttpStreamAction(a), host.GetCurrentHttpStreamAction(b))
			}
			clock.Advance(20 * time.Millisecond)
			host.Tick()
			if got := host.GetCurrentHttpStreamAction(a); got != types.ActionContinue {
				t.Fatalf("at 45 ms: a %v, want resumed", got)
			}
		})

		t.Run("a stream that ends while held is dropped", func(t *testing.T) {
			host, clock := startFilter(t, b, cfg(`"tick_ms": 10`))
			id, _ := request(host, "k1", "/upload")
			shaped(t, host, id, "30")
			host.CompleteHttpContext(id)
			clock.Advance(50 * time.Millisecond)
			host.Tick() // must not resume a deleted stream
			if p := host.GetTickPeriod(); p != 0 {
				t.Errorf("tick period after the only held stream ended = %d, want 0", p)
			}
		})

		t.Run("too long a delay is a 429", func(t *testing.T) {
			host, _ := startFilter(t, b, cfg(`"max_delay_ms": 1000`))
			id, _ := request(host, "k1", "/upload")
			shaped(t, host, id, "2500")
			lr := host.GetSentLocalResponse(id)
			if lr == nil || lr.StatusCode != 429 || get(lr.Headers, "retry-after") != "3" {
				t.Fatalf("delay 2500 ms over max 1000: local response %+v, want 429 with Retry-After 3", lr)
			}
			wantCounters(t, host, map[string]uint64{"denied": 1})
		})

		t.Run("max held requests", func(t *testing.T) {
			host, _ := startFilter(t, b, cfg(`"max_held_requests": 1`))
			a, _ := request(host, "k1", "/a")
			b, _ := request(host, "k1", "/b")
			shaped(t, host, a, "100")
			shaped(t, host, b, "100")
			if lr := host.GetSentLocalResponse(b); lr == nil || lr.StatusCode != 429 {
				t.Fatalf("second held request over max_held_requests 1: local response %+v, want 429", lr)
			}
			wantCounters(t, host, map[string]uint64{"allowed": 1, "shaped": 1, "denied": 1})
		})
	})
}

// TestCalloutIDsRepeat answers callouts out of order while the host hands out a callout
// ID again once its answer arrived (Envoy repeats an ID only after its counter wraps;
// repeating at once is the harsher test): each answer must reach its own request.
func TestCalloutIDsRepeat(t *testing.T) {
	forBackends(t, func(t *testing.T, be backend) {
		host, _ := startFilter(t, be, cfg(`"deny_cache": {"enabled": false}`))
		a, _ := request(host, "k1", "/a")
		b, _ := request(host, "k2", "/b")
		idA, idB := onlyCallout(t, host, a).CalloutID, onlyCallout(t, host, b).CalloutID
		host.CallOnHttpCallResponse(idB, denyHeaders(), nil, []byte(denyBody))
		c, _ := request(host, "k3", "/c")
		idC := onlyCallout(t, host, c).CalloutID
		if idC != idB {
			t.Logf("the emulator did not reuse callout ID %d (got %d); the test still checks routing", idB, idC)
		}
		host.CallOnHttpCallResponse(idA, allowHeaders(), nil, []byte(allowBody))
		host.CallOnHttpCallResponse(idC, denyHeaders(), nil, []byte(denyBody))

		if got := host.GetCurrentHttpStreamAction(a); got != types.ActionContinue || host.GetSentLocalResponse(a) != nil {
			t.Errorf("request a (allowed) action %v, local response %+v; want Continue and none", got, host.GetSentLocalResponse(a))
		}
		for _, id := range []uint32{b, c} {
			if lr := host.GetSentLocalResponse(id); lr == nil || lr.StatusCode != 429 {
				t.Errorf("request %d (denied): local response %+v, want 429", id, lr)
			}
		}
	})
}

func TestAttributes(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		config := `{
		"cluster": "tollgate_decision", "domain": "public-api",
		"attributes": [
			{"name": "api_key", "from": "header", "header": "X-Api-Key"},
			{"name": "remote_address", "from": "source.address"},
			{"name": "path", "from": "path"},
			{"name": "route", "from": "path_with_query"},
			{"name": "method", "from": "method"},
			{"name": "tenant", "from": "header", "header": "x-tenant"}
		],
		"max_attribute_bytes": 16`
		send := func(t *testing.T, host filterHost, headers [][2]string) (uint32, map[string]any) {
			t.Helper()
			id := host.InitializeHttpContext()
			host.CallOnRequestHeaders(id, headers, true)
			cs := callouts(host, id)
			if len(cs) != 1 {
				return id, nil
			}
			var body struct {
				Attributes map[string]any `json:"attributes"`
			}
			if err := json.Unmarshal(cs[0].Body, &body); err != nil {
				t.Fatalf("callout body %q is not JSON: %v", cs[0].Body, err)
			}
			return id, body.Attributes
		}

		t.Run("sources and truncation", func(t *testing.T) {
			host, _ := startFilter(t, b, config+"}")
			_, attrs := send(t, host, [][2]string{
				{":method", "DELETE"}, {":path", "/v1/items/7?force=1"},
				{"x-api-key", "k\"1\n\\é\xff"},
				{"x-tenant", "aaaaaaaaaaaaaaaé-tail"}, // é straddles byte 16
			})
			want := map[string]any{
				"api_key":        "k\"1\n\\é\ufffd",
				"remote_address": "192.0.2.7",
				"path":           "/v1/items/7",
				"route":          "/v1/items/7?forc",
				"method":         "DELETE",
				"tenant":         "aaaaaaaaaaaaaaa",
			}
			if !reflect.DeepEqual(attrs, want) {
				t.Errorf("attributes = %q, want %q", attrs, want)
			}
			// A missing header is left out.
			_, attrs = send(t, host, [][2]string{{":method", "GET"}, {":path", "/"}})
			if _, ok := attrs["api_key"]; ok || attrs["path"] != "/" {
				t.Errorf("attributes without x-api-key = %v, want no api_key", attrs)
			}
		})

		t.Run("IPv6 source address", func(t *testing.T) {
			clock := &fakeClock{t: time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)}
			host := newFilterFrom(t, b, config+"}", clock.Now, "[2001:db8::1]:443")
			if st := host.StartPlugin(); st != types.OnPluginStartStatusOK {
				t.Fatalf("StartPlugin() = %v, want OK; critical logs: %q", st, host.GetCriticalLogs())
			}
			_, attrs := send(t, host, [][2]string{{":method", "GET"}, {":path", "/"}})
			if got := attrs["remote_address"]; got != "2001:db8::1" {
				t.Errorf("remote_address from source.address [2001:db8::1]:443 = %v, want 2001:db8::1", got)
			}
		})

		t.Run("body too large once escaped", func(t *testing.T) {
			// 64 attributes of 1024 control characters each: every byte escapes to six.
			var attrs []string
			headers := [][2]string{{":method", "GET"}, {":path", "/"}}
			for i := range bounds.MaxAttributes {
				attrs = append(attrs, fmt.Sprintf(`{"name": "h%d", "from": "header", "header": "x-h%d"}`, i, i))
				headers = append(headers, [2]string{fmt.Sprintf("x-h%d", i), strings.Repeat("\x01", bounds.MaxValueLength)})
			}
			host, _ := startFilter(t, b, `{"cluster": "tollgate_decision", "domain": "d", "max_attribute_bytes": 1024, "attributes": [`+strings.Join(attrs, ",")+`]}`)
			id, sent := send(t, host, headers)
			if sent != nil {
				t.Fatalf("a check body over %d bytes was sent", bounds.MaxBody)
			}
			lr := host.GetSentLocalResponse(id)
			if lr == nil || lr.StatusCode != 400 || !strings.Contains(string(lr.Data), `"field":"attributes"`) {
				t.Fatalf("local response %+v, want 400 naming attributes", lr)
			}
			wantCounters(t, host, map[string]uint64{"rejected": 1})
		})

		t.Run("oversize rejected", func(t *testing.T) {
			host, _ := startFilter(t, b, config+`, "oversize": "reject"}`)
			id, attrs := send(t, host, [][2]string{{":method", "GET"}, {":path", "/"}, {"x-api-key", strings.Repeat("k", 17)}})
			if attrs != nil {
				t.Fatalf("an oversize attribute was sent: %v", attrs)
			}
			lr := host.GetSentLocalResponse(id)
			if lr == nil || lr.StatusCode != 400 || !strings.Contains(string(lr.Data), `"field":"api_key"`) {
				t.Fatalf("oversize api_key: local response %+v, want 400 naming api_key", lr)
			}
			wantCounters(t, host, map[string]uint64{"rejected": 1})
		})
	})
}

func TestInvalidConfigurationFailsStart(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		for _, tc := range invalidConfigs {
			t.Run(tc.field, func(t *testing.T) {
				host := newFilter(t, b, tc.config, time.Now)
				if st := host.StartPlugin(); st != types.OnPluginStartStatusFailed {
					t.Fatalf("StartPlugin(%s) = %v, want Failed", tc.config, st)
				}
				logs := strings.Join(host.GetCriticalLogs(), "\n")
				if !strings.Contains(logs, tc.field) {
					t.Errorf("critical log %q does not name the field %q", logs, tc.field)
				}
			})
		}
	})
}
