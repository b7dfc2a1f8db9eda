package redisstore_test

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// durable returns m asking for count replicas within timeout.
func durable(m algo.Meter, count int, timeout time.Duration) algo.Meter {
	m.Replicas = algo.Replicas{Count: count, Timeout: timeout}
	return m
}

// TestDecideWaitsForReplicas decides on a master with one replica, on a batching
// store: a meter that asks for replicas is followed by one WAIT on the master, a
// meter that does not by none; asking for more replicas than there are leaves the
// decision as the master made it and counts the shortfall, for admissions only.
func TestDecideWaitsForReplicas(t *testing.T) {
	t.Parallel()
	master := redistest.StartServer(t)
	_, port, _ := net.SplitHostPort(master.Addr)
	redistest.StartServer(t, redistest.WithArgs("--replicaof", "127.0.0.1", port))
	mc := master.Client(t)
	waitLinked(t, mc)
	store := batched(t, loadedStore(t, mc), batchOn)
	ctx := context.Background()
	one := meterOf(algo.FixedWindow, 2, time.Hour)
	tests := []struct {
		name         string
		meters       []algo.Meter
		allowed      bool
		waits        int64 // WAITs the master runs
		unreplicated int64 // the store's count after the step
	}{
		{"no replicas asked", []algo.Meter{one}, true, 0, 0},
		{"one replica asked", []algo.Meter{durable(one, 1, time.Second)}, true, 1, 0},
		{"one of two meters asks", []algo.Meter{meterOf(algo.GCRA, 5, time.Hour), durable(meterOf(algo.SlidingLog, 5, time.Hour), 1, time.Second)}, true, 1, 0},
		{"more replicas than there are", []algo.Meter{durable(meterOf(algo.TokenBucket, 1, time.Hour), 2, 5*time.Millisecond)}, true, 1, 1},
		{"denied, more replicas than there are", []algo.Meter{durable(meterOf(algo.TokenBucket, 1, time.Hour), 2, 5*time.Millisecond)}, false, 1, 1},
	}
	for i, tt := range tests {
		keys := make([]string, len(tt.meters))
		for j := range keys {
			keys[j] = "{r" + strconv.Itoa(i) + "}m" + strconv.Itoa(j)
		}
		if i == len(tests)-1 {
			keys = []string{"{r3}m0"} // the same key as the step before, which is full
		}
		before := master.CommandCalls(t, "wait")
		out, err := store.Decide(ctx, algo.Check{Keys: keys, Meters: tt.meters, Cost: 1})
		if err != nil {
			t.Fatalf("%s: Decide() = %v", tt.name, err)
		}
		if out.Allowed != tt.allowed {
			t.Errorf("%s: Decide().Allowed = %v, want %v", tt.name, out.Allowed, tt.allowed)
		}
		if got := master.CommandCalls(t, "wait") - before; got != tt.waits {
			t.Errorf("%s: the master ran %d WAITs, want %d", tt.name, got, tt.waits)
		}
		if got := store.Unreplicated(); got != tt.unreplicated {
			t.Errorf("%s: Unreplicated() = %d, want %d", tt.name, got, tt.unreplicated)
		}
	}

	// Concurrent requests, which a batching store would send together, each still get
	// their own WAIT: they bypass the batch.
	const workers, each = 16, 50
	before := master.CommandCalls(t, "wait")
	m := durable(meterOf(algo.FixedWindow, workers*each, time.Hour), 1, time.Second)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for range each {
				out, err := store.Decide(ctx, algo.Check{Keys: []string{"{c}" + strconv.Itoa(w)}, Meters: []algo.Meter{m}, Cost: 1})
				if err != nil || !out.Allowed {
					errs <- fmt.Errorf("Decide() = %+v, %w; want allowed", out, err)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := master.CommandCalls(t, "wait") - before; got != workers*each {
		t.Errorf("%d concurrent decisions through a batching store: the master ran %d WAITs, want %d", workers*each, got, workers*each)
	}
}

// waitLinked waits until the master behind c has a replica in sync.
func waitLinked(t *testing.T, c *redis.Client) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no replica in sync with %s: %v %s", c.Options().Addr, err, info)
		}
	}
}

// TestClusterWaitsOnTheKeysMaster decides a request whose two meters live on two
// masters of a cluster with a replica each; only the meter that asks for replicas is
// waited for, and on its own master (WAIT has no key: sent through the cluster
// client it would go to any node).
func TestClusterWaitsOnTheKeysMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, redistest.WithReplicas(1))
	cc := cl.Client(t)
	store := loadedStore(t, cc)
	ctx := context.Background()
	a, z := "{a}durable", "{z}plain"
	ma, mz := cl.MasterForKey(t, a), cl.MasterForKey(t, z)
	if ma == mz {
		t.Fatalf("%q and %q share master %s; pick keys on two", a, z, ma.Addr)
	}
	for i := range 3 {
		beforeA, beforeZ := ma.CommandCalls(t, "wait"), mz.CommandCalls(t, "wait")
		m := meterOf(algo.GCRA, 10, time.Hour)
		out, err := store.Decide(ctx, algo.Check{Keys: []string{a, z}, Meters: []algo.Meter{durable(m, 1, time.Second), m}, Cost: 1})
		if err != nil || !out.Allowed {
			t.Fatalf("Decide() #%d = %+v, %v; want allowed", i, out, err)
		}
		if ga, gz := ma.CommandCalls(t, "wait")-beforeA, mz.CommandCalls(t, "wait")-beforeZ; ga != 1 || gz != 0 {
			t.Errorf("Decide() #%d: WAITs on the durable key's master %d, on the other %d; want 1 and 0", i, ga, gz)
		}
	}
	if got := store.Unreplicated(); got != 0 {
		t.Errorf("Unreplicated() = %d, want 0 (every master has a replica)", got)
	}
}

// TestDecisionOutlivesItsWait asks for a replica a master does not have, with a
// timeout longer than the client's read deadline: the deadline cuts the WAIT off, and
// the decision the master made before it stands, counted as unreplicated.
func TestDecisionOutlivesItsWait(t *testing.T) {
	t.Parallel()
	master := redistest.StartServer(t)
	store, err := redisstore.Open(redisstore.Config{URL: master.URL(), Timeout: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	m := durable(meterOf(algo.FixedWindow, 1, time.Hour), 1, time.Second)
	for i, want := range []bool{true, false} {
		out, err := store.Decide(context.Background(), algo.Check{Keys: []string{"{cut}"}, Meters: []algo.Meter{m}, Cost: 1})
		if err != nil || out.Allowed != want {
			t.Fatalf("Decide() #%d = %+v, %v; want allowed %v and no error", i, out, err, want)
		}
	}
	if got := store.Unreplicated(); got != 1 {
		t.Errorf("Unreplicated() = %d, want 1 (the admission; the denial charged nothing)", got)
	}
}
