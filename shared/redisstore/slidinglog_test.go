package redisstore_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestSlidingLogMembersStayUnique checks that every admitted unit of a sliding_log
// gets its own sorted-set entry. Members are "<time>:<seq>" with seq taken from the
// live entry count (ZCARD after trimming); when that count has dropped since an
// earlier request at the same microsecond, a new member can equal an existing one,
// ZADD only rescores it, and the unit is admitted without being counted. Each
// sequence is run through the Go model and the script, which must agree.
func TestSlidingLogMembersStayUnique(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	store := loadedStore(t, srv.Client(t))
	ctx := context.Background()
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 3, Period: 10 * time.Second}}}
	base := serverTime(t, srv.Client(t))
	type step struct {
		at   int64 // µs after base
		cost int64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			// Two entries expire when a request 9.7 s later trims them; then the clock
			// steps back to an instant that already has an entry (an NTP step on the
			// server, or callers passing their own times).
			name: "clock steps back after a trim",
			steps: []step{
				{-500_000, 1}, {-400_000, 1}, {0, 1}, // entries at -0.5 s, -0.4 s, 0 ("0:3")
				{9_700_000, 1}, // trims the first two, adds "9.7s:2"
				{0, 1},         // "0:3" again
				{0, 1}, {0, 1}, {0, 1},
			},
		},
		{
			name:  "no step back",
			steps: []step{{0, 1}, {0, 1}, {100, 1}, {100, 1}, {10_000_000, 2}, {10_000_050, 1}, {10_000_050, 1}},
		},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := algo.Key("slog:", "client-1", "seq", "", strconv.Itoa(i))
			model := memstore.New(0, nil)
			for j, s := range tt.steps {
				c := algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: s.cost, NowMicros: base + s.at}
				want, err := model.Decide(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				got, err := store.Decide(ctx, c)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed != want.Allowed || !sameDecision(got.Decisions[0][0], want.Decisions[0][0]) {
					t.Errorf("step %d: Check(%s, cost %d, base%+dµs) = %+v, want %+v", j, m.Limits[0], s.cost, s.at, got.Decisions[0][0], want.Decisions[0][0])
				}
			}
		})
	}
}
