package engine_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestReplicasPrice measures what the replicas option costs: the same closed-loop
// load on a Sentinel group (a master and its replica), through one store and
// batching store, decided by an engine whose limit asks for none and by one whose limit
// asks for one replica (durableReplicas), in alternating phases. It logs decisions/s
// and the p50 and p99 latency of each (the README's failover section quotes them)
// and asserts only correctness: every decision admitted, one WAIT on the master per
// decision that asked for it, none for the others, and Redis counting every
// admission.
func TestReplicasPrice(t *testing.T) {
	s := redistest.StartSentinel(t)
	// Each command may take a second: a WAIT of the replicas option's longest bound,
	// and a loaded machine's slow reply, must not be cut short by the store's timeout.
	store, err := redisstore.Open(redisstore.Config{URL: s.URL(), BatchWait: redisstore.DefaultBatchWait, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	// Load the library first: the first calls on a node without it are sent twice
	// (exec), and so would their WAITs be.
	if err := store.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	const keys, workers, rounds = 30, 32, 3
	phase := 1500 * time.Millisecond
	modes := []string{"", durableReplicas}
	engines := make([]*engine.Engine, len(modes))
	plans := make([][]engine.Plan, len(modes))
	for m, replicas := range modes {
		// A loaded machine must not turn answers into the failure mode's: this test
		// measures the price of replicas, not the timeout.
		// Nor may a replica's acknowledgement late by more than 50ms: WAIT returns as
		// soon as the replica acknowledges, so the longest bound (1s) costs a healthy group nothing.
		replicas = strings.Replace(replicas, "timeout: 50ms", "timeout: 1s", 1)
		p, err := policy.Parse(bytes.Replace(lostPolicy(replicas), []byte("timeout: 250ms"), []byte("timeout: 5s"), 1))
		if err != nil {
			t.Fatal(err)
		}
		if engines[m], err = engine.New(engine.Config{Policy: p, Store: store, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
			t.Fatal(err)
		}
		for i := range keys {
			pl, err := engines[m].Plan(engine.Request{Domain: "test", Attributes: map[string]string{"api_key": fmt.Sprintf("k%d", i)}, Cost: 1})
			if err != nil {
				t.Fatal(err)
			}
			plans[m] = append(plans[m], pl)
		}
	}

	lat := make([][]time.Duration, len(modes)) // every decision's latency, per mode
	took := make([]time.Duration, len(modes))
	var admitted int64
	for r := range rounds {
		for m := range modes {
			before := s.Master().CommandCalls(t, "wait")
			got, elapsed, err := closedLoop(engines[m], plans[m], workers, phase)
			if err != nil {
				t.Fatalf("round %d, replicas %q: %v", r, modes[m], err)
			}
			want := int64(0)
			if modes[m] != "" {
				want = int64(len(got))
			}
			if waits := s.Master().CommandCalls(t, "wait") - before; waits != want {
				t.Errorf("round %d, replicas %q: %d decisions, the master ran %d WAITs, want %d", r, modes[m], len(got), waits, want)
			}
			lat[m] = append(lat[m], got...)
			took[m] += elapsed
			admitted += int64(len(got))
		}
	}
	var counted int64
	for _, pl := range plans[0] {
		// A read is safe to repeat: one a loaded machine timed out is sent again.
		peek, err := engines[0].Peek(context.Background(), pl)
		for try := 0; err != nil && try < 5; try++ {
			peek, err = engines[0].Peek(context.Background(), pl)
		}
		if err != nil {
			t.Fatal(err)
		}
		counted += peek.Decision.Limit - peek.Decision.Remaining
	}
	if counted != admitted {
		t.Errorf("Redis counts %d admissions, the clients saw %d", counted, admitted)
	}
	for m, replicas := range modes {
		slices.Sort(lat[m])
		n := len(lat[m])
		t.Logf("replicas %-26q %7.0f decisions/s  p50 %v  p99 %v  (%d decisions, %d workers on %d keys, %d phases of %v)",
			replicas, float64(n)/took[m].Seconds(), lat[m][n/2].Round(time.Microsecond), lat[m][n*99/100].Round(time.Microsecond), n, workers, keys, rounds, phase)
	}
	t.Logf("admissions answered before their replica acknowledged them (Unreplicated): %d", store.Unreplicated())
}

// closedLoop runs workers that each decide plans in turn, one after another, for d,
// and returns each decision's latency and how long the load ran; a decision that is
// not admitted by the store is an error.
func closedLoop(e *engine.Engine, plans []engine.Plan, workers int, d time.Duration) ([]time.Duration, time.Duration, error) {
	lat := make([][]time.Duration, workers)
	errs := make([]error, workers)
	start := time.Now()
	stop := start.Add(d)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for n := w; time.Now().Before(stop); n += workers {
				t0 := time.Now()
				v := e.Decide(context.Background(), plans[n%len(plans)])
				lat[w] = append(lat[w], time.Since(t0))
				if !v.Allowed || v.Degraded {
					errs[w] = fmt.Errorf("decision %d of worker %d: %+v, want admitted by the store", n, w, v)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	for _, err := range errs {
		if err != nil {
			return nil, 0, err
		}
	}
	return slices.Concat(lat...), elapsed, nil
}
