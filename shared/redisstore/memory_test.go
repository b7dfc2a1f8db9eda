package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// memoryInfo returns the field of INFO memory named name (used_memory,
// used_memory_vm_functions, ...), in bytes.
func memoryInfo(t *testing.T, c redis.Cmdable, name string) int64 {
	t.Helper()
	n, err := redisinfo.Int(context.Background(), c, "memory", name)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestMemoryTable measures the Redis memory one tracked client costs, per algorithm:
// 10,000 clients each make one request (the library's decide entry through a pipeline, on
// the server's clock) on keys named as the policy names them
// ("tg:{client-000123}per-key::0.a1b2c3d4"); then the average of MEMORY USAGE over the keys
// (key, value, and the main dictionary's entry), and the growth of INFO used_memory
// (which also counts the expiry dictionary and the dictionaries' growth), per client.
// The targets are asserted on MEMORY USAGE: gcra and fixed_window at most 100 bytes,
// token_bucket at most 150. The table is logged.
func TestMemoryTable(t *testing.T) {
	t.Parallel()
	const clients, chunk = 10000, 500
	ctx := context.Background()
	decide := algo.Lua().Function(algo.EntryDecide)

	// Every state must outlive the measurement, so the limits are per day: one
	// request's state then lives 864 s (token_bucket, gcra, leaky_bucket) or until the
	// end of the day (fixed_window). bucket_ring has the design's three tiers on a
	// ring of fifteen buckets, in minutes rather than seconds (1 min / 10 min / 15 min,
	// the same hash of one bucket and "l"), so that it lives 15 minutes, not 15 s.
	tiers := algo.Meter{Limits: []algo.Limit{
		{Algorithm: algo.BucketRing, Count: 10, Period: time.Minute},
		{Algorithm: algo.BucketRing, Count: 50, Period: 10 * time.Minute},
		{Algorithm: algo.BucketRing, Count: 60, Period: 15 * time.Minute},
	}}
	const day = 24 * time.Hour
	tests := []struct {
		m      algo.Meter
		target int64 // most bytes per client by MEMORY USAGE; 0: none
	}{
		{meterOf(algo.FixedWindow, 100, day), 100},
		{meterOf(algo.SlidingLog, 100, day), 0},
		{meterOf(algo.SlidingWindow, 100, day), 0},
		{meterOf(algo.TokenBucket, 100, day), 150},
		{meterOf(algo.LeakyBucket, 100, day), 0},
		{meterOf(algo.GCRA, 100, day), 100},
		{tiers, 0},
	}
	rows := make([]string, len(tests))
	t.Run("group", func(t *testing.T) {
		for i, tt := range tests {
			a := tt.m.Algorithm()
			t.Run(string(a), func(t *testing.T) {
				// Each algorithm on a server of its own, so that used_memory grows by its
				// keys alone.
				t.Parallel()
				client := redistest.StartServer(t).Client(t)
				loadLua(t, client)
				if a == algo.FixedWindow {
					// Its day must not end inside the run.
					awayFromEdge(t, client, day, time.Minute)
				}
				meters := []algo.Meter{tt.m}
				args := algo.DecideArgs(meters, 1, 0, false)
				before := memoryInfo(t, client, "used_memory")
				for from := 0; from < clients; from += chunk {
					pipe := client.Pipeline()
					cmds := make([]*redis.Cmd, 0, chunk)
					for i := from; i < from+chunk; i++ {
						key := algo.Key("tg:", fmt.Sprintf("client-%06d", i), "per-key", "", algo.MeterID(0, tt.m))
						cmds = append(cmds, pipe.FCall(ctx, decide, []string{key}, args...))
					}
					if _, err := pipe.Exec(ctx); err != nil {
						t.Fatal(err)
					}
					for _, cmd := range cmds {
						rep, err := algo.ParseDecideReply(cmd.Val(), meters)
						if err != nil || !rep.Allowed {
							t.Fatalf("first request of a client: allowed %v, %v, want allowed", rep.Allowed, err)
						}
					}
				}
				after := memoryInfo(t, client, "used_memory")

				keys := scanKeys(t, client, "*")
				var usage int64
				for from := 0; from < len(keys); from += chunk {
					pipe := client.Pipeline()
					var cmds []*redis.IntCmd
					for _, k := range keys[from:min(from+chunk, len(keys))] {
						cmds = append(cmds, pipe.MemoryUsage(ctx, k, 0))
					}
					if _, err := pipe.Exec(ctx); err != nil {
						t.Fatal(err)
					}
					for _, cmd := range cmds {
						usage += cmd.Val()
					}
				}
				perClient := usage / clients
				var limits []string
				for _, l := range tt.m.Limits {
					limits = append(limits, strings.TrimPrefix(l.String(), string(a)+" "))
				}
				rows[i] = fmt.Sprintf("| `%s` | %s | %.2f | %d | %d |",
					a, strings.Join(limits, ", "), float64(len(keys))/clients, perClient, (after-before)/clients)
				if len(keys) != clients {
					t.Errorf("%d clients' first Check(%s) left %d keys, want %d", clients, a, len(keys), clients)
				}
				if tt.target > 0 && perClient > tt.target {
					t.Errorf("MEMORY USAGE per client of Check(%s) = %d bytes, want at most %d", tt.m.Limits[0], perClient, tt.target)
				}
			})
		}
	})
	t.Logf("bytes per tracked client, %d clients, one request each:\n"+
		"| algorithm | limits | keys per client | MEMORY USAGE per client | used_memory growth per client |\n"+
		"| --- | --- | --- | --- | --- |\n%s", clients, strings.Join(rows, "\n"))
}
