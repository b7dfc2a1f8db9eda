package redisstore_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestAccuracyTable measures, per algorithm, the most requests a limit of L per W
// admits within any W-long span, on real Redis with explicit times, in two schedules:
//
//   - boundary burst: L requests in the last millisecond before a window edge E
//     (10 µs apart), then L in the first millisecond after it;
//   - burst then flood: the same L before E, then one request every 25 ms for 2W.
//
// The known bounds are asserted: fixed_window admits exactly 2L at the boundary
// and at most 2L anywhere; sliding_log exactly L in both; sliding_window and
// bucket_ring (ten buckets) at most 2L, since a W-long span overlaps at most two of
// their counting periods; token_bucket, gcra and leaky_bucket (burst L) exactly their
// burst at the boundary (2 ms refill is 0.02 of a unit) and at most burst + L in a W
// span (the burst plus less than W of refill). The table is logged.
func TestAccuracyTable(t *testing.T) {
	const (
		L     = 100
		W     = 10 * time.Second
		flood = 25 * time.Millisecond
	)
	t.Parallel()
	srv := redistest.StartServer(t)
	store := loadedStore(t, srv.Client(t))
	ctx := context.Background()
	w := W.Microseconds()
	edge := (serverTime(t, srv.Client(t))/w + 1) * w

	type schedule struct {
		name string
		at   []int64 // request times, Unix µs, ascending
	}
	var burst, flooded []int64
	for i := range L {
		burst = append(burst, edge-1000+int64(i)*10)
	}
	flooded = append(flooded, burst...)
	for at := edge; at < edge+2*w; at += flood.Microseconds() {
		flooded = append(flooded, at)
	}
	for i := range L {
		burst = append(burst, edge+int64(i)*10)
	}
	schedules := []schedule{{"boundary burst", burst}, {"burst then flood", flooded}}

	tests := []struct {
		a        algo.Algorithm
		boundary int // exact admitted at the boundary; 0: only the bound holds
		bound    int // most admitted in any W span, in every schedule
	}{
		{algo.FixedWindow, 2 * L, 2 * L},
		{algo.SlidingLog, L, L},
		{algo.SlidingWindow, 0, 2 * L},
		{algo.TokenBucket, L, 2 * L},
		{algo.LeakyBucket, L, 2 * L},
		{algo.GCRA, L, 2 * L},
		{algo.BucketRing, 0, 2 * L},
	}
	rows := make([]string, len(tests))
	t.Run("group", func(t *testing.T) {
		for i, tt := range tests {
			t.Run(string(tt.a), func(t *testing.T) {
				t.Parallel()
				m := meterOf(tt.a, L, W)
				cells := []string{fmt.Sprintf("`%s`", m.Limits[0])}
				for si, s := range schedules {
					key := algo.Key("acc:", string(tt.a), "r", "", strconv.Itoa(si))
					var admitted []int64
					before := 0
					for _, at := range s.at {
						o, err := store.Decide(ctx, algo.Check{Keys: []string{key}, Meters: []algo.Meter{m}, Cost: 1, NowMicros: at})
						if err != nil {
							t.Fatal(err)
						}
						if o.Allowed {
							admitted = append(admitted, at)
							if at < edge {
								before++
							}
						}
					}
					got := maxInSpan(admitted, w)
					cells = append(cells, fmt.Sprintf("%d + %d", before, len(admitted)-before), fmt.Sprint(got))
					if s.name == "boundary burst" && tt.boundary != 0 && got != tt.boundary {
						t.Errorf("%s: most admitted in a %v span by Check(%s) = %d, want %d", s.name, W, m.Limits[0], got, tt.boundary)
					}
					if got > tt.bound {
						t.Errorf("%s: most admitted in a %v span by Check(%s) = %d, want at most %d", s.name, W, m.Limits[0], got, tt.bound)
					}
				}
				cells = append(cells, fmt.Sprint(tt.bound))
				rows[i] = "| " + strings.Join(cells, " | ") + " |"
			})
		}
	})
	t.Logf("L = %d per W = %v; before + after the edge, and the most admitted in any W-long span:\n"+
		"| limit | boundary burst: admitted | boundary burst: max in W | burst then flood: admitted | burst then flood: max in W | asserted bound |\n"+
		"| --- | --- | --- | --- | --- | --- |\n%s", L, W, strings.Join(rows, "\n"))
}
