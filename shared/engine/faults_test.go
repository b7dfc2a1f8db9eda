package engine_test

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// faultPolicy is a one-rule policy with the given failure mode: 10 per hour per key
// in fixed windows (a test does not straddle a window's end unless it runs at the
// top of an hour), which local mode divides by 2 instances.
func faultPolicy(t *testing.T, mode string, breakerFailures int, openFor time.Duration) *policy.Policy {
	return faultPolicyTimeout(t, mode, breakerFailures, openFor, 2*time.Second)
}

// faultPolicyTimeout is faultPolicy with a decision timeout: the tests that are not
// about timeouts use 2s, so a loaded machine cannot turn a slow Redis call into the
// failure mode.
func faultPolicyTimeout(t *testing.T, mode string, breakerFailures int, openFor, timeout time.Duration) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(fmt.Appendf(nil, `
domain: test
failure: {mode: %s, timeout: %s, expected_instances: 2, breaker: {failures: %d, open_for: %s}}
rules:
  - name: per-key
    match: {api_key: "*"}
    limits:
      - {algorithm: fixed_window, rate: 10/h}
`, mode, timeout, breakerFailures, openFor))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

// counting wraps engine hooks to count store round trips and their failures.
type counting struct{ calls, failures, activations atomic.Int64 }

func (c *counting) hooks() engine.Hooks {
	return engine.Hooks{
		StoreCall: func(_ time.Duration, err error) {
			c.calls.Add(1)
			if err != nil {
				c.failures.Add(1)
			}
		},
		FailureMode: func(policy.FailureMode) { c.activations.Add(1) },
	}
}

// timeout is the decision timeout of the tests about timeouts, and margin how much longer a degraded
// decision may take: together they bound a hang, they do not measure speed.
const (
	timeout = 200 * time.Millisecond
	margin  = time.Second
)

