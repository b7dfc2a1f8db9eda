//go:build !wasip1

package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"

	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/wasmfilter/internal/wasmhost"
)

// decisionService runs the real decision service (policy → engine → HTTP handler) on a
// real redis-server, and returns its URL and the Redis process.
func decisionService(t *testing.T, policyYAML string) (*httptest.Server, *redistest.Server) {
	t.Helper()
	h, redis := decisionHandler(t, policyYAML)
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, redis
}

// decisionHandler is the decision service's HTTP handler on a real redis-server.
func decisionHandler(t *testing.T, policyYAML string) (http.Handler, *redistest.Server) {
	t.Helper()
	redis := redistest.StartServer(t)
	store, err := redisstore.New(redis.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	pol, err := policy.Parse([]byte(policyYAML))
	if err != nil {
		t.Fatalf("policy.Parse: %v", err)
	}
	eng, err := engine.New(engine.Config{Policy: pol, Store: store})
	if err != nil {
		t.Fatal(err)
	}
	return decision.NewHandler(eng, decision.Options{}), redis
}

// envoyCallouts plays Envoy's part for the filter's callouts: it sends each one to the
// decision service over real HTTP and hands the answer back to the filter. Like Envoy,
// it answers 504 itself when the callout times out and 503 when it cannot connect.
type envoyCallouts struct {
	t       *testing.T
	host    filterHost
	url     string
	timeout time.Duration
	// last and lastBody are the decision service's last answer, as the filter
	// received it.
	last     [][2]string
	lastBody []byte
}

// forward answers the request's newest callout and reports whether there was one.
func (e *envoyCallouts) forward(contextID uint32) bool {
	e.t.Helper()
	cs := e.host.GetCalloutAttributesFromContext(contextID)
	if len(cs) == 0 {
		return false
	}
	c := cs[len(cs)-1]
	e.last, e.lastBody = wasmhost.Forward(http.DefaultClient, e.url, wasmhost.Callout{Headers: c.Headers, Body: c.Body, Timeout: e.timeout})
	e.host.CallOnHttpCallResponse(c.CalloutID, e.last, nil, e.lastBody)
	return true
}

// e2ePolicy's timeout is generous: these tests are about answers, not time, and a
// loaded CI machine must not turn a slow Redis call into the failure mode.
const e2ePolicy = `
domain: public-api
failure: {mode: open, timeout: 2s}
rules:
  - name: per-key
    match: {api_key: "*"}
    limits:
      - {algorithm: sliding_log, rate: 5/min}
`

// TestEndToEnd runs the filter on the host emulator against the real decision service
// on a real Redis: with 5 requests a minute per key, the sixth request of a key is
// answered 429 by the filter with the service's Retry-After, and the seventh is
// answered from the deny cache without a callout.
func TestEndToEnd(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, e2ePolicy)
		host, _ := startFilter(t, b, cfg(""))
		envoy := &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}

		for i := 1; i <= 5; i++ {
			id, action := request(host, "k1", "/search")
			if action != types.ActionPause || !envoy.forward(id) {
				t.Fatalf("request %d: action %v and no callout; want a paused request and a callout", i, action)
			}
			if status := get(envoy.last, ":status"); status != "200" {
				t.Fatalf("request %d: the decision service answered %s, want 200", i, status)
			}
			if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
				t.Fatalf("request %d: stream action %v, want Continue", i, got)
			}
			host.CallOnResponseHeaders(id, [][2]string{{":status", "200"}}, false)
			resp := host.GetCurrentResponseHeaders(id)
			if got, want := get(resp, "x-ratelimit-remaining"), strconv.Itoa(5-i); got != want {
				t.Errorf("request %d: X-RateLimit-Remaining = %q, want %q", i, got, want)
			}
			if got := get(resp, "ratelimit-policy"); got != `"per-key";q=5;w=60` {
				t.Errorf("request %d: RateLimit-Policy = %q, want the service's", i, got)
			}
			if n := count(resp, "ratelimit"); n != 1 {
				t.Errorf("request %d: %d RateLimit headers, want 1", i, n)
			}
			host.CompleteHttpContext(id)
		}

		id, _ := request(host, "k1", "/search")
		if !envoy.forward(id) {
			t.Fatal("request 6 made no callout")
		}
		if status := get(envoy.last, ":status"); status != "429" {
			t.Fatalf("request 6: the decision service answered %s, want 429", status)
		}
		serviceRetry := get(envoy.last, "retry-after")
		if secs, err := strconv.Atoi(serviceRetry); err != nil || secs < 1 || secs > 60 {
			t.Fatalf("request 6: the service's Retry-After = %q, want 1 to 60 seconds", serviceRetry)
		}
		lr := host.GetSentLocalResponse(id)
		if lr == nil || lr.StatusCode != 429 {
			t.Fatalf("request 6: local response %+v, want 429", lr)
		}
		t.Logf("request 6: the service answered 429 with Retry-After %s; the filter replied %d with Retry-After %s", serviceRetry, lr.StatusCode, get(lr.Headers, "retry-after"))
		if got := get(lr.Headers, "retry-after"); got != serviceRetry {
			t.Errorf("request 6: Retry-After = %q, want the service's %q", got, serviceRetry)
		}
		for _, name := range []string{"ratelimit", "ratelimit-policy"} {
			if got, want := get(lr.Headers, name), get(envoy.last, name); got != want || got == "" {
				t.Errorf("request 6: %s = %q, want the service's %q", name, got, want)
			}
		}

		// The seventh asks nobody: the deny cache answers until the retry time.
		id, _ = request(host, "k1", "/search")
		if envoy.forward(id) {
			t.Errorf("request 7 made a callout; want the deny cache to answer")
		}
		lr = host.GetSentLocalResponse(id)
		if lr == nil || lr.StatusCode != 429 {
			t.Fatalf("request 7: local response %+v, want 429 from the deny cache", lr)
		}
		got, _ := strconv.Atoi(get(lr.Headers, "retry-after"))
		if limit, _ := strconv.Atoi(serviceRetry); got < 1 || got > limit {
			t.Errorf("request 7: Retry-After = %d, want 1 to %d", got, limit)
		}

		// Another key has its own limit.
		id, _ = request(host, "k2", "/search")
		envoy.forward(id)
		if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
			t.Errorf("k2: stream action %v, want Continue", got)
		}
		wantCounters(t, host, map[string]uint64{"allowed": 6, "denied": 2, "deny_cache_hits": 1})
	})
}

