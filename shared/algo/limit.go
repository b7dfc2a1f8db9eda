// Package algo implements tollgate's rate-limiting algorithms twice: as pure Go
// state-transition functions (the specification, and the in-process store) and as
// Redis Lua scripts that decide atomically in one round trip.
//
// The package imports only the standard library, starts no goroutines and never reads
// the clock: every function that needs the time takes it as an argument. It compiles
// for GOOS=wasip1 GOARCH=wasm so the Envoy filter can run the models inside its VM.
package algo

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Algorithm names one rate-limiting algorithm.
type Algorithm string

// The algorithms of the catalogue.
const (
	FixedWindow   Algorithm = "fixed_window"
	SlidingLog    Algorithm = "sliding_log"
	SlidingWindow Algorithm = "sliding_window"
	TokenBucket   Algorithm = "token_bucket"
	LeakyBucket   Algorithm = "leaky_bucket"
	GCRA          Algorithm = "gcra"
	BucketRing    Algorithm = "bucket_ring"
)

// Algorithms lists every algorithm of the catalogue, in a stable order.
var Algorithms = []Algorithm{FixedWindow, SlidingLog, SlidingWindow, TokenBucket, LeakyBucket, GCRA, BucketRing}

// Valid reports whether a is one of the catalogue's algorithms.
func (a Algorithm) Valid() bool {
	for _, b := range Algorithms {
		if a == b {
			return true
		}
	}
	return false
}

// HasBurst reports whether the algorithm takes a burst (capacity) distinct from its
// count: token_bucket (bucket size), gcra (burst tolerance) and leaky_bucket (queue size).
func (a Algorithm) HasBurst() bool {
	return a == TokenBucket || a == GCRA || a == LeakyBucket
}

// CanSettle reports whether a meter of the algorithm can take a settlement (Meter.Settle):
// a charge that is never refused and may leave a debt. Every algorithm but sliding_log
// can: its log keeps an entry per unit, and a debt would grow it without bound.
func (a Algorithm) CanSettle() bool { return a != SlidingLog }

// CanRecord reports whether the algorithm can keep a recorded attribute value with each
// admitted request: sliding_log keeps it in the log entry, fixed_window in a per-window
// hash of value counts.
func (a Algorithm) CanRecord() bool {
	return a == SlidingLog || a == FixedWindow
}

// Limits on a limit's numbers, so that every computation stays exact in float64 (and in
// Lua's doubles): times are whole microseconds below 2^53.
const (
	MaxCount  = 1 << 40
	MinPeriod = time.Millisecond
	MaxPeriod = 366 * 24 * time.Hour
	// MaxRingBuckets bounds the number of buckets of a bucket_ring (its longest window
	// divided by its bucket width).
	MaxRingBuckets = 3600
	// MaxLogCount bounds a sliding_log's count: the log keeps one entry per admitted unit.
	MaxLogCount = 100000
)

// A Limit is one rate limit: Count units per Period, decided by Algorithm.
// The zero value is not valid; build limits with ParseRate or fill the fields and call
// Validate.
type Limit struct {
	Algorithm Algorithm
	// Count is the number of cost units admitted per Period.
	Count int64
	// Period is the length of the window, or the time in which Count units refill.
	Period time.Duration
	// Burst is the capacity of token_bucket, the burst tolerance of gcra and the queue
	// size of leaky_bucket, in cost units. Zero means Count. Other algorithms must leave
	// it zero.
	Burst int64
	// Bucket is the width of one bucket of a bucket_ring. Zero means the greatest common
	// divisor of the periods of the ring's windows. Other algorithms must leave it zero.
	Bucket time.Duration
	// Calendar, for fixed_window only, aligns the windows to the calendar (a day, a
	// week from Monday, a month from the 1st) at midnight in a time zone, instead of
	// to multiples of Period from the Unix epoch. Period is then the unit's longest
	// length (a day 25h, a week 169h, a month 745h, DST included), for bounds only.
	Calendar Calendar
	// WindowStartMicros is, for a calendar limit being decided, the Unix time in
	// microseconds its current window starts at, and Period that window's length
	// (Limit.In sets both); zero in a policy.
	WindowStartMicros int64
}

// A CalendarUnit is the window of a calendar limit.
type CalendarUnit string

// The calendar units.
const (
	CalendarDay   CalendarUnit = "day"
	CalendarWeek  CalendarUnit = "week"
	CalendarMonth CalendarUnit = "month"
)

