package redisstore_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestCalendarConformance runs calendar quotas (a day, a week, a month, in Berlin,
// New York and UTC) through the Go model and the Lua script on real Redis, on an
// injected clock that crosses DST changes, month ends and a leap day, with and
// without a recorded value and beside a second meter, and requires the same
// decisions; then it checks the key the script wrote is named by its window's start
// and lives until the window's end.
func TestCalendarConformance(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	zones := []string{"Europe/Berlin", "America/New_York", "UTC"}
	edges := []string{"2026-03-29T00:30:00Z", "2026-03-31T21:30:00Z", "2026-10-25T00:30:00Z", "2026-11-01T05:30:00Z", "2028-02-29T23:30:00Z", "2026-12-31T22:30:00Z"}
	units := []algo.CalendarUnit{algo.CalendarDay, algo.CalendarWeek, algo.CalendarMonth}
	decisions := 0
	for seq := range 150 {
		r := rand.New(rand.NewPCG(uint64(seq), 99))
		zone, err := time.LoadLocation(zones[r.IntN(len(zones))])
		if err != nil {
			t.Fatal(err)
		}
		l := algo.NewCalendarLimit(1+r.Int64N(6), units[r.IntN(len(units))], zone)
		m := algo.Meter{Limits: []algo.Limit{l}}
		if r.IntN(2) == 0 {
			m.Record = fmt.Sprintf("user-%d", r.IntN(3))
		}
		keys, meters := []string{algo.Key("cal:", fmt.Sprint(seq), "r", "", "0")}, []algo.Meter{m}
		if r.IntN(2) == 0 {
			keys = append(keys, algo.Key("cal:", fmt.Sprint(seq), "r", "", "1"))
			meters = append(meters, algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 5, Period: time.Hour, Burst: 8}}})
		}
		ms := memstore.New(0, nil)
		at, _ := time.Parse(time.RFC3339, edges[r.IntN(len(edges))])
		now := at.UnixMicro()
		for i := range 25 {
			now += r.Int64N(int64(20 * time.Minute / time.Microsecond))
			cost := int64(1 + r.IntN(2))
			c := algo.Check{Keys: keys, Meters: meters, Cost: cost, NowMicros: now}
			want, err := ms.Decide(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			got, err := rs.Decide(ctx, c)
			if err != nil {
				t.Fatalf("seq %d step %d: redis: %v", seq, i, err)
			}
			decisions++
			if got.Allowed != want.Allowed {
				t.Fatalf("seq %d step %d (%v at %s, cost %d): allowed lua %v, model %v\nlua   %+v\nmodel %+v", seq, i, l, time.UnixMicro(now).UTC(), cost, got.Allowed, want.Allowed, got.Decisions, want.Decisions)
			}
			for mi := range want.Decisions {
				for j := range want.Decisions[mi] {
					if !sameDecision(got.Decisions[mi][j], want.Decisions[mi][j]) {
						t.Fatalf("seq %d step %d (%v at %s): meter %d\nlua   %+v\nmodel %+v", seq, i, l, time.UnixMicro(now).UTC(), mi, got.Decisions[mi][j], want.Decisions[mi][j])
					}
				}
			}
		}
	}
	t.Logf("%d identical decisions of calendar quotas", decisions)

	// A key per window, named by its start, expiring at its end.
	berlin, _ := time.LoadLocation("Europe/Berlin")
	l := algo.NewCalendarLimit(10, algo.CalendarMonth, berlin)
	now := time.Now()
	start, end := l.Calendar.Window(now)
	key := algo.Key("calttl:", "k", "r", "", "0")
	if _, err := rs.Decide(ctx, algo.Check{Keys: []string{key}, Meters: []algo.Meter{{Limits: []algo.Limit{l}}}, Cost: 1}); err != nil {
		t.Fatal(err)
	}
	wk := fmt.Sprintf("%s:c%d", key, start.UnixMicro())
	pttl, err := srv.Client(t).PTTL(ctx, wk).Result()
	if err != nil || pttl <= 0 {
		t.Fatalf("PTTL(%s) = %v, %v; want the window's key with a TTL", wk, pttl, err)
	}
	if left := time.Until(end); pttl < left-2*time.Second || pttl > left+2*time.Second {
		t.Errorf("PTTL(%s) = %v, want about %v (until the month ends in Berlin)", wk, pttl, left)
	}
}

// TestCalendarMonthResetsAtLocalMidnight runs a month quota of 3 in Europe/Berlin
// through the Lua script on a real redis-server and through the Go model, on an
// injected clock across the change to summer time (March 29, 2026): both deny until
// local midnight on April 1 (22:00 UTC, an hour earlier than in winter) and admit
// from that instant, with the same decisions.
func TestCalendarMonthResetsAtLocalMidnight(t *testing.T) {
	srv := redistest.StartServer(t)
	rs, err := redisstore.New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	m := algo.Meter{Limits: []algo.Limit{algo.NewCalendarLimit(3, algo.CalendarMonth, berlin)}}
	steps := []struct {
		at             string
		allowed        bool
		remaining      int64
		retry, resetIn time.Duration
	}{
		{"2026-03-01T00:00:00Z", true, 2, 0, 0},
		{"2026-03-15T00:00:00Z", true, 1, 0, 0},
		{"2026-03-31T21:00:00Z", true, 0, 0, 0},
		{"2026-03-31T21:59:59Z", false, 0, time.Second, time.Second},
		{"2026-03-31T22:00:00Z", true, 2, 0, 30 * 24 * time.Hour},
	}
	ms := memstore.New(10, time.Now)
	ctx := context.Background()
	for _, s := range steps {
		now, err := time.Parse(time.RFC3339, s.at)
		if err != nil {
			t.Fatal(err)
		}
		c := algo.Check{Keys: []string{algo.Key("calreset:", "k", "r", "", "0")}, Meters: []algo.Meter{m}, Cost: 1, NowMicros: now.UnixMicro()}
		for name, st := range map[string]interface {
			Decide(context.Context, algo.Check) (algo.Outcome, error)
		}{"lua": rs, "model": ms} {
			out, err := st.Decide(ctx, c)
			if err != nil {
				t.Fatalf("%s: Decide(%s) = %v", name, s.at, err)
			}
			d := out.Decisions[0][0]
			if d.Allowed != s.allowed || d.Remaining != s.remaining || d.RetryAfter != s.retry || (s.resetIn != 0 && d.ResetAfter != s.resetIn) {
				t.Errorf("%s: Decide(%s) = %+v, want allowed %v, remaining %d, retry after %v, reset after %v", name, s.at, d, s.allowed, s.remaining, s.retry, s.resetIn)
			}
		}
	}
}
