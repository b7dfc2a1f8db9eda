package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/breaker"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestDeadMasterFailsOnlyItsKeys kills one master of a cluster and checks every path
// to Redis (Store.Decide on one slot, the multi-slot path, the batcher, Health)
// against the per-node breakers: the dead master's keys fail, a request that spans it
// and a healthy master fails as a whole without charging the healthy one, and the
// healthy masters' keys are decided.
func TestDeadMasterFailsOnlyItsKeys(t *testing.T) {
	cl := redistest.StartCluster(t)
	for _, n := range cl.Nodes() {
		n.Do(t, "CONFIG", "SET", "cluster-require-full-coverage", "no")
	}
	s, err := redisstore.Open(redisstore.Config{URL: cl.URL(), Cluster: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	// One failure opens a breaker, which then stays open for the whole test.
	s.UseBreakers(breaker.Settings{Failures: 1, FirstProbe: time.Hour, OpenFor: time.Hour})
	// b batches, on the same client, with breakers of its own that take the same
	// settings.
	b := batched(t, s, batchOn)
	b.UseBreakers(breaker.Settings{Failures: 1, FirstProbe: time.Hour, OpenFor: time.Hour})
	victim := cl.Nodes()[0]
	cc := cl.Client(t)
	keyOn := func(wantVictim bool) string {
		for i := 0; ; i++ {
			k := fmt.Sprintf("test:{nodes-%d}", i)
			c, err := cc.MasterForKey(ctx, k)
			if err != nil {
				t.Fatal(err)
			}
			if (c.Options().Addr == victim.Addr) == wantVictim {
				return k
			}
		}
	}
	dead, healthy := keyOn(true), keyOn(false)
	m := meterOf(algo.FixedWindow, 10, time.Hour)
	one := func(k string) algo.Check { return algo.Check{Keys: []string{k}, Meters: []algo.Meter{m}, Cost: 1} }
	remaining := func(t *testing.T, k string) int64 {
		t.Helper()
		out, err := s.Decide(ctx, algo.Check{Keys: []string{k}, Meters: []algo.Meter{m}, Cost: 0})
		if err != nil {
			t.Fatalf("Decide(peek %s) = %v", k, err)
		}
		return out.Decisions[0][0].Remaining
	}

	victim.Kill()
	for _, d := range []*redisstore.Store{s, b} {
		if _, err := d.Decide(ctx, one(dead)); err == nil || errors.Is(err, breaker.ErrOpen) {
			t.Fatalf("Decide(key on the dead master) = %v, want the connection's error", err)
		}
	}
	tests := []struct {
		name    string
		decide  func(context.Context, algo.Check) (algo.Outcome, error)
		check   algo.Check
		wantErr bool
	}{
		{"store, dead master", s.Decide, one(dead), true},
		{"batcher, dead master", b.Decide, one(dead), true},
		{"store, healthy master", s.Decide, one(healthy), false},
		{"batcher, healthy master", b.Decide, one(healthy), false},
		{"store, both masters", s.Decide, algo.Check{Keys: []string{healthy, dead}, Meters: []algo.Meter{m, m}, Cost: 1}, true},
		{"batcher, both masters", b.Decide, algo.Check{Keys: []string{healthy, dead}, Meters: []algo.Meter{m, m}, Cost: 1}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := remaining(t, healthy)
			out, err := tt.decide(ctx, tt.check)
			if tt.wantErr {
				if !errors.Is(err, breaker.ErrOpen) {
					t.Fatalf("Decide(%v) = %v, want the open breaker's error", tt.check.Keys, err)
				}
				if got := remaining(t, healthy); got != before {
					t.Errorf("healthy key remaining %d after a request that failed, want %d (nothing charged)", got, before)
				}
				return
			}
			if err != nil || !out.Allowed {
				t.Fatalf("Decide(%v) = %+v, %v, want allowed", tt.check.Keys, out, err)
			}
		})
	}
	for _, st := range b.Breakers() {
		if want := st.Node == victim.Addr; (st.State == breaker.Open) != want {
			t.Errorf("breaker of %s = %v, want open only for the dead %s", st.Node, st.State, victim.Addr)
		}
	}
	sts := b.Health(ctx)
	if len(sts) != 3 {
		t.Fatalf("Health() = %v, want 3 masters", sts)
	}
	for _, st := range sts {
		if (st.Err != nil) != (st.Node == victim.Addr) {
			t.Errorf("Health() of %s = %v, want an error only for the dead %s", st.Node, st.Err, victim.Addr)
		}
	}
	if err := s.Ping(ctx); err != nil {
		t.Errorf("Ping() with two masters of three up = %v, want nil", err)
	}
}