// A Calendar aligns a fixed_window to the calendar of a time zone. The zero value
// is no calendar.
type Calendar struct {
	Unit CalendarUnit
	Zone *time.Location // nil means UTC
}

// nominal is the longest a calendar unit lasts (a 25-hour day at a DST change).
var nominal = map[CalendarUnit]time.Duration{
	CalendarDay:   25 * time.Hour,
	CalendarWeek:  7*24*time.Hour + time.Hour,
	CalendarMonth: 31*24*time.Hour + time.Hour,
}

// NewCalendarLimit returns a fixed_window limit of count per calendar unit in zone.
func NewCalendarLimit(count int64, unit CalendarUnit, zone *time.Location) Limit {
	return Limit{Algorithm: FixedWindow, Count: count, Period: nominal[unit], Calendar: Calendar{Unit: unit, Zone: zone}}
}

// Window returns the calendar window that holds t: it starts at midnight, local
// time in c.Zone, of the day, of the week's Monday, or of the month's 1st, and ends
// where the next starts. time.Date does the calendar arithmetic, so a day of a DST
// change lasts 23 or 25 hours and a month its own number of days.
func (c Calendar) Window(t time.Time) (start, end time.Time) {
	zone := c.Zone
	if zone == nil {
		zone = time.UTC
	}
	y, m, d := t.In(zone).Date()
	switch c.Unit {
	case CalendarWeek:
		d -= (int(time.Date(y, m, d, 12, 0, 0, 0, zone).Weekday()) + 6) % 7
		return time.Date(y, m, d, 0, 0, 0, 0, zone), time.Date(y, m, d+7, 0, 0, 0, 0, zone)
	case CalendarMonth:
		return time.Date(y, m, 1, 0, 0, 0, 0, zone), time.Date(y, m+1, 1, 0, 0, 0, 0, zone)
	}
	return time.Date(y, m, d, 0, 0, 0, 0, zone), time.Date(y, m, d+1, 0, 0, 0, 0, zone)
}

// AtWindows returns c with each calendar limit set to its window at now (Unix
// microseconds), for a store that passes windows to Lua; c's meters are copied only
// when one has a calendar limit.
func (c Check) AtWindows(now int64) Check {
	copied := false
	for i, m := range c.Meters {
		if !slices.ContainsFunc(m.Limits, func(l Limit) bool { return l.Calendar.Unit != "" }) {
			continue
		}
		if !copied {
			c.Meters, copied = slices.Clone(c.Meters), true
		}
		limits := slices.Clone(m.Limits)
		for j := range limits {
			limits[j] = limits[j].In(now)
		}
		c.Meters[i].Limits = limits
	}
	return c
}

// In returns l as it is decided at now (Unix microseconds): for a calendar limit,
// with Period and WindowStartMicros set to the window that holds now; any other
// limit as it is.
func (l Limit) In(now int64) Limit {
	if l.Calendar.Unit == "" {
		return l
	}
	start, end := l.Calendar.Window(time.UnixMicro(now))
	l.Period, l.WindowStartMicros = end.Sub(start), start.UnixMicro()
	return l
}

// Capacity returns the most cost units the limit admits at once: Burst where the
// algorithm has one and it is set, else Count.
func (l Limit) Capacity() int64 {
	if l.Algorithm.HasBurst() && l.Burst > 0 {
		return l.Burst
	}
	return l.Count
}

// String formats the limit as "algorithm count/period", with the burst where set.
func (l Limit) String() string {
	if l.Calendar.Unit != "" {
		zone := "UTC"
		if l.Calendar.Zone != nil {
			zone = l.Calendar.Zone.String()
		}
		return string(l.Algorithm) + " " + strconv.FormatInt(l.Count, 10) + "/" + string(l.Calendar.Unit) + " " + zone
	}
	s := string(l.Algorithm) + " " + FormatRate(l.Count, l.Period)
	if l.Burst > 0 {
		s += " burst " + strconv.FormatInt(l.Burst, 10)
	}
	return s
}

// A FieldError is a validation error that names the field at fault.
type FieldError struct {
	Field string // e.g. "rate", "burst", "algorithm"
	Value string // the offending value, as written
	Msg   string // what is wrong and how to fix it
}

func (e *FieldError) Error() string {
	if e.Value == "" {
		return e.Field + ": " + e.Msg
	}
	return e.Field + ": " + strconv.Quote(e.Value) + ": " + e.Msg
}

