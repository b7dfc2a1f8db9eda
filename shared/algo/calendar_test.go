package algo_test

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
)

func mustZone(t *testing.T, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatal(err)
	}
	return loc
}

// TestCalendarWindow checks calendar windows against the calendar: local midnight,
// days of 23 and 25 hours at Berlin's DST changes, months of their own length, weeks
// from Monday.
func TestCalendarWindow(t *testing.T) {
	t.Parallel()
	berlin := mustZone(t, "Europe/Berlin")
	utc := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	tests := []struct {
		unit       algo.CalendarUnit
		zone       *time.Location
		at         string
		start, end string
		length     time.Duration
	}{
		{algo.CalendarDay, berlin, "2026-03-29T12:00:00Z", "2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z", 23 * time.Hour},
		{algo.CalendarDay, berlin, "2026-10-25T12:00:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * time.Hour},
		{algo.CalendarDay, berlin, "2026-10-24T22:30:00Z", "2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z", 25 * time.Hour},
		{algo.CalendarMonth, berlin, "2026-03-31T21:59:59Z", "2026-02-28T23:00:00Z", "2026-03-31T22:00:00Z", 31*24*time.Hour - time.Hour},
		{algo.CalendarMonth, berlin, "2026-03-31T22:00:00Z", "2026-03-31T22:00:00Z", "2026-04-30T22:00:00Z", 30 * 24 * time.Hour},
		{algo.CalendarMonth, berlin, "2026-02-10T00:00:00Z", "2026-01-31T23:00:00Z", "2026-02-28T23:00:00Z", 28 * 24 * time.Hour},
		{algo.CalendarMonth, nil, "2028-02-29T23:59:59Z", "2028-02-01T00:00:00Z", "2028-03-01T00:00:00Z", 29 * 24 * time.Hour},
		{algo.CalendarWeek, berlin, "2026-11-25T10:00:00Z", "2026-11-22T23:00:00Z", "2026-11-29T23:00:00Z", 7 * 24 * time.Hour},
		{algo.CalendarWeek, berlin, "2026-03-29T21:59:00Z", "2026-03-22T23:00:00Z", "2026-03-29T22:00:00Z", 7*24*time.Hour - time.Hour},
	}
	for _, tt := range tests {
		c := algo.Calendar{Unit: tt.unit, Zone: tt.zone}
		start, end := c.Window(utc(tt.at))
		if !start.Equal(utc(tt.start)) || !end.Equal(utc(tt.end)) || end.Sub(start) != tt.length {
			t.Errorf("%s window at %s = [%s, %s) (%v), want [%s, %s) (%v)", tt.unit, tt.at,
				start.UTC().Format(time.RFC3339), end.UTC().Format(time.RFC3339), end.Sub(start), tt.start, tt.end, tt.length)
		}
	}
}

// TestCalendarQuotaResets runs a month quota of 3 in Europe/Berlin through the Go
// model on an injected clock: it resets at local midnight on the 1st, an hour earlier
// in UTC once summer time began, and its reset counts down to that instant.
func TestCalendarQuotaResets(t *testing.T) {
	t.Parallel()
	l := algo.NewCalendarLimit(3, algo.CalendarMonth, mustZone(t, "Europe/Berlin"))
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	m := algo.Meter{Limits: []algo.Limit{l}}
	st := memstore.New(10, time.Now)
	decide := func(at string) algo.Decision {
		now, err := time.Parse(time.RFC3339, at)
		if err != nil {
			t.Fatal(err)
		}
		out, err := st.Decide(context.Background(), algo.Check{Keys: []string{"k"}, Meters: []algo.Meter{m}, Cost: 1, NowMicros: now.UnixMicro()})
		if err != nil {
			t.Fatal(err)
		}
		return out.Decisions[0][0]
	}
	for _, at := range []string{"2026-03-01T00:00:00Z", "2026-03-15T00:00:00Z", "2026-03-31T21:00:00Z"} {
		if d := decide(at); !d.Allowed {
			t.Fatalf("%s: denied within the quota", at)
		}
	}
	d := decide("2026-03-31T21:59:59Z")
	if d.Allowed || d.RetryAfter != time.Second || d.Period != 743*time.Hour {
		t.Errorf("at 21:59:59Z on March 31: %+v, want a denial until local midnight (1s) in a 743h month", d)
	}
	if d := decide("2026-03-31T22:00:00Z"); !d.Allowed || d.Remaining != 2 || d.ResetAfter != 30*24*time.Hour {
		t.Errorf("at local midnight on April 1: %+v, want the new month's first unit and 30 days to its reset", d)
	}
}