// TestEndToEndShaping sends requests faster than a leaky bucket drains: the service
// admits the second one with a delay, and the filter holds it until ticks have let
// that much time pass.
func TestEndToEndShaping(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		srv, _ := decisionService(t, `
domain: public-api
rules:
  - name: uploads
    match: {api_key: "*"}
    limits:
      - {algorithm: leaky_bucket, rate: 10/s, burst: 5}
`)
		host, clock := startFilter(t, b, cfg(`"tick_ms": 5`))
		envoy := &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}

		first, _ := request(host, "k1", "/upload")
		envoy.forward(first)
		if got := host.GetCurrentHttpStreamAction(first); got != types.ActionContinue {
			t.Fatalf("first request: stream action %v, want Continue (an empty bucket adds no delay)", got)
		}
		id, _ := request(host, "k1", "/upload")
		envoy.forward(id)
		delay, err := strconv.Atoi(get(envoy.last, "x-tollgate-delay-ms"))
		if err != nil || delay < 1 || delay > 100 {
			t.Fatalf("second request: the service's X-Tollgate-Delay-Ms = %q, want 1 to 100 (10/s)", get(envoy.last, "x-tollgate-delay-ms"))
		}
		clock.Advance(time.Duration(delay-1) * time.Millisecond)
		host.Tick()
		if got := host.GetCurrentHttpStreamAction(id); got != types.ActionPause {
			t.Fatalf("%d ms into a %d ms delay the action = %v, want Pause", delay-1, delay, got)
		}
		clock.Advance(time.Millisecond)
		host.Tick()
		if got := host.GetCurrentHttpStreamAction(id); got != types.ActionContinue {
			t.Fatalf("after the %d ms delay the action = %v, want Continue", delay, got)
		}
		wantCounters(t, host, map[string]uint64{"allowed": 2, "shaped": 1})
	})
}

