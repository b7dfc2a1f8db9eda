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
