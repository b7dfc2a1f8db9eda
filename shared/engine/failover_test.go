package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// The failover tests kill the Redis master of some keys while a decision service's
// engine decides a steady load over failoverKeys keys, fixed_window
// failoverLimit per second each, in closed failure mode, and check what its
// clients see:
//
//   - keys whose master stays up never get a failure-mode answer;
//   - keys of the dead master get store answers again within failoverRecovery of
//     the replica's promotion;
//   - no key is admitted more than failoverLimit times in any window.
const (
	failoverKeys     = 100
	failoverLimit    = 10
	failoverPeriod   = time.Second
	failoverWorkers  = 10
	failoverPace     = 2 * time.Millisecond // between one worker's requests
	failoverRecovery = 2 * time.Second
	// failoverObserve is how long the load goes on after the recovery bound, to
	// see that no failure-mode answer comes late.
	failoverObserve = 2 * time.Second
	// failoverNodeTimeout is the cluster-node-timeout and the Sentinels'
	// down-after-milliseconds.
	failoverNodeTimeout = time.Second
)

// failoverPolicy is the decision service's policy for the failover tests: closed
// failure mode, the default circuit breaker, and a timeout generous enough that a
// loaded test machine cannot turn a slow answer from a live master into a
// failure-mode answer (a dead master refuses connections at once on loopback). With
// the default 50ms timeout the tests passed as well, on an idle machine.
func failoverPolicy(t testing.TB) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(fmt.Appendf(nil, `
domain: test
failure: {mode: closed, timeout: 250ms}
rules:
  - name: per-key
    match: {api_key: "*"}
    limits:
      - {algorithm: fixed_window, rate: %d/s}
`, failoverLimit))
	if err != nil {
		t.Fatalf("policy: %v", err)
	}
	return p
}

// A breakerChange is a state a node's circuit breaker took, and when.
type breakerChange struct {
	node, state string
	at          time.Time
}

// An answer is one decision the load saw.
type answer struct {
	key      int
	at       time.Time // when the answer came back
	degraded bool      // the failure mode answered
	allowed  bool
	window   int64 // the fixed window of an allowed answer, in periods since the epoch
}

// failoverRun is an engine built as lambda/limiter builds it (store, batcher,
// engine), with a load on it.
type failoverRun struct {
	eng     *engine.Engine
	keys    []string // Redis key of each api_key "k<i>"
	logs    *lineLog
	breaker struct {
		sync.Mutex
		changes []breakerChange
	}
	storeCalls, storeFailures atomic.Int64

	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	answers []answer
	denied  []atomic.Bool // the store has denied key i at least once
	errs    []error       // errors of Check, which only a bad request returns
}