// Validate reports every problem of the limit, joined, or nil. Each problem is a
// *FieldError naming the field.
func (l Limit) Validate() error {
	var errs []error
	bad := func(field, value, msg string) { errs = append(errs, &FieldError{field, value, msg}) }
	if !l.Algorithm.Valid() {
		bad("algorithm", string(l.Algorithm), "unknown algorithm; use one of "+algorithmList())
	}
	if l.Count < 1 {
		bad("rate", FormatRate(l.Count, l.Period), "count must be at least 1")
	} else if l.Count > MaxCount {
		bad("rate", FormatRate(l.Count, l.Period), fmt.Sprintf("count must be at most %d", int64(MaxCount)))
	}
	switch {
	case l.Period <= 0:
		bad("rate", FormatRate(l.Count, l.Period), "period must be positive")
	case l.Period < MinPeriod || l.Period%time.Millisecond != 0:
		bad("rate", FormatRate(l.Count, l.Period), "period must be a whole number of milliseconds, at least 1ms")
	case l.Period > MaxPeriod:
		bad("rate", FormatRate(l.Count, l.Period), "period must be at most 366 days")
	}
	if l.Burst < 0 {
		bad("burst", strconv.FormatInt(l.Burst, 10), "burst must be at least 1 (leave it out to use the count)")
	} else if l.Burst > 0 && !l.Algorithm.HasBurst() && l.Algorithm.Valid() {
		bad("burst", strconv.FormatInt(l.Burst, 10), string(l.Algorithm)+" has no burst; remove it or use token_bucket, gcra or leaky_bucket")
	} else if l.Burst > MaxCount {
		bad("burst", strconv.FormatInt(l.Burst, 10), fmt.Sprintf("burst must be at most %d", int64(MaxCount)))
	}
	if l.Bucket != 0 && l.Algorithm != BucketRing && l.Algorithm.Valid() {
		bad("bucket", l.Bucket.String(), "only bucket_ring has buckets; remove it")
	}
	if l.Algorithm == BucketRing && l.Bucket != 0 && l.Period > 0 {
		if l.Bucket < MinPeriod || l.Bucket%time.Millisecond != 0 || l.Period%l.Bucket != 0 {
			bad("bucket", l.Bucket.String(), "bucket must be a whole number of milliseconds that divides the period")
		} else if l.Period/l.Bucket > MaxRingBuckets {
			bad("bucket", l.Bucket.String(), fmt.Sprintf("the period spans more than %d buckets; use wider buckets", MaxRingBuckets))
		}
	}
	if l.Calendar.Unit != "" {
		if _, ok := nominal[l.Calendar.Unit]; !ok {
			bad("rate", string(l.Calendar.Unit), "a calendar window is a day, a week or a month")
		} else if l.Algorithm != FixedWindow && l.Algorithm.Valid() {
			bad("calendar", string(l.Algorithm), "only fixed_window has calendar windows; use algorithm: fixed_window")
		}
	}
	if l.Algorithm == SlidingLog && l.Count > MaxLogCount {
		bad("rate", FormatRate(l.Count, l.Period), fmt.Sprintf("sliding_log keeps one entry per request; its count must be at most %d (use sliding_window for larger counts)", MaxLogCount))
	}
	if l.Algorithm.Valid() && l.Count >= 1 && l.Period > 0 && (l.Algorithm == GCRA || l.Algorithm == TokenBucket || l.Algorithm == LeakyBucket) {
		// The emission interval Period/Count must be at least one microsecond.
		if l.Period/time.Microsecond < time.Duration(l.Count) {
			bad("rate", FormatRate(l.Count, l.Period), "rate is faster than one unit per microsecond; use a longer period or a smaller count")
		}
	}
	return errors.Join(errs...)
}

