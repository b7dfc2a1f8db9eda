package algo_test

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// The seed corpora are in testdata/fuzz/<FuzzName>/.

// FuzzEscape checks, for two values, that Escape is injective, that its output can sit
// in a key (no brace, no colon) and that a key built on it keeps it as hash tag.
func FuzzEscape(f *testing.F) {
	f.Fuzz(func(t *testing.T, a, b string) {
		ea, eb := algo.Escape(a), algo.Escape(b)
		if a != b && ea == eb {
			t.Fatalf("Escape(%q) = Escape(%q) = %q, want different escapes", a, b, ea)
		}
		if a == b && ea != eb {
			t.Fatalf("Escape(%q) = %q, then %q, want one escape", a, ea, eb)
		}
		if msg := checkEscaped(ea); msg != "" {
			t.Fatalf("Escape(%q) = %q, which %s", a, ea, msg)
		}
		if strings.HasPrefix(ea, "~") {
			if ea != algo.HashValue(a) {
				t.Fatalf("Escape(%q) = %q, want HashValue(%q) = %q", a, ea, a, algo.HashValue(a))
			}
		} else if got := unescape(ea); got != a {
			t.Fatalf("unescape(Escape(%q)) = %q, want %q", a, got, a)
		}
		key := algo.Key("tg:", ea, b, eb+":"+ea, strconv.Itoa(len(b)))
		if got := algo.HashTag(key); got != ea {
			t.Fatalf("HashTag(%q) = %q, want %q", key, got, ea)
		}
		if got, want := algo.Slot(key), algo.Slot(ea); got != want {
			t.Fatalf("Slot(%q) = %d, want %d", key, got, want)
		}
	})
}

// FuzzParseRate checks that ParseRate never panics, that its errors name the rate, and
// that a rate it reads is valid, formats, and reads back the same; and that
// ParseQuota reads what ParseRate reads, the same, and beyond it only a week or a
// month, without a period.
func FuzzParseRate(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		count, period, err := algo.ParseRate(s)
		qc, qp, unit, qerr := algo.ParseQuota(s)
		switch {
		case qerr != nil:
			var fe *algo.FieldError
			if err == nil || !errors.As(qerr, &fe) || fe.Field != "rate" || fe.Value != s {
				t.Fatalf("ParseQuota(%q) = %v where ParseRate = %v, want a *FieldError of the rate %q that ParseRate also reports", s, qerr, err, s)
			}
		case unit == algo.CalendarWeek || unit == algo.CalendarMonth:
			if err == nil || qp != 0 || qc < 1 {
				t.Fatalf("ParseQuota(%q) = %d, %v, %s where ParseRate = %v, want a count, no period, and ParseRate's error", s, qc, qp, unit, err)
			}
		case err != nil || qc != count || qp != period || unit != "" && (unit != algo.CalendarDay || period != 24*time.Hour):
			t.Fatalf("ParseQuota(%q) = %d, %v, %q, %v, want ParseRate's %d, %v, %v", s, qc, qp, unit, qerr, count, period, err)
		}
		if err != nil {
			var fe *algo.FieldError
			if !errors.As(err, &fe) || fe.Field != "rate" || fe.Value != s {
				t.Fatalf("ParseRate(%q) = %v, want a *FieldError of the rate %q", s, err, s)
			}
			return
		}
		if period <= 0 || period%time.Millisecond != 0 {
			t.Fatalf("ParseRate(%q) = %d, %v, nil, want a positive whole number of milliseconds or an error", s, count, period)
		}
		if count < 1 {
			t.Fatalf("ParseRate(%q) = %d, %v, nil, want a count of at least 1", s, count, period)
		}
		f := algo.FormatRate(count, period)
		c2, p2, err := algo.ParseRate(f)
		if c2 != count || p2 != period || err != nil {
			t.Fatalf("ParseRate(FormatRate(%d, %v) = %q) = %d, %v, %v, want %d, %v, nil", count, period, f, c2, p2, err, count, period)
		}
	})
}

// fuzzReader hands out the bytes of a fuzz input, then zeros.
type fuzzReader []byte

func (r *fuzzReader) next() byte {
	if len(*r) == 0 {
		return 0
	}
	c := (*r)[0]
	*r = (*r)[1:]
	return c
}

var fuzzPeriods = []time.Duration{time.Millisecond, 7 * time.Millisecond, 100 * time.Millisecond, time.Second, 3 * time.Second, time.Minute, time.Hour, 24 * time.Hour}

// fuzzMeter decodes a meter: an algorithm, then its limits' numbers.
func fuzzMeter(r *fuzzReader) algo.Meter {
	a := algo.Algorithms[int(r.next())%len(algo.Algorithms)]
	if a == algo.BucketRing {
		bucket := []time.Duration{time.Millisecond, 10 * time.Millisecond, time.Second}[r.next()%3]
		var m algo.Meter
		for range 1 + r.next()%3 {
			m.Limits = append(m.Limits, algo.Limit{Algorithm: a, Count: 1 + int64(r.next()%32), Period: bucket * time.Duration(1+r.next()%15), Bucket: bucket})
		}
		return m
	}
	l := algo.Limit{Algorithm: a, Count: 1 + int64(r.next()%32), Period: fuzzPeriods[r.next()%8]}
	if c := r.next(); c >= 224 {
		l.Count = int64(c-223) * 37_000
	}
	if a.HasBurst() {
		l.Burst = int64(r.next() % 40)
	}
	m := algo.Meter{Limits: []algo.Limit{l}}
	if a.CanRecord() && r.next()%2 == 1 {
		m.Record = "user"
	}
	return m
}

