package engine_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// settleTarget is one Redis topology the settlement tests run on: a store for the
// engine and a client to read the counters with.
type settleTarget struct {
	name   string
	store  *redisstore.Store
	client redis.UniversalClient
}

// settleTargets starts a standalone Redis and a three-master cluster.
func settleTargets(t *testing.T) []settleTarget {
	t.Helper()
	var out []settleTarget
	for _, tc := range redistest.Targets(t) {
		st, err := redisstore.Open(redisstore.Config{URL: tc.URL, Cluster: tc.Cluster, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		if err := st.Preload(context.Background()); err != nil {
			t.Fatal(err)
		}
		out = append(out, settleTarget{tc.Name, st, tc.Client})
	}
	return out
}

func tenantPolicy(t *testing.T, limits string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte("domain: ai\nfailure: {mode: closed, timeout: 2s}\nrules:\n  - name: tenant\n    match: {tenant: \"*\"}\n    limits:\n" + limits))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// windowCount sums the fixed_window counters of the limit whose base key is key, as
// Redis holds them (KEY:<window>).
func windowCount(t *testing.T, c redis.UniversalClient, key string) int64 {
	t.Helper()
	ctx := context.Background()
	var total int64
	scan := func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, key+":*", 100).Iterator()
		for iter.Next(ctx) {
			n, err := node.Get(ctx, iter.Val()).Int64()
			if err != nil {
				return fmt.Errorf("GET %s: %w", iter.Val(), err)
			}
			atomic.AddInt64(&total, n)
		}
		return iter.Err()
	}
	var err error
	switch cc := c.(type) {
	case *redis.ClusterClient:
		err = cc.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, cc)
	}
	if err != nil {
		t.Fatal(err)
	}
	return total
}

// TestSettleScenario: a tenant limited to 1000 tokens a minute is checked (1 unit,
// as ERL counts a request's hits_addend of 0), charged 900, then settles a response
// of 200 that does not fit: the 200 are charged (the counter holds 1101, as ERL's
// INCRBY counter would for the same calls), the settlement's verdict shows the debt
// (remaining 0, reset at the window's end) and the next check is denied.
func TestSettleScenario(t *testing.T) {
	for _, tg := range settleTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			for _, alg := range []string{"fixed_window", "sliding_window", "token_bucket", "gcra"} {
				t.Run(alg, func(t *testing.T) {
					eng, err := engine.New(engine.Config{Policy: tenantPolicy(t, "      - {algorithm: "+alg+", rate: 1000/min}\n"), Store: tg.store})
					if err != nil {
						t.Fatal(err)
					}
					ctx := context.Background()
					tenant := map[string]string{"tenant": tg.name + "-" + alg + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)}
					req := func(cost int64, settle bool) engine.Verdict {
						t.Helper()
						v, err := eng.Check(ctx, engine.Request{Domain: "ai", Attributes: tenant, Cost: cost, Settle: settle})
						if err != nil {
							t.Fatalf("Check(cost %d, settle %v) = %v", cost, settle, err)
						}
						return v
					}
					erl := int64(0) // what ERL's INCRBY counter holds after the same calls
					if v := req(1, false); !v.Allowed {
						t.Fatalf("check: %+v, want allowed", v)
					}
					erl++
					if v := req(900, false); !v.Allowed || v.Decision.Remaining != 99 {
						t.Fatalf("charge 900: allowed %v remaining %d, want true 99", v.Allowed, v.Decision.Remaining)
					}
					erl += 900
					plain := req(200, false)
					if plain.Allowed {
						t.Fatalf("a plain charge of 200 on 99 remaining was admitted")
					}
					v := req(200, true)
					erl += 200
					if !v.Allowed || v.Decision.Remaining != 0 || v.Decision.ResetAfter <= 0 {
						t.Fatalf("settle 200: allowed %v remaining %d reset %v, want true, 0 and a reset", v.Allowed, v.Decision.Remaining, v.Decision.ResetAfter)
					}
					if h := headerOf(v.Headers(), "X-RateLimit-Remaining"); h != "0" {
						t.Fatalf("settle 200: X-RateLimit-Remaining %q, want 0", h)
					}
					next := req(1, false)
					if next.Allowed {
						t.Fatalf("the check after a debt of 101 was admitted: %+v", next.Decision)
					}
					if alg == "fixed_window" {
						keys, _, err := eng.Keys("ai", tenant)
						if err != nil {
							t.Fatal(err)
						}
						if got := windowCount(t, tg.client, keys[0]); got != erl {
							t.Fatalf("fixed_window counter = %d, want %d (ERL's INCRBY counter for the same calls)", got, erl)
						}
					}
					t.Logf("%s: settle left remaining %d, reset %v; next check retry %v; ERL's counter %d", alg, v.Decision.Remaining, v.Decision.ResetAfter.Round(time.Millisecond), next.Decision.RetryAfter.Round(time.Millisecond), erl)
				})
			}
		})
	}
}