func algorithmList() string {
	names := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// units maps the unit names ParseRate accepts to their length. The first name of
// each is the one the documentation gives; every other is accepted as well, and
// docs/policy.md lists them all.
var units = []struct {
	names []string
	d     time.Duration
}{
	{[]string{"ms"}, time.Millisecond},
	{[]string{"s", "sec", "second", "seconds"}, time.Second},
	{[]string{"min", "m", "minute", "minutes"}, time.Minute},
	{[]string{"h", "hour", "hours"}, time.Hour},
	{[]string{"day", "d", "days"}, 24 * time.Hour},
}

// ParseRate parses a rate such as "100/s", "5/10s", "30/min", "10000/day" or "1/500ms"
// into a count and a period. Units: ms, s (sec, second, seconds), min (m, minute,
// minutes), h (hour, hours), day (d, days); a unit may carry a whole-number
// multiplier ("10s", "15min"). A week or a month is not a period (see ParseQuota).
func ParseRate(s string) (count int64, period time.Duration, err error) {
	count, period, _, err = parseRate(s, false)
	return count, period, err
}

// ParseQuota parses a rate as a policy writes it: every rate ParseRate reads, and
// also COUNT/week and COUNT/month, windows of the calendar (see Calendar). unit is
// the calendar unit the rate names — CalendarDay for COUNT/day (or d, days) without a
// multiplier, CalendarWeek for COUNT/week, CalendarMonth for COUNT/month — or "" for
// any other rate. period is the rate's period: zero for a week or a month, which have
// no single length.
func ParseQuota(s string) (count int64, period time.Duration, unit CalendarUnit, err error) {
	return parseRate(s, true)
}

// calendarNames are the names of the calendar units that are not periods.
var calendarNames = map[string]CalendarUnit{"week": CalendarWeek, "month": CalendarMonth}

// parseRate is ParseRate, and with calendar ParseQuota.
func parseRate(s string, calendar bool) (count int64, period time.Duration, unit CalendarUnit, err error) {
	all := "ms, s, min, h or day"
	if calendar {
		all = "ms, s, min, h, day, week or month"
	}
	fail := func(msg string) (int64, time.Duration, CalendarUnit, error) {
		return 0, 0, "", &FieldError{Field: "rate", Value: s, Msg: msg}
	}
	c, p, ok := strings.Cut(strings.TrimSpace(s), "/")
	if !ok {
		return fail(`want COUNT/PERIOD, e.g. "100/s", "5/10s", "30/min"`)
	}
	c, p = strings.TrimSpace(c), strings.TrimSpace(p)
	n, err := strconv.ParseInt(c, 10, 64)
	if err != nil {
		return fail("count " + strconv.Quote(c) + " is not a whole number")
	}
	if n < 1 {
		return fail("count must be at least 1")
	}
	i := 0
	for i < len(p) && p[i] >= '0' && p[i] <= '9' {
		i++
	}
	mult := int64(1)
	if i > 0 {
		if mult, err = strconv.ParseInt(p[:i], 10, 64); err != nil || mult < 1 || mult > 1<<20 {
			return fail("period multiplier " + strconv.Quote(p[:i]) + " must be a whole number from 1 to 1048576")
		}
	}
	name := strings.ToLower(strings.TrimSpace(p[i:]))
	if name == "" {
		return fail("missing unit; use " + all)
	}
	if cu, ok := calendarNames[name]; ok {
		switch {
		case !calendar:
			return fail("unknown unit " + strconv.Quote(name) + " for a period; a week or a month is a calendar window, which only a policy's fixed_window limit counts; for a period write days, e.g. 7day")
		case i > 0:
			return fail("a calendar " + name + " takes no multiplier; write COUNT/" + name + ", or a period in days such as " + c + "/30day")
		}
		return n, 0, cu, nil
	}
	for _, u := range units {
		for _, un := range u.names {
			if name == un {
				if time.Duration(mult) > MaxPeriod/u.d {
					return fail("period is longer than 366 days")
				}
				if calendar && i == 0 && u.d == 24*time.Hour {
					unit = CalendarDay
				}
				return n, time.Duration(mult) * u.d, unit, nil
			}
		}
	}
	return fail("unknown unit " + strconv.Quote(name) + "; use " + all)
}

// FormatRate formats a count and period the way ParseRate reads them, with the largest
// unit that divides the period: FormatRate(30, time.Minute) is "30/min".
func FormatRate(count int64, period time.Duration) string {
	if period <= 0 {
		return strconv.FormatInt(count, 10) + "/" + period.String()
	}
	for i := len(units) - 1; i >= 0; i-- {
		u := units[i]
		if period%u.d == 0 {
			m := int64(period / u.d)
			name := u.names[0]
			if u.d == 24*time.Hour {
				name = "d" // as FormatRate has always written it
			}
			if m == 1 {
				return strconv.FormatInt(count, 10) + "/" + name
			}
			return strconv.FormatInt(count, 10) + "/" + strconv.FormatInt(m, 10) + name
		}
	}
	return strconv.FormatInt(count, 10) + "/" + period.String()
}