// redisDownPolicy is e2ePolicy with the service's failure mode set to mode, and a
// short decision timeout.
func redisDownPolicy(mode string) string {
	return strings.Replace(e2ePolicy, "failure: {mode: open, timeout: 2s}", "failure: {mode: "+mode+", timeout: 50ms}", 1)
}

// TestEndToEndRedisDown stops Redis under the decision service. The service's policy
// decides what that means, not the filter's failure mode: a policy that fails closed
// answers 503 with an "unavailable" verdict, which the filter passes on as its own
// 503 without consulting its local limits; a policy that fails open answers 200
// (degraded), which passes even though the filter itself fails closed. Only when
// the service itself is gone, and Envoy answers the callout, does the filter's
// failure mode decide.
func TestEndToEndRedisDown(t *testing.T) {
	forBackends(t, func(t *testing.T, b backend) {
		t.Run("service fails closed", func(t *testing.T) {
			srv, redis := decisionService(t, redisDownPolicy("closed"))
			host, _ := startFilter(t, b, cfg(`"failure_mode": "local",
			"local_limits": [{"name": "local-per-key", "key": ["api_key"], "algorithm": "fixed_window", "rate": "2/min"}]`))
			envoy := &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}
			redis.Stop()

			for i := 1; i <= 3; i++ {
				id, _ := request(host, "k1", "/search")
				// Every request asks: the service's verdict is not cached.
				if !envoy.forward(id) {
					t.Fatalf("request %d made no callout", i)
				}
				if status := get(envoy.last, ":status"); status != "503" {
					t.Fatalf("request %d: the service answered %s with Redis down, want 503", i, status)
				}
				if !unavailableVerdict(parseAnswer(envoy.lastBody)) {
					t.Fatalf("request %d: the service's 503 body %s is not its unavailable verdict", i, envoy.lastBody)
				}
				lr := host.GetSentLocalResponse(id)
				if lr == nil || lr.StatusCode != 503 {
					t.Fatalf("request %d: local response %+v, want the filter's 503 (the service fails closed)", i, lr)
				}
				if got, want := get(lr.Headers, "retry-after"), get(envoy.last, "retry-after"); got != want || got != "1" {
					t.Errorf("request %d: Retry-After = %q, want the service's %q (1)", i, got, want)
				}
			}
			// The local 2/min limit would have let two through: it was not consulted.
			wantCounters(t, host, map[string]uint64{"unavailable": 3})

			// With the service itself gone, Envoy answers the callout 503 with a plain-text
			// body: a failed callout, decided by the filter's failure mode (local).
			srv.Close()
			id, _ := request(host, "k2", "/search")
			envoy.forward(id)
			if lr := host.GetSentLocalResponse(id); lr != nil || host.GetCurrentHttpStreamAction(id) != types.ActionContinue {
				t.Errorf("service down, k2: local response %+v, want it let through by the local limit", lr)
			}
			wantCounters(t, host, map[string]uint64{"unavailable": 3, "allowed": 1, "callout_failures": 1, "failure_mode_activations": 1})
		})

		t.Run("service fails open", func(t *testing.T) {
			srv, redis := decisionService(t, redisDownPolicy("open"))
			host, _ := startFilter(t, b, cfg(`"failure_mode": "closed"`))
			envoy := &envoyCallouts{t: t, host: host, url: srv.URL, timeout: 2 * time.Second}
			redis.Stop()

			for i := 1; i <= 3; i++ {
				id, _ := request(host, "k1", "/search")
				envoy.forward(id)
				if status := get(envoy.last, ":status"); status != "200" {
					t.Fatalf("request %d: the service answered %s with Redis down, want 200 (it fails open)", i, status)
				}
				var verdict struct{ Degraded bool }
				if err := json.Unmarshal(envoy.lastBody, &verdict); err != nil || !verdict.Degraded {
					t.Errorf("request %d: the service's body %s, want degraded true", i, envoy.lastBody)
				}
				if lr := host.GetSentLocalResponse(id); lr != nil || host.GetCurrentHttpStreamAction(id) != types.ActionContinue {
					t.Errorf("request %d: local response %+v, want the request passed on", i, lr)
				}
			}
			wantCounters(t, host, map[string]uint64{"allowed": 3})
		})
	})
}