func headerOf(hs [][2]string, name string) string {
	for _, h := range hs {
		if strings.EqualFold(h[0], name) {
			return h[1]
		}
	}
	return ""
}

// TestSettleDebtPaidBack: after a settlement leaves a debt on a fast limit (100
// units per 200ms), checks are denied until the algorithm pays it back, and admitted
// after the retry the denial stated.
func TestSettleDebtPaidBack(t *testing.T) {
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, alg := range []string{"fixed_window", "sliding_window", "token_bucket", "gcra", "leaky_bucket"} {
		t.Run(alg, func(t *testing.T) {
			eng, err := engine.New(engine.Config{Policy: tenantPolicy(t, "      - {algorithm: "+alg+", rate: 100/200ms}\n"), Store: st})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			tenant := map[string]string{"tenant": alg}
			// Start just after a 200ms window begins (Redis's clock is this machine's), so
			// a fixed window does not end between the debt and the check that must see it.
			const period = 200 * time.Millisecond
			time.Sleep(period - time.Duration(time.Now().UnixNano())%period + 2*time.Millisecond)
			if _, err := eng.Check(ctx, engine.Request{Domain: "ai", Attributes: tenant, Cost: 150, Settle: true}); err != nil {
				t.Fatal(err)
			}
			v, err := eng.Check(ctx, engine.Request{Domain: "ai", Attributes: tenant, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if v.Allowed || v.Decision.RetryAfter <= 0 {
				t.Fatalf("check after a debt: allowed %v retry %v, want denied with a retry", v.Allowed, v.Decision.RetryAfter)
			}
			time.Sleep(v.Decision.RetryAfter + 5*time.Millisecond)
			w, err := eng.Check(ctx, engine.Request{Domain: "ai", Attributes: tenant, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			if !w.Allowed {
				t.Fatalf("check after the stated retry %v: denied, retry %v", v.Decision.RetryAfter, w.Decision.RetryAfter)
			}
			t.Logf("%s: a debt of 50 on 100/200ms denied for %v", alg, v.Decision.RetryAfter.Round(time.Millisecond))
		})
	}
	// sliding_log cannot settle: the error names the fix.
	eng, err := engine.New(engine.Config{Policy: tenantPolicy(t, "      - {algorithm: sliding_log, rate: 100/s}\n"), Store: st})
	if err != nil {
		t.Fatal(err)
	}
	_, err = eng.Check(context.Background(), engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "x"}, Cost: 5, Settle: true})
	if !errors.Is(err, engine.ErrBadRequest) || !strings.Contains(err.Error(), "sliding_window") {
		t.Fatalf("settle on sliding_log = %v, want ErrBadRequest naming sliding_window", err)
	}
}

// streamsRun is what runStreams measured.
type streamsRun struct {
	perWindow   map[int64]int64 // units landed per window (the store's clock)
	settled     int64           // units settled, as the Settled hook counted them
	sent        int64           // units of every charge that landed: checks and settlements
	admitted    int64
	maxResponse int64
}

// runStreams drives streams concurrent streams against tenant's tokens-per-second limit
// for d: each checks (reserving estimate units, or 1 unit when estimate is 0), and
// when admitted settles a random response of 1..200 tokens.
func runStreams(t *testing.T, eng *engine.Engine, settled *atomic.Int64, tenant string, streams int, estimate int64, d time.Duration) streamsRun {
	t.Helper()
	ctx := context.Background()
	var mu sync.Mutex
	run := streamsRun{perWindow: map[int64]int64{}}
	land := func(now, units int64) {
		mu.Lock()
		run.perWindow[now/int64(time.Second/time.Microsecond)] += units
		run.sent += units
		mu.Unlock()
	}
	end := time.Now().Add(d)
	var wg sync.WaitGroup
	var seq atomic.Int64
	for g := range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 7))
			attrs := map[string]string{"tenant": tenant}
			for time.Now().Before(end) {
				tokens := 1 + r.Int64N(200)
				id := strconv.FormatInt(seq.Add(1), 10)
				var v engine.Verdict
				var err error
				if estimate > 0 {
					p, perr := eng.Plan(engine.Request{Domain: "ai", Attributes: attrs, Cost: estimate})
					if perr != nil {
						t.Error(perr)
						return
					}
					v, err = eng.Reserve(ctx, p, id, time.Minute)
				} else {
					v, err = eng.Check(ctx, engine.Request{Domain: "ai", Attributes: attrs, Cost: 1})
				}
				if err != nil {
					t.Error(err)
					return
				}
				if !v.Allowed {
					time.Sleep(min(v.Decision.RetryAfter, 20*time.Millisecond))
					continue
				}
				mu.Lock()
				run.admitted++
				run.maxResponse = max(run.maxResponse, tokens)
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond) // the upstream answers
				if estimate > 0 {
					p, perr := eng.Plan(engine.Request{Domain: "ai", Attributes: attrs, Cost: tokens})
					if perr != nil {
						t.Error(perr)
						return
					}
					sv, err := eng.SettleReserved(ctx, p, id)
					if err != nil {
						t.Error(err)
						return
					}
					// The estimate landed at the reservation's time, and a refund
					// comes off that window; an extra charge lands at the
					// settlement's time, as the counters take them.
					if tokens <= estimate {
						land(v.NowMicros, tokens)
					} else {
						land(v.NowMicros, estimate)
						land(sv.NowMicros, tokens-estimate)
					}
					continue
				}
				land(v.NowMicros, 1)
				sv, err := eng.Check(ctx, engine.Request{Domain: "ai", Attributes: attrs, Cost: tokens, Settle: true})
				if err != nil {
					t.Error(err)
					return
				}
				land(sv.NowMicros, tokens)
			}
		}()
	}
	wg.Wait()
	run.settled = settled.Load()
	return run
}