// fuzzCapacity is the least capacity of m's limits: a request of at most that cost
// can be admitted.
func fuzzCapacity(m algo.Meter) int64 {
	c := m.Limits[0].Capacity()
	for _, l := range m.Limits {
		c = min(c, l.Capacity())
	}
	return c
}

// FuzzStep decodes a meter and a sequence of requests (time steps, some backwards, and
// costs) from the input, and checks every decision for the properties every model
// promises: no panic, no negative numbers, a denial returns its input state, a denied
// request is admitted after its RetryAfter and not before, the limit is full again
// after ResetAfter, and a state past its Expires decides like the empty state.
func FuzzStep(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		r := fuzzReader(data)
		m := fuzzMeter(&r)
		if m.Validate() != nil {
			return
		}
		capacity := fuzzCapacity(m)
		p := int64(m.Limits[0].Period / time.Microsecond)
		now := base + int64(r.next())<<20
		if r.next()%8 == 0 {
			now = int64(r.next()) - 128
		}
		var st algo.State
		for i := 0; len(r) > 0 && i < 64; i++ {
			db, cb := r.next(), r.next()
			switch db % 8 {
			case 1:
				now += int64(db >> 3)
			case 2:
				now += p / 4
			case 3:
				now += p - 1
			case 4:
				now += p
			case 5:
				now += p + 1
			case 6:
				now += 3*p + int64(db>>3)
			case 7:
				now -= p/2 + int64(db>>3) // the clock goes back
			}
			cost := int64(cb % 5)
			switch cb % 8 {
			case 5:
				cost = capacity
			case 6:
				cost = capacity + 1
			case 7:
				cost = int64(cb >> 3)
			}
			st = checkStep(t, m, st, now, cost)
		}
	})
}

// checkStep decides one request and checks it; it returns the state to go on with.
func checkStep(t *testing.T, m algo.Meter, st algo.State, now, cost int64) algo.State {
	t.Helper()
	before := cloneState(st)
	ns, ds := m.StepMicros(st, now, cost)
	call := func() string {
		return fmt.Sprintf("StepMicros(%v, state %+v, now %d, cost %d)", m.Limits, st, now, cost)
	}
	if !reflect.DeepEqual(st, before) {
		t.Fatalf("%s modified its input state: %+v, want %+v", call(), st, before)
	}
	if len(ds) != len(m.Limits) {
		t.Fatalf("%s = %d decisions, want %d", call(), len(ds), len(m.Limits))
	}
	allowed := algo.Allowed(ds)
	var retry, reset time.Duration
	for j, d := range ds {
		l := m.Limits[j]
		if d.Limit != l.Count || d.Period != l.Period {
			t.Fatalf("%s decision %d = %+v, want Limit %d, Period %v", call(), j, d, l.Count, l.Period)
		}
		if d.Remaining < 0 || d.Remaining > l.Capacity() || d.RetryAfter < 0 || d.ResetAfter < 0 || d.Delay < 0 {
			t.Fatalf("%s decision %d = %+v, want 0 <= Remaining <= %d and no negative time", call(), j, d, l.Capacity())
		}
		if d.Delay != 0 && m.Algorithm() != algo.LeakyBucket {
			t.Fatalf("%s decision %d = %+v, want no Delay outside leaky_bucket", call(), j, d)
		}
		if allowed && d.RetryAfter != 0 {
			t.Fatalf("%s decision %d = %+v, allowed, want RetryAfter 0", call(), j, d)
		}
		if !d.Allowed && d.RetryAfter <= 0 {
			t.Fatalf("%s decision %d = %+v, denied, want RetryAfter > 0", call(), j, d)
		}
		if cost > l.Capacity() && d.Allowed {
			t.Fatalf("%s decision %d = %+v, want a denial of cost %d above the capacity %d", call(), j, d, cost, l.Capacity())
		}
		if cost > l.Capacity() && d.RetryAfter != l.Period {
			t.Fatalf("%s decision %d = %+v, want RetryAfter = the period %v", call(), j, d, l.Period)
		}
		retry, reset = max(retry, d.RetryAfter), max(reset, d.ResetAfter)
	}
	if !allowed && !reflect.DeepEqual(ns, before) {
		t.Fatalf("denied %s returned state %+v, want the input state %+v", call(), ns, before)
	}
	fail := t.Fatalf
	// The algorithms that compute in float64 compare and round values that carry
	// rounding errors: their RetryAfter, ResetAfter and Expires may be 1µs off either
	// way. sliding_window's
	// estimate also loses the last microseconds of weight of the previous window (1/P
	// of a unit) next to a large count, so it may admit well before its RetryAfter.
	var slack time.Duration
	if a := m.Algorithm(); a == algo.SlidingWindow || a == algo.TokenBucket || a == algo.GCRA || a == algo.LeakyBucket {
		slack = time.Microsecond
	}
	if !allowed && cost <= fuzzCapacity(m) {
		if _, later := m.StepMicros(st, now+int64((retry+slack)/time.Microsecond), cost); !algo.Allowed(later) {
			fail("%s = %+v; %v after the longest RetryAfter %v, %+v, want allowed", call(), ds, slack, retry, later)
		}
		early := time.Microsecond + slack
		if retry > early && m.Algorithm() != algo.SlidingWindow {
			if _, sooner := m.StepMicros(st, now+int64((retry-early)/time.Microsecond), cost); algo.Allowed(sooner) {
				fail("%s = %+v; %v before the longest RetryAfter %v, %+v, want denied", call(), ds, early, retry, sooner)
			}
		}
	}
	after := st
	if allowed {
		after = ns
	}
	// A fixed_window request dated in the window before the stored one reports its own
	// window's reset; the newer window keeps its count past that (the script keeps a
	// key per window and knows no more).
	behind := m.Algorithm() == algo.FixedWindow && st.Set && st.Window > now/int64(m.Limits[0].Period/time.Microsecond)
	if _, later := m.StepMicros(after, now+int64((reset+slack)/time.Microsecond), 0); !behind && !full(m, later) {
		fail("%s = %+v; %v after the longest ResetAfter %v, %+v, want every limit full", call(), ds, slack, reset, later)
	}
	if allowed && ns.Set {
		at := ns.ExpiresMicros + int64(slack/time.Microsecond)
		_, got := m.StepMicros(ns, at, 1)
		_, want := m.StepMicros(algo.State{}, at, 1)
		if !reflect.DeepEqual(got, want) {
			fail("%s: %v after Expires %d the state decides %+v, want %+v as the empty state", call(), slack, ns.ExpiresMicros, got, want)
		}
	}
	return ns
}

