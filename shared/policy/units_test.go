package policy_test

import (
	"errors"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestCalendarUnitsWithoutCalendar checks that COUNT/week and COUNT/month need no
// calendar field: they are the calendar's windows in UTC, the same limit as
// calendar: {timezone: UTC}, with the same keys; and that every spelling of a unit
// that docs/policy.md lists reads as its unit.
func TestCalendarUnitsWithoutCalendar(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ short, long string }{
		{"10000/month", "{algorithm: fixed_window, rate: 10000/month, calendar: {timezone: UTC}}"},
		{"5/week", "{algorithm: fixed_window, rate: 5/week, calendar: {}}"},
		{"5/Week", "{algorithm: fixed_window, rate: 5/week, calendar: {timezone: UTC}}"},
	} {
		a := mustParse(t, rule("{algorithm: fixed_window, rate: "+tt.short+"}"))
		b := mustParse(t, rule(tt.long))
		la, lb := a.Rules[0].Limits[0], b.Rules[0].Limits[0]
		if la.String() != lb.String() || la.Calendar.Unit != lb.Calendar.Unit || la.Period != lb.Period || la.Count != lb.Count {
			t.Errorf("rate: %s = %v, want %s's %v", tt.short, la, tt.long, lb)
		}
		attrs := map[string]string{}
		if ka, kb := a.Match(attrs)[0].Meters[0].Key, b.Match(attrs)[0].Meters[0].Key; ka != kb {
			t.Errorf("rate: %s has key %s, want %s's %s", tt.short, ka, tt.long, kb)
		}
	}
	for spelling, want := range map[string]time.Duration{
		"ms": time.Millisecond, "s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
		"min": time.Minute, "m": time.Minute, "minute": time.Minute, "minutes": time.Minute,
		"h": time.Hour, "hour": time.Hour, "hours": time.Hour, "day": 24 * time.Hour, "d": 24 * time.Hour, "days": 24 * time.Hour,
	} {
		p := mustParse(t, rule("{algorithm: gcra, rate: 5/"+spelling+"}"))
		if got := p.Rules[0].Limits[0].Period; got != want {
			t.Errorf("rate: 5/%s has period %v, want %v", spelling, got, want)
		}
	}
}

// TestCalendarUnitErrors checks the messages of a week or a month that cannot be one.
func TestCalendarUnitErrors(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"{algorithm: gcra, rate: 100/month}":           `rules[0].limits[0].rate: "100/month": a month is a window of the calendar, which only fixed_window counts; use algorithm: fixed_window, or a period in days such as 100/30day`,
		"{algorithm: token_bucket, rate: 7/week}":      `rules[0].limits[0].rate: "7/week": a week is a window of the calendar, which only fixed_window counts; use algorithm: fixed_window, or a period in days such as 7/7day`,
		"{algorithm: fixed_window, rate: 1/2month}":    `rules[0].limits[0].rate: "1/2month": a calendar month takes no multiplier; write COUNT/month, or a period in days such as 1/30day`,
		"{algorithm: fixed_window, rate: 1/fortnight}": `rules[0].limits[0].rate: "1/fortnight": unknown unit "fortnight"; use ms, s, min, h, day, week or month`,
	} {
		_, err := policy.Parse([]byte(rule(in)))
		var ve *policy.ValidationError
		if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Path+": "+ve.Problems[0].Msg != want {
			t.Errorf("Parse(%s) = %v, want %s", in, err, want)
		}
	}
}