// TestSettleConcurrentStreams: streams of random token counts (1..200) against 5,000
// tokens per second, on real Redis (standalone and cluster). Check then settle: in
// every window the tokens landed are at most the limit plus what the streams past
// their check settle (one stream: the largest response; 64: at most 64 x 200); no
// settlement is lost (a year-long counter beside the limit equals every unit sent).
// 64 streams reserving 200 (the largest response) then settling: no window passes
// the limit.
func TestSettleConcurrentStreams(t *testing.T) {
	const limit = 5000
	for _, tg := range settleTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			for _, mode := range []struct {
				name     string
				streams  int
				estimate int64
			}{{"one-stream-check-then-settle", 1, 0}, {"check-then-settle", 64, 0}, {"reserve-200-then-settle", 64, 200}} {
				t.Run(mode.name, func(t *testing.T) {
					var settled atomic.Int64
					p := tenantPolicy(t, "      - {algorithm: fixed_window, rate: 5000/s}\n      - {algorithm: fixed_window, rate: 1000000000000/366d}\n")
					eng, err := engine.New(engine.Config{Policy: p, Store: tg.store, Hooks: engine.Hooks{Settled: func(_ string, u int64) { settled.Add(u) }}})
					if err != nil {
						t.Fatal(err)
					}
					tenant := tg.name + "-" + mode.name + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
					run := runStreams(t, eng, &settled, tenant, mode.streams, mode.estimate, 2500*time.Millisecond)
					keys, _, err := eng.Keys("ai", map[string]string{"tenant": tenant})
					if err != nil {
						t.Fatal(err)
					}
					total := windowCount(t, tg.client, keys[1])
					if total != run.sent {
						t.Fatalf("year counter = %d, want %d: every unit sent (a settlement was lost or counted twice)", total, run.sent)
					}
					worst := int64(0)
					for _, u := range run.perWindow {
						worst = max(worst, u)
					}
					// A check passes below the limit; what lands after it is what the
					// streams past their check settle: 200 each at most.
					bound := int64(limit + mode.streams*200)
					if mode.estimate >= 200 {
						bound = limit
					}
					if worst > bound {
						t.Fatalf("a window landed %d tokens, want at most %d", worst, bound)
					}
					if run.admitted == 0 || len(run.perWindow) < 2 {
						t.Fatalf("admitted %d requests over %d windows: the run measured nothing", run.admitted, len(run.perWindow))
					}
					t.Logf("%s %s: %d admitted, %d tokens over %d windows, the fullest window %d tokens (limit %d, +%d over; bound %d), largest response %d, settled hook %d units, year counter %d = units sent",
						tg.name, mode.name, run.admitted, run.sent, len(run.perWindow), worst, limit, max(0, worst-limit), bound, run.maxResponse, run.settled, total)
				})
			}
		})
	}
}