// full reports whether every decision has its limit's whole capacity remaining.
func full(m algo.Meter, ds []algo.Decision) bool {
	for j, d := range ds {
		if d.Remaining != m.Limits[j].Capacity() {
			return false
		}
	}
	return true
}

// FuzzParseDecideReply decodes a meter and a reply of integers from the input and
// checks both reply parsers: no panic, an error for a reply of the wrong length, and
// the same Reply from the integer parser as from the generic one given the same
// integers boxed as go-redis boxes them.
func FuzzParseDecideReply(f *testing.F) {
	// one meter of one limit, a reply of the right length (7 integers)
	f.Add([]byte{0, 0, 7, 7, 65, 65, 69, 64, 64, 64, 7})
	// two meters of one limit each, the right length (12 integers)
	f.Add([]byte{1, 0, 2, 0, 9, 12, 70, 65, 64, 100, 0, 0, 64, 65, 70, 66, 67})
	// three meters of three limits each, the right length (47 integers)
	f.Add(append([]byte{2, 2, 9, 9, 9, 2, 9, 9, 9, 2, 9, 9, 9, 47}, bytes.Repeat([]byte{65}, 47)...))
	// a reply one short
	f.Add([]byte{0, 0, 7, 6, 1, 2, 3, 4, 5, 6})
	f.Fuzz(func(t *testing.T, data []byte) {
		r := fuzzReader(data)
		meters := make([]algo.Meter, 1+r.next()%3)
		for i := range meters {
			meters[i].Limits = make([]algo.Limit, 1+r.next()%3)
			for j := range meters[i].Limits {
				meters[i].Limits[j] = algo.Limit{Algorithm: algo.GCRA, Count: int64(r.next()) + 1, Period: time.Second}
			}
		}
		vals := make([]int64, int(r.next()))
		for i := range vals {
			vals[i] = int64(r.next()) - 64
		}
		boxed := make([]any, len(vals))
		for i, v := range vals {
			boxed[i] = v
		}
		fromInts, errInts := algo.ParseDecideInts(vals, meters)
		fromAny, errAny := algo.ParseDecideReply(boxed, meters)
		want := 2
		for _, m := range meters {
			want += 5 * len(m.Limits)
		}
		if len(vals) != want {
			if errInts == nil {
				t.Fatalf("ParseDecideInts(%d integers) for %d limits = nil error", len(vals), (want-2)/5)
			}
			return
		}
		if errInts != nil || errAny != nil {
			t.Fatalf("parse a reply of the right length: ints %v, generic %v", errInts, errAny)
		}
		if !reflect.DeepEqual(fromInts, fromAny) {
			t.Fatalf("ParseDecideInts = %+v, ParseDecideReply = %+v", fromInts, fromAny)
		}
		if fromInts.NowMicros != vals[0] || fromInts.Allowed != (vals[1] == 1) || fromInts.Decisions[0][0].Remaining != vals[3] {
			t.Fatalf("ParseDecideInts(%v) = %+v: fields out of place", vals, fromInts)
		}
	})
}
