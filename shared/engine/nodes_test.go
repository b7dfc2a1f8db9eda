package engine_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// nodePolicy is a one-rule policy of 20 per hour per key with the given failure mode,
// the deny cache on, and a decision timeout long enough that a loaded machine cannot
// turn a healthy node's answer into the failure mode.
func nodePolicy(t *testing.T, mode string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(fmt.Appendf(nil, `
domain: test
deny_cache: {enabled: true}
failure: {mode: %s, timeout: 2s, breaker: {failures: 5, open_for: 1s}}
rules:
  - name: per-key
    match: {api_key: "*"}
    limits:
      - {algorithm: fixed_window, rate: 20/h}
`, mode))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

// tally counts one key's answers.
type tally struct {
	admitted, overLimit, degraded atomic.Int64
}

// TestClusterMasterKilled kills one master of a three-master cluster (no replicas)
// under load and checks that only the keys it held get the failure mode: keys on the
// other masters keep being decided, and limited, by Redis.
func TestClusterMasterKilled(t *testing.T) {
	for _, mode := range []string{"closed", "open"} {
		t.Run(mode, func(t *testing.T) {
			cl := redistest.StartCluster(t)
			for _, n := range cl.Nodes() {
				// By default a cluster that lost a slot refuses every key; a deployment
				// that wants its healthy shards to keep deciding turns this off.
				n.Do(t, "CONFIG", "SET", "cluster-require-full-coverage", "no")
			}
			// Commands get the decision's 2s too (not the default 100ms): on a loaded
			// machine a healthy node may be slow, and slow is not what this test is about.
			store, err := redisstore.Open(redisstore.Config{URL: cl.URL(), Cluster: true, Timeout: 2 * time.Second, BatchWait: redisstore.DefaultBatchWait})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			ctx := context.Background()
			if err := store.Preload(ctx); err != nil {
				t.Fatal(err)
			}
			eng, err := engine.New(engine.Config{Policy: nodePolicy(t, mode), Store: store})
			if err != nil {
				t.Fatal(err)
			}
			victim := cl.Nodes()[0]
			cc := cl.Client(t)
			// onVictim reports whether the key of api_key k is on the victim.
			onVictim := func(k string) bool {
				keys, _, err := eng.Keys("test", map[string]string{"api_key": k})
				if err != nil {
					t.Fatal(err)
				}
				c, err := cc.MasterForKey(ctx, keys[0])
				if err != nil {
					t.Fatal(err)
				}
				return c.Options().Addr == victim.Addr
			}
			// Limited keys are hammered past their limit; fresh keys are used once
			// each, so they reach Redis (no deny cache) on every node, all along.
			const nLimited = 30
			limited := make([]string, nLimited)
			victimKey := make(map[string]bool)
			for i := range limited {
				limited[i] = fmt.Sprintf("lim-%d", i)
				victimKey[limited[i]] = onVictim(limited[i])
			}
			fresh := make([]string, 20000)
			for i := range fresh {
				fresh[i] = fmt.Sprintf("fresh-%d", i)
				victimKey[fresh[i]] = onVictim(fresh[i])
			}
			tallies := make(map[string]*tally, len(victimKey))
			for k := range victimKey {
				tallies[k] = new(tally)
			}

			var next atomic.Int64
			var wrongMode atomic.Int64 // victim answers of the wrong failure mode
			stop := steadyLoad(8, time.Millisecond, func(_, i int) bool {
				k := limited[(i/2)%nLimited]
				if n := next.Add(1); i%2 == 1 && int(n) < len(fresh) {
					k = fresh[n]
				}
				v, err := eng.Check(ctx, engine.Request{Domain: "test", Attributes: map[string]string{"api_key": k}, Cost: 1})
				if err != nil {
					t.Errorf("Check(%s) error %v", k, err)
					return false
				}
				tl := tallies[k]
				switch {
				case v.Degraded:
					tl.degraded.Add(1)
					if v.Allowed != (mode == "open") {
						wrongMode.Add(1)
					}
				case v.Allowed:
					tl.admitted.Add(1)
				default:
					tl.overLimit.Add(1)
				}
				return true
			})
			time.Sleep(500 * time.Millisecond)
			victim.Kill()
			// Past the cluster's node timeout (2s), when the other masters mark the
			// victim as failed.
			time.Sleep(3500 * time.Millisecond)
			stop()

			var healthyDegraded, victimDegraded, healthyDecided int64
			for k, tl := range tallies {
				if victimKey[k] {
					victimDegraded += tl.degraded.Load()
				} else {
					healthyDegraded += tl.degraded.Load()
					healthyDecided += tl.admitted.Load() + tl.overLimit.Load()
				}
			}
			for _, k := range limited {
				tl := tallies[k]
				if victimKey[k] && mode == "open" {
					continue // the open failure mode admits without a limit, by design
				}
				if got := tl.admitted.Load(); got > 20 {
					t.Errorf("key %s (on the victim: %v) admitted %d times, want at most its limit of 20", k, victimKey[k], got)
				}
				if !victimKey[k] && tl.overLimit.Load() == 0 {
					t.Errorf("key %s on a healthy master was never denied over its limit (%d admitted)", k, tl.admitted.Load())
				}
			}
			if healthyDegraded != 0 {
				t.Errorf("keys on healthy masters got %d failure-mode answers, want 0", healthyDegraded)
			}
			if victimDegraded == 0 {
				t.Error("keys on the killed master got no failure-mode answer, want some")
			}
			if got := wrongMode.Load(); got != 0 {
				t.Errorf("%d failure-mode answers did not follow mode %s", got, mode)
			}
			if healthyDecided == 0 {
				t.Error("no key on a healthy master was decided by Redis")
			}
			t.Logf("mode %s: healthy keys: %d decided, %d failure-mode; victim keys: %d failure-mode; breakers: %v",
				mode, healthyDecided, healthyDegraded, victimDegraded, eng.Breakers())
		})
	}
}

// TestShortOutageCostsAboutItsLength checks that a 0.5s outage of a standalone Redis
// under steady load costs about as long in failure-mode answers, not the policy's
// open_for (5s here): the breaker probes after 200ms and backs off from there.
func TestShortOutageCostsAboutItsLength(t *testing.T) {
	const outage = 500 * time.Millisecond
	// maxCost bounds the failure-mode window of an outage of d, as long as the fault
	// really lasted (a restart on a loaded machine adds to the 0.5s): the outage, the
	// probe that just missed the end of it (at most as late again, 2d + 0.2s), and
	// 0.3s of room for a loaded machine — 1.5s for an outage of exactly 0.5s.
	maxCost := func(d time.Duration) time.Duration { return 2*d + 500*time.Millisecond }
	tests := []struct {
		name  string
		fault func(t *testing.T, srv *redistest.Server)
	}{
		{"kill and restart", func(t *testing.T, srv *redistest.Server) {
			srv.Kill()
			time.Sleep(outage)
			srv.Restart(t)
		}},
		{"client pause", func(t *testing.T, srv *redistest.Server) {
			srv.Do(t, "CLIENT", "PAUSE", outage.Milliseconds(), "ALL")
			time.Sleep(outage)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			store, err := redisstore.Open(redisstore.Config{URL: srv.URL(), BatchWait: redisstore.DefaultBatchWait})
			if err != nil {
				t.Fatal(err)
			}
			defer store.Close()
			p, err := policy.Parse([]byte(`
domain: test
failure: {mode: closed, timeout: 250ms, breaker: {failures: 5, open_for: 5s}}
rules:
  - {name: per-key, match: {api_key: "*"}, limits: [{algorithm: fixed_window, rate: 1000000/h}]}
`))
			if err != nil {
				t.Fatal(err)
			}
			eng, err := engine.New(engine.Config{Policy: p, Store: store})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			start := time.Now()
			var mu sync.Mutex
			var first, last time.Duration // of the failure-mode answers, since start
			var degraded int
			stop := steadyLoad(4, 2*time.Millisecond, func(g, i int) bool {
				v, err := eng.Check(ctx, engine.Request{Domain: "test", Attributes: map[string]string{"api_key": fmt.Sprintf("k%d-%d", g, i)}, Cost: 1})
				if err != nil {
					t.Errorf("Check error %v", err)
					return false
				}
				if v.Degraded {
					at := time.Since(start)
					mu.Lock()
					if degraded == 0 {
						first = at
					}
					last = max(last, at)
					degraded++
					mu.Unlock()
				}
				return true
			})
			time.Sleep(300 * time.Millisecond)
			faultAt := time.Since(start)
			tt.fault(t, srv)
			faultEnd := time.Since(start)
			time.Sleep(maxCost(faultEnd-faultAt) + time.Second)
			stop()
			if degraded == 0 {
				t.Fatal("no failure-mode answer during the outage: the fault did not reach the store")
			}
			cost := last - first
			t.Logf("outage of %v (%v with the restart): failure-mode answers from +%v to +%v after the fault began: %v, %d answers",
				outage, (faultEnd - faultAt).Round(time.Millisecond), (first - faultAt).Round(time.Millisecond), (last - faultAt).Round(time.Millisecond), cost.Round(time.Millisecond), degraded)
			if limit := maxCost(faultEnd - faultAt); cost > limit {
				t.Errorf("a %v outage (%v with the restart) cost %v of failure-mode answers, want at most %v", outage, (faultEnd - faultAt).Round(time.Millisecond), cost, limit)
			}
			if got := eng.BreakerState(); got != "closed" {
				t.Errorf("BreakerState() after the outage = %q, want closed", got)
			}
		})
	}
}

// steadyLoad calls fn(g, i) from n goroutines g, each for i = 0, 1, ... with pause
// between calls, until fn returns false or the returned stop is called; stop waits
// for the goroutines to end.
func steadyLoad(n int, pause time.Duration, fn func(g, i int) bool) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := range n {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-done:
					return
				default:
				}
				if !fn(g, i) {
					return
				}
				time.Sleep(pause)
			}
		})
	}
	return func() {
		close(done)
		wg.Wait()
	}
}