// TestSettlingRule: a policy rule marked settle settles every request it matches
// (the response-phase call, told apart by an attribute only it sends), a request
// that matches a settling and a deciding rule is refused with the fix, and a
// settling rule on sliding_log or with a lease is a policy error naming the fix.
func TestSettlingRule(t *testing.T) {
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	p, err := policy.Parse([]byte(`domain: ai
rules:
  - name: tokens
    match: {tenant: "*", phase: request}
    limits: [{algorithm: fixed_window, rate: 1000/min, counter: tenant-tokens}]
  - name: tokens-spent
    match: {tenant: "*", phase: response}
    settle: true
    limits: [{algorithm: fixed_window, rate: 1000/min, counter: tenant-tokens}]
  - name: everything
    match: {tenant: "*", phase: both}
    limits: [{algorithm: fixed_window, rate: 1000/min}]
  - name: everything-spent
    match: {tenant: "*", phase: both}
    settle: true
    limits: [{algorithm: fixed_window, rate: 1000/min}]
`))
	if err != nil {
		t.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	call := func(phase string, cost int64) engine.Verdict {
		t.Helper()
		v, err := eng.Check(ctx, engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "t1", "phase": phase}, Cost: cost})
		if err != nil {
			t.Fatalf("Check(%s, %d) = %v", phase, cost, err)
		}
		return v
	}
	if v := call("request", 900); !v.Allowed {
		t.Fatal("request phase 900 of 1000 denied")
	}
	if v := call("response", 200); !v.Allowed || v.Decision.Remaining != 0 {
		t.Fatalf("response phase 200 (settling rule): allowed %v remaining %d, want true 0", v.Allowed, v.Decision.Remaining)
	}
	if v := call("request", 1); v.Allowed {
		t.Fatal("request phase after the debt admitted: the settling rule and the deciding rule do not share the count")
	}
	_, err = eng.Check(ctx, engine.Request{Domain: "ai", Attributes: map[string]string{"tenant": "t1", "phase": "both"}, Cost: 1})
	if !errors.Is(err, engine.ErrBadRequest) || !strings.Contains(err.Error(), "only with settling rules") {
		t.Fatalf("a request matching a settling and a deciding rule = %v, want ErrBadRequest with the fix", err)
	}
	for _, tc := range []struct{ limit, want string }{
		{"{algorithm: sliding_log, rate: 10/s}", "use sliding_window"},
		{"{algorithm: fixed_window, rate: 10000/s, lease: {units: 50, for: 100ms}}", "remove lease"},
	} {
		_, err := policy.Parse([]byte("domain: ai\nrules:\n  - name: spent\n    settle: true\n    limits: [" + tc.limit + "]\n"))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Fatalf("settling rule with %s = %v, want an error containing %q", tc.limit, err, tc.want)
		}
	}
}