// startFailoverRun builds the engine on the Redis at url and starts the load.
func startFailoverRun(t *testing.T, url string, cluster bool) *failoverRun {
	t.Helper()
	store, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, BatchWait: redisstore.DefaultBatchWait})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	if err := store.Preload(context.Background()); err != nil {
		t.Fatalf("Preload() = %v, want nil", err)
	}
	r := &failoverRun{logs: &lineLog{max: 40}, stop: make(chan struct{}), denied: make([]atomic.Bool, failoverKeys)}
	hooks := engine.Hooks{
		StoreCall: func(_ time.Duration, err error) {
			r.storeCalls.Add(1)
			if err != nil {
				r.storeFailures.Add(1)
			}
		},
		BreakerState: func(node, state string) {
			r.breaker.Lock()
			r.breaker.changes = append(r.breaker.changes, breakerChange{node, state, time.Now()})
			r.breaker.Unlock()
		},
	}
	r.eng, err = engine.New(engine.Config{
		Policy: failoverPolicy(t),
		Store:  store,
		Logger: slog.New(slog.NewTextHandler(r.logs, nil)),
		Hooks:  hooks,
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range failoverKeys {
		keys, _, err := r.eng.Keys("test", map[string]string{"api_key": fmt.Sprintf("k%d", i)})
		if err != nil || len(keys) != 1 {
			t.Fatalf("Keys(k%d) = %v, %v, want one key", i, keys, err)
		}
		r.keys = append(r.keys, keys[0])
	}
	for w := range failoverWorkers {
		r.wg.Add(1)
		go r.work(w)
	}
	t.Cleanup(r.halt)
	return r
}

// work sends the requests of the keys w, w+failoverWorkers, … in turn until the
// run stops.
func (r *failoverRun) work(w int) {
	defer r.wg.Done()
	var mine []answer
	var errs []error
	defer func() {
		r.mu.Lock()
		r.answers = append(r.answers, mine...)
		r.errs = append(r.errs, errs...)
		r.mu.Unlock()
	}()
	ctx := context.Background()
	for n := 0; ; n++ {
		select {
		case <-r.stop:
			return
		default:
		}
		key := w + (n%(failoverKeys/failoverWorkers))*failoverWorkers
		v, err := r.eng.Check(ctx, engine.Request{Domain: "test", Attributes: map[string]string{"api_key": fmt.Sprintf("k%d", key)}, Cost: 1})
		now := time.Now()
		if err != nil {
			errs = append(errs, fmt.Errorf("Check(k%d): %w", key, err))
			return
		}
		a := answer{key: key, at: now, degraded: v.Degraded, allowed: v.Allowed}
		if v.Allowed {
			// The window ends ResetAfter from now; windows are aligned to the epoch.
			end := now.Add(v.Decision.ResetAfter).UnixNano()
			a.window = int64(math.Round(float64(end)/float64(failoverPeriod))) - 1
		}
		if !v.Allowed && !v.Degraded && !v.Cached {
			r.denied[key].Store(true)
		}
		mine = append(mine, a)
		time.Sleep(failoverPace)
	}
}

// halt stops the load and waits for it; it may be called more than once.
func (r *failoverRun) halt() {
	select {
	case <-r.stop:
	default:
		close(r.stop)
	}
	r.wg.Wait()
}

// waitSaturated waits until the store has denied every key at least once, so
// that the load reaches every limit.
func (r *failoverRun) waitSaturated(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := 0
		for i := range r.denied {
			if r.denied[i].Load() {
				n++
			}
		}
		if n == failoverKeys {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("keys denied by the store after 10s of load = %d, want all %d", n, failoverKeys)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// failover is what a failover test knows once the load has stopped.
type failover struct {
	killed, promoted time.Time
	onDead           func(key int) bool // the key's master was killed
	// allDown is set when every master refuses queries (CLUSTERDOWN) until the
	// promotion, as with cluster-require-full-coverage yes: then the keys of
	// healthy masters may get failure-mode answers too, but must recover as
	// the dead master's do.
	allDown bool
}

// check asserts the three promises of the failover tests on the answers and logs
// the figures.
func (r *failoverRun) check(t *testing.T, f failover) {
	t.Helper()
	r.halt()
	for _, err := range r.errs {
		t.Errorf("%v, want no error", err)
	}
	answers := r.answers
	sort.Slice(answers, func(i, j int) bool { return answers[i].at.Before(answers[j].at) })
	since := func(at time.Time) time.Duration { return at.Sub(f.killed).Round(time.Millisecond) }
	bound := f.promoted.Add(failoverRecovery)

	var before, healthy, dead int
	var firstHealthy, lastHealthy, firstDead, lastDead time.Time
	var healthyShown []string // the first healthy masters' keys that failed
	served := map[int]bool{}  // dead keys with a store answer after the bound
	admitted := map[[2]int64]int{}
	for _, a := range answers {
		if a.allowed && !a.degraded {
			admitted[[2]int64{int64(a.key), a.window}]++
		}
		if !a.degraded {
			if f.onDead(a.key) && a.at.After(bound) {
				served[a.key] = true
			}
			continue
		}
		switch {
		case a.at.Before(f.killed):
			before++
		case f.onDead(a.key):
			dead++
			if firstDead.IsZero() {
				firstDead = a.at
			}
			lastDead = a.at
		default:
			healthy++
			if firstHealthy.IsZero() {
				firstHealthy = a.at
			}
			lastHealthy = a.at
			if len(healthyShown) < 10 {
				healthyShown = append(healthyShown, fmt.Sprintf("k%d at %v", a.key, since(a.at)))
			}
		}
	}

	deadKeys := 0
	for k := range failoverKeys {
		if f.onDead(k) {
			deadKeys++
		}
	}
	t.Logf("%d answers; %d keys on the dead master; promotion %v after the kill", len(answers), deadKeys, since(f.promoted))
	t.Logf("failure-mode answers: %d before the kill, %d on healthy masters, %d on the dead master", before, healthy, dead)
	if dead > 0 {
		t.Logf("dead master's keys: failure mode from %v to %v after the kill; last one %v after the promotion",
			since(firstDead), since(lastDead), lastDead.Sub(f.promoted).Round(time.Millisecond))
	}
	var changes []string
	for _, c := range r.breaker.changes {
		changes = append(changes, fmt.Sprintf("%s %s %v", c.node, c.state, since(c.at)))
	}
	t.Logf("store calls %d, failed %d; breaker changes after the kill: %v", r.storeCalls.Load(), r.storeFailures.Load(), changes)

	failed := false
	if before > 0 {
		t.Errorf("failure-mode answers before the kill = %d, want 0", before)
		failed = true
	}
	switch {
	case healthy > 0 && !f.allDown:
		t.Errorf("failure-mode answers for keys on healthy masters = %d (first %v after the kill: %s), want 0", healthy, since(firstHealthy), strings.Join(healthyShown, ", "))
		failed = true
	case healthy > 0:
		t.Logf("healthy masters' keys: failure mode from %v to %v after the kill; last one %v after the promotion",
			since(firstHealthy), since(lastHealthy), lastHealthy.Sub(f.promoted).Round(time.Millisecond))
		if lastHealthy.After(bound) {
			t.Errorf("last failure-mode answer for a healthy master's key %v after the promotion, want at most %v", lastHealthy.Sub(f.promoted).Round(time.Millisecond), failoverRecovery)
			failed = true
		}
	}
	if dead == 0 {
		t.Errorf("failure-mode answers for the dead master's keys = 0, want some: did the kill happen under load?")
	}
	if !lastDead.IsZero() && lastDead.After(bound) {
		t.Errorf("last failure-mode answer %v after the promotion, want at most %v", lastDead.Sub(f.promoted).Round(time.Millisecond), failoverRecovery)
		failed = true
	}
	if len(served) != deadKeys {
		t.Errorf("dead master's keys with a store answer from %v after the promotion on = %d, want all %d", failoverRecovery, len(served), deadKeys)
		failed = true
	}

	full, over := 0, 0
	for kw, n := range admitted {
		switch {
		case n == failoverLimit:
			full++
		case n > failoverLimit:
			over++
			if over <= 10 {
				t.Errorf("key k%d admitted %d times in window %d, want at most %d", kw[0], n, kw[1], failoverLimit)
			}
		}
	}
	t.Logf("windows: %d (key, window) pairs with admissions, %d full, %d over the limit", len(admitted), full, over)
	if over > 0 {
		failed = true
	}
	if full < failoverKeys {
		t.Errorf("(key, window) pairs that reached the limit = %d, want at least %d: the load does not test the limit", full, failoverKeys)
	}
	if failed {
		t.Logf("engine log (%d lines, first %d):\n%s", r.logs.total(), len(r.logs.lines()), strings.Join(r.logs.lines(), "\n"))
	}
}

// untilBound waits out the recovery bound and the observation after it.
func untilBound(promoted time.Time) {
	time.Sleep(time.Until(promoted.Add(failoverRecovery + failoverObserve)))
}

// TestFailoverCluster kills one master of a 3-master, 3-replica cluster (node
// timeout 1s) under load. With cluster-require-full-coverage no, the other
// masters serve their keys throughout; with Redis's default yes, they answer
// CLUSTERDOWN from when the dead master is marked failed until the promotion,
// and their keys must recover as the dead master's do.
func TestFailoverCluster(t *testing.T) {
	for _, full := range []bool{false, true} {
		t.Run(fmt.Sprintf("full coverage %v", full), func(t *testing.T) {
			testFailoverCluster(t, full)
		})
	}
}

func testFailoverCluster(t *testing.T, fullCoverage bool) {
	c := redistest.StartCluster(t, redistest.WithReplicas(1), redistest.WithNodeTimeout(failoverNodeTimeout), redistest.WithFullCoverage(fullCoverage))
	r := startFailoverRun(t, c.URL(), true)

	masterOf := make([]*redistest.Server, failoverKeys)
	perMaster := map[*redistest.Server]int{}
	for i, k := range r.keys {
		masterOf[i] = c.MasterForSlot(t, algo.Slot(k))
		perMaster[masterOf[i]]++
	}
	for _, m := range c.Nodes() {
		if perMaster[m] < failoverKeys/10 {
			t.Fatalf("keys on master %s = %d, want at least %d: the keys must spread over every master", m.Addr, perMaster[m], failoverKeys/10)
		}
	}
	dead := masterOf[0]
	replica := c.ReplicaOf(t, dead)
	r.waitSaturated(t)

	// The kill's time is when the signal goes: Kill waits for the process to exit,
	// and an answer that fails in that wait comes after the kill, not before it.
	killed := time.Now()
	dead.Kill()
	promoted := c.WaitPromoted(t, replica, 15*time.Second)
	untilBound(promoted)
	r.check(t, failover{killed: killed, promoted: promoted, onDead: func(k int) bool { return masterOf[k] == dead }, allDown: fullCoverage})
}

// TestFailoverSentinel kills the master of a Sentinel group under load, with
// down-after 1s and 3s. The bound counts from the promotion, when the replica
// reports role:master, as the cluster test counts from CLUSTER NODES, though a
// Sentinel client learns of it only when the first Sentinel names the replica
// (about 0.8s later here). With 3s the
// breaker's probe wait has grown to 1.6s or more by then, so only the store's
// +switch-master subscription brings the keys back within the bound.
func TestFailoverSentinel(t *testing.T) {
	for _, downAfter := range []time.Duration{failoverNodeTimeout, 3 * time.Second} {
		t.Run(fmt.Sprintf("down-after %v", downAfter), func(t *testing.T) {
			testFailoverSentinel(t, downAfter)
		})
	}
}

func testFailoverSentinel(t *testing.T, downAfter time.Duration) {
	s := redistest.StartSentinel(t, redistest.WithDownAfter(downAfter))
	r := startFailoverRun(t, s.URL(), false)
	r.waitSaturated(t)

	killed := time.Now() // before the signal, as in testFailoverCluster
	s.Master().Kill()
	p := s.WaitPromoted(t, s.Replica(), 20*time.Second)
	t.Logf("replica role:master %v after the kill, named by the first Sentinel %v, by all %v",
		p.Promoted.Sub(killed).Round(time.Millisecond), p.Announced.Sub(killed).Round(time.Millisecond), p.Agreed.Sub(killed).Round(time.Millisecond))
	untilBound(p.Announced)
	r.check(t, failover{killed: killed, promoted: p.Promoted, onDead: func(int) bool { return true }})
}

// lineLog keeps the first max lines written to it and counts them all.
type lineLog struct {
	mu    sync.Mutex
	max   int
	kept  []string
	count int
}

func (l *lineLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range bytes.Split(bytes.TrimRight(p, "\n"), []byte("\n")) {
		l.count++
		if len(l.kept) < l.max {
			l.kept = append(l.kept, string(line))
		}
	}
	return len(p), nil
}

func (l *lineLog) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.kept...)
}

func (l *lineLog) total() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.count
}
