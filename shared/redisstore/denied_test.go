package redisstore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestDeniedChargesNothing exhausts one limit of every algorithm, then sends it
// denied requests on every path a one-meter request takes: alone (the library's
// decide, or for fixed_window the counted INCRBY, given back with DECRBY), and 64 at
// once through a batching store (the many entry and counted commands in one
// pipeline on a standalone Redis, a pipeline per node on a cluster), with the
// process's clock and a caller's. Every key of the meter must hold the same bytes
// (DUMP) and expiry (PEXPIRETIME) after the denials as before. (Requests of several
// meters, denied by one of them, are TestAllOrNothing's and
// TestAllOrNothingCluster's.)
func TestDeniedChargesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	cl := redistest.StartCluster(t)
	cc := cl.Client(t)
	master := func(key string) *redis.Client {
		m, err := cc.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	topologies := []struct {
		name   string
		client redis.UniversalClient
		node   func(key string) *redis.Client
	}{
		{"standalone", client, func(string) *redis.Client { return client }},
		{"cluster", cc, master},
	}
	for _, top := range topologies {
		alone := loadedStore(t, top.client)
		batching, err := redisstore.NewWithOptions(top.client, redisstore.Options{BatchWait: time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		// (not closed: it shares the client, which the server's helper closes)
		t.Run(top.name+"/mixed batch", func(t *testing.T) {
			// Counted fixed_window requests and the library's gcra ones in the same
			// batches, all denied.
			var checks []algo.Check
			var before []map[string]keyState
			for _, a := range []algo.Algorithm{algo.FixedWindow, algo.GCRA} {
				key := algo.Key("denied:", "mixed-"+string(a), "r", "", "0")
				c := algo.Check{Keys: []string{key}, Meters: []algo.Meter{meterOf(a, 2, time.Hour)}, Cost: 1}
				for range 2 {
					if o, err := alone.Decide(ctx, c); err != nil || !o.Allowed {
						t.Fatalf("%s: allowed %v, %v; want allowed", a, o.Allowed, err)
					}
				}
				checks = append(checks, c)
				before = append(before, snapshot(t, top.node(key), key))
			}
			var wg sync.WaitGroup
			var denied, ran atomic.Int64
			for i := range 64 {
				wg.Go(func() {
					o, err := batching.Decide(ctx, checks[i%2])
					if err == nil {
						ran.Add(1)
						if !o.Allowed {
							denied.Add(1)
						}
					}
				})
			}
			wg.Wait()
			if ran.Load() != 64 || denied.Load() != 64 {
				t.Fatalf("%d of 64 requests answered, %d denied; want 64 and 64", ran.Load(), denied.Load())
			}
			for i, c := range checks {
				if d := diffSnapshots(before[i], snapshot(t, top.node(c.Keys[0]), c.Keys[0])); d != "" {
					t.Errorf("%s: 32 denied requests in mixed batches changed the meter's keys:%s", c.Meters[0].Algorithm(), d)
				}
			}
		})
		for _, a := range algo.Algorithms {
			for _, clock := range []string{"process", "caller"} {
				t.Run(fmt.Sprintf("%s/%s/%s", top.name, a, clock), func(t *testing.T) {
					m := meterOf(a, 5, time.Hour)
					key := algo.Key("denied:", fmt.Sprintf("%s-%s", a, clock), "r", "", "0")
					var now int64
					if clock == "caller" {
						now = time.Now().UnixMicro()
					}
					check := algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: 1, NowMicros: now}
					for i := range 5 {
						if o, err := alone.Decide(ctx, check); err != nil || !o.Allowed {
							t.Fatalf("request %d of 5: allowed %v, %v; want allowed", i+1, o.Allowed, err)
						}
					}
					before := snapshot(t, top.node(key), key)
					if len(before) == 0 {
						t.Fatalf("no key starting with %s after 5 admitted requests", key)
					}
					if o, err := alone.Decide(ctx, check); err != nil || o.Allowed {
						t.Fatalf("alone, request 6 of 5: allowed %v, %v; want denied", o.Allowed, err)
					}
					var wg sync.WaitGroup
					errs := make(chan error, 64)
					for range 64 {
						wg.Go(func() {
							o, err := batching.Decide(ctx, check)
							if err == nil && o.Allowed {
								err = fmt.Errorf("a batched request past the limit was allowed")
							}
							if err != nil {
								errs <- err
							}
						})
					}
					wg.Wait()
					close(errs)
					for err := range errs {
						t.Fatal(err)
					}
					if d := diffSnapshots(before, snapshot(t, top.node(key), key)); d != "" {
						t.Errorf("65 denied requests changed the meter's keys:%s", d)
					}
				})
			}
		}
	}
}