func TestRedisKilledFailureModes(t *testing.T) {
	for _, mode := range []string{"open", "closed", "local"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.StartServer(t)
			store, err := redisstore.Open(redisstore.Config{URL: srv.URL()})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			var cnt counting
			const failures, openFor = 3, 700 * time.Millisecond
			// The local fallback's fixed window must not roll over while the test runs,
			// or it admits a second window's share: its clock starts one second into
			// an hour.
			t0, base := time.Now(), time.Now().Truncate(time.Hour).Add(time.Second)
			clock := func() time.Time { return base.Add(time.Since(t0)) }
			eng, err := engine.New(engine.Config{Policy: faultPolicyTimeout(t, mode, failures, openFor, timeout), Store: store, Hooks: cnt.hooks(), Clock: clock})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			check := func(key string) engine.Verdict {
				t.Helper()
				start := time.Now()
				v, err := eng.Check(ctx, engine.Request{Domain: "test", Attributes: map[string]string{"api_key": key}, Cost: 1})
				if err != nil {
					t.Fatalf("Check(%s) error %v", key, err)
				}
				if took := time.Since(start); took > timeout+margin {
					t.Fatalf("Check(%s) took %v, want at most the timeout plus %v", key, took, margin)
				}
				return v
			}
			if v := check("warm"); !v.Allowed || v.Degraded {
				t.Fatalf("Check before the fault = %+v, want allowed from Redis", v)
			}
			srv.Kill()
			before := cnt.calls.Load()
			allowed := 0
			for i := range 40 {
				v := check("k1")
				if !v.Degraded {
					t.Fatalf("request %d with Redis down: Degraded = false, want true", i)
				}
				if v.Allowed {
					allowed++
				}
				if mode == "closed" && v.Reason != engine.ReasonUnavailable {
					t.Fatalf("closed mode reason = %q, want %q", v.Reason, engine.ReasonUnavailable)
				}
			}
			want := map[string]int{"open": 40, "closed": 0, "local": 5}[mode]
			if allowed != want {
				t.Errorf("%s mode with Redis down admitted %d of 40, want %d", mode, allowed, want)
			}
			if got := cnt.calls.Load() - before; got != failures {
				t.Errorf("Redis attempts while down = %d, want %d (the breaker must open after %d failures)", got, failures, failures)
			}
			if got := eng.BreakerState(); got != "open" {
				t.Errorf("BreakerState() = %q, want open", got)
			}
			if got := cnt.activations.Load(); got != 40 {
				t.Errorf("failure-mode activations = %d, want 40", got)
			}

			srv.Restart(t)
			deadline := time.Now().Add(openFor + 3*time.Second)
			for {
				v := check("k2")
				if !v.Degraded {
					if !v.Allowed {
						t.Errorf("first decision after recovery = %+v, want allowed", v)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("decisions still degraded %v after Redis came back", openFor+3*time.Second)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if got := eng.BreakerState(); got != "closed" {
				t.Errorf("BreakerState() after recovery = %q, want closed", got)
			}
		})
	}
}

func TestScriptFlushMidRun(t *testing.T) {
	srv := redistest.StartServer(t)
	store, err := redisstore.Open(redisstore.Config{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if err := store.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	var cnt counting
	eng, err := engine.New(engine.Config{Policy: faultPolicy(t, "closed", 3, time.Second), Store: store, Hooks: cnt.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	allowed := 0
	for i := range 40 {
		if i%10 == 5 {
			// The library lives in FUNCTION (the script cache only without Redis
			// Functions): empty both.
			if err := admin.ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			if err := admin.FunctionFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
		}
		v, err := eng.Check(context.Background(), engine.Request{Domain: "test", Attributes: map[string]string{"api_key": "flush"}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		if v.Degraded {
			t.Fatalf("request %d after SCRIPT FLUSH degraded: %+v", i, v)
		}
		if v.Allowed {
			allowed++
		}
	}
	if got := cnt.failures.Load(); got != 0 {
		t.Errorf("store failures with SCRIPT FLUSH mid-run = %d, want 0", got)
	}
	if allowed != 10 {
		t.Errorf("admitted %d of 40 on 10/h, want 10", allowed)
	}
}

func TestLatencyAboveTimeout(t *testing.T) {
	srv := redistest.StartServer(t)
	tp := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	proxy := toxiproxy.NewProxy(tp, "redis", "127.0.0.1:0", srv.Addr)
	if err := proxy.Start(); err != nil {
		t.Fatal(err)
	}
	defer proxy.Stop()

	goroutines := runtime.NumGoroutine()
	store, err := redisstore.Open(redisstore.Config{URL: "redis://" + proxy.Listen})
	if err != nil {
		t.Fatal(err)
	}
	var cnt counting
	eng, err := engine.New(engine.Config{Policy: faultPolicyTimeout(t, "open", 1000, time.Second, timeout), Store: store, Hooks: cnt.hooks()})
	if err != nil {
		t.Fatal(err)
	}
	check := func() (engine.Verdict, time.Duration) {
		start := time.Now()
		v, err := eng.Check(context.Background(), engine.Request{Domain: "test", Attributes: map[string]string{"api_key": "slow"}, Cost: 1})
		if err != nil {
			t.Fatal(err)
		}
		return v, time.Since(start)
	}
	if v, _ := check(); v.Degraded {
		t.Fatalf("before the toxic: %+v, want a Redis decision", v)
	}
	if _, err := proxy.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","attributes":{"latency":1500}}`)); err != nil {
		t.Fatal(err)
	}
	for i := range 10 {
		v, took := check()
		if !v.Degraded || !v.Allowed {
			t.Fatalf("request %d with 1.5s latency = %+v, want allowed by the open failure mode", i, v)
		}
		if took > timeout+margin {
			t.Fatalf("request %d took %v, want at most the %v timeout plus %v", i, took, timeout, margin)
		}
	}
	if err := proxy.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
		t.Fatal(err)
	}
	recovered := false
	for range 200 { // up to 5s: connections may still hold data the toxic delayed
		if v, _ := check(); !v.Degraded {
			recovered = true
			break
		}
		time.Sleep(25 * time.Millisecond)
	}
	if !recovered {
		t.Error("decisions still degraded after the latency was removed")
	}
	store.Close()
	// Every goroutine the timeouts started must end once the store is closed.
	deadline := time.Now().Add(3 * time.Second)
	for runtime.NumGoroutine() > goroutines+2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := runtime.NumGoroutine(); n > goroutines+2 {
		buf := make([]byte, 1<<16)
		t.Errorf("goroutines = %d after close, want at most %d (leak?)\n%s", n, goroutines+2, buf[:runtime.Stack(buf, true)])
	}
}

func TestDenyCacheSparesRedis(t *testing.T) {
	srv := redistest.StartServer(t)
	store, err := redisstore.Open(redisstore.Config{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	eng, err := engine.New(engine.Config{Policy: faultPolicy(t, "open", 3, time.Second), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	req := engine.Request{Domain: "test", Attributes: map[string]string{"api_key": "abuser"}, Cost: 1}
	ctx := context.Background()
	for {
		v, err := eng.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if !v.Allowed {
			break
		}
	}
	before := srv.DecisionCalls(t)
	for i := range 10000 {
		v, err := eng.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if v.Allowed || !v.Cached {
			t.Fatalf("request %d from a blocked client = %+v, want a cached denial", i, v)
		}
		if v.Decision.RetryAfter <= 0 {
			t.Fatalf("request %d: cached denial has RetryAfter %v, want > 0", i, v.Decision.RetryAfter)
		}
	}
	if got := srv.DecisionCalls(t) - before; got > 1 {
		t.Errorf("Redis decision calls for 10,000 blocked requests = %d, want at most 1", got)
	}
}

// TestDenyCacheHonoursCost checks that a denial remembers what it cost: a request too
// large for a limit's capacity leaves nothing in the cache, and a denial of a large
// request does not answer a smaller one that fits.
func TestDenyCacheHonoursCost(t *testing.T) {
	srv := redistest.StartServer(t)
	store, err := redisstore.Open(redisstore.Config{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	eng, err := engine.New(engine.Config{Policy: faultPolicy(t, "open", 3, time.Second), Store: store})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ask := func(key string, cost int64) engine.Verdict {
		t.Helper()
		v, err := eng.Check(ctx, engine.Request{Domain: "test", Attributes: map[string]string{"api_key": key}, Cost: cost})
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	// 10 per hour: a cost of 11 can never pass, and must not block a cost of 1.
	if v := ask("big", 11); v.Allowed {
		t.Fatalf("cost 11 on 10/h = %+v, want denied", v)
	}
	if v := ask("big", 1); !v.Allowed || v.Cached {
		t.Errorf("cost 1 after an impossible cost 11 = %+v, want allowed by the store", v)
	}
	// 8 of 10 used: a cost of 5 is denied, a cost of 2 still fits.
	ask("mid", 8)
	if v := ask("mid", 5); v.Allowed {
		t.Fatalf("cost 5 with 2 left = %+v, want denied", v)
	}
	if v := ask("mid", 5); v.Allowed || !v.Cached {
		t.Errorf("cost 5 again = %+v, want a cached denial", v)
	}
	if v := ask("mid", 2); !v.Allowed || v.Cached {
		t.Errorf("cost 2 with 2 left after a denied cost 5 = %+v, want allowed by the store", v)
	}
}
