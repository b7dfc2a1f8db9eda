package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestRefund charges 10 units on a real redis-server and on the in-process store,
// gives 4 back, and checks that both then have 6 charged: at the charge's time, a
// moment later, and in the next window (where a window's units stay, or count as
// the previous window's). Redis and memstore must agree, as the models and the
// scripts do.
func TestRefund(t *testing.T) {
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: "redis://" + srv.Addr})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const t0 = int64(1_700_000_000_000_000) // a window's start
	for _, tc := range []struct {
		name  string
		limit algo.Limit
		at    int64 // the refund's time after the charge, µs
		want  int64 // remaining after the refund, peeked at the refund's time
	}{
		{"fixed_window", algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Second}, 0, 94},
		{"fixed_window next window", algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Second}, 1_000_000, 100},
		{"sliding_window", algo.Limit{Algorithm: algo.SlidingWindow, Count: 100, Period: time.Second}, 0, 94},
		// Half the previous window's 6 units still weigh.
		{"sliding_window next window", algo.Limit{Algorithm: algo.SlidingWindow, Count: 100, Period: time.Second}, 1_500_000, 97},
		{"token_bucket", algo.Limit{Algorithm: algo.TokenBucket, Count: 100, Period: time.Second}, 0, 94},
		{"gcra", algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second}, 0, 94},
		// 20ms later 2 of the 10 units have drained; the refund gives back 4 less
		// the 2 the time since made up for: 6 units charged.
		{"gcra later", algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second}, 20_000, 94},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := []algo.Meter{{Limits: []algo.Limit{tc.limit}}}
			keys := []string{"tg:{refund}" + tc.name}
			mem := memstore.New(0, nil)
			for _, s := range []struct {
				name   string
				decide func(context.Context, algo.Check) (algo.Outcome, error)
				refund func(context.Context, algo.Check, int64) error
			}{{"redis", st.Decide, st.Refund}, {"memstore", mem.Decide, mem.Refund}} {
				ctx := context.Background()
				out, err := s.decide(ctx, algo.Check{Keys: keys, Meters: m, Cost: 10, NowMicros: t0})
				if err != nil || !out.Allowed {
					t.Fatalf("%s: charge 10 = %+v, %v", s.name, out, err)
				}
				if err := s.refund(ctx, algo.Check{Keys: keys, Meters: m, Cost: 4, NowMicros: t0 + tc.at}, t0); err != nil {
					t.Fatalf("%s: Refund = %v", s.name, err)
				}
				peek, err := s.decide(ctx, algo.Check{Keys: keys, Meters: m, Cost: 0, NowMicros: t0 + tc.at})
				if err != nil {
					t.Fatal(err)
				}
				if got := peek.Decisions[0][0].Remaining; got != tc.want {
					t.Errorf("%s: remaining after the refund = %d, want %d", s.name, got, tc.want)
				}
			}
		})
	}
}
