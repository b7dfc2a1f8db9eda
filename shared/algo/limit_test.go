package algo_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

func TestParseRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		count  int64
		period time.Duration
	}{
		{"100/s", 100, time.Second},
		{"5/10s", 5, 10 * time.Second},
		{"30/min", 30, time.Minute},
		{"10000/day", 10000, 24 * time.Hour},
		{"1/500ms", 1, 500 * time.Millisecond},
		{"2/h", 2, time.Hour},
		{"1/1ms", 1, time.Millisecond},
		{"3/2d", 3, 48 * time.Hour},
		{"7/15min", 7, 15 * time.Minute},
		{"60/m", 60, time.Minute},
		{"4/hours", 4, time.Hour},
		{"9/Seconds", 9, time.Second},
		{" 7 / 15 minutes ", 7, 15 * time.Minute},
		{"8/ 3 sec", 8, 3 * time.Second},
		{"1/1048576ms", 1, 1048576 * time.Millisecond},
		{"1099511627776/s", 1 << 40, time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			count, period, err := algo.ParseRate(tt.in)
			if count != tt.count || period != tt.period || err != nil {
				t.Errorf("ParseRate(%q) = %d, %v, %v, want %d, %v, nil", tt.in, count, period, err, tt.count, tt.period)
			}
		})
	}
}

func TestParseRateErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in  string
		msg string // a part of the message
	}{
		{"10/x", `unknown unit "x"`},
		{"0/s", "count must be at least 1"},
		{"-1/s", "count must be at least 1"},
		{"10", "want COUNT/PERIOD"},
		{"", "want COUNT/PERIOD"},
		{"/s", `count "" is not a whole number`},
		{"10/0s", `period multiplier "0" must be a whole number from 1 to 1048576`},
		{"1/2097152s", `period multiplier "2097152"`},
		{"1/99999999999999999999s", `period multiplier "99999999999999999999"`},
		{"abc/s", `count "abc" is not a whole number`},
		{"1.5/s", `count "1.5" is not a whole number`},
		{"99999999999999999999/s", "is not a whole number"},
		{"1/1.5s", `unknown unit ".5s"`},
		{"10/", "missing unit"},
		{"10/10", "missing unit"},
		{"10/s/s", `unknown unit "s/s"`},
		{"1/-5s", `unknown unit "-5s"`},
		{"5/week", `unknown unit "week"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			count, period, err := algo.ParseRate(tt.in)
			var fe *algo.FieldError
			if !errors.As(err, &fe) || fe.Field != "rate" || fe.Value != tt.in || !strings.Contains(fe.Msg, tt.msg) {
				t.Fatalf("ParseRate(%q) = %d, %v, %v, want a rate error about %q", tt.in, count, period, err, tt.msg)
			}
			if count != 0 || period != 0 {
				t.Errorf("ParseRate(%q) = %d, %v, want 0, 0 with the error", tt.in, count, period)
			}
		})
	}
}

// TestParseRateOverflow checks multipliers whose period does not fit in a Duration
// (more than about 292 years): they must be errors, not wrapped periods.
func TestParseRateOverflow(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"1/106752d", "1/213504d", "1/1048576days"} {
		count, period, err := algo.ParseRate(in)
		var fe *algo.FieldError
		if !errors.As(err, &fe) || fe.Field != "rate" {
			t.Errorf("ParseRate(%q) = %d, %v, %v, want a rate error", in, count, period, err)
		}
	}
}

func TestFormatRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		count  int64
		period time.Duration
		want   string
	}{
		{100, time.Second, "100/s"},
		{5, 10 * time.Second, "5/10s"},
		{30, time.Minute, "30/min"},
		{10000, 24 * time.Hour, "10000/d"},
		{1, 500 * time.Millisecond, "1/500ms"},
		{2, time.Hour, "2/h"},
		{7, 90 * time.Minute, "7/90min"},
		{1, 120 * time.Second, "1/2min"},
		{4, 48 * time.Hour, "4/2d"},
		{3, 1500 * time.Millisecond, "3/1500ms"},
		{1, time.Millisecond, "1/ms"},
		// Not rates ParseRate reads; formatted for error messages.
		{1, 1500 * time.Microsecond, "1/1.5ms"},
		{3, 0, "3/0s"},
		{3, -time.Second, "3/-1s"},
		{0, time.Second, "0/s"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			t.Parallel()
			if got := algo.FormatRate(tt.count, tt.period); got != tt.want {
				t.Errorf("FormatRate(%d, %v) = %q, want %q", tt.count, tt.period, got, tt.want)
			}
			if tt.count < 1 || tt.period < time.Millisecond || tt.period%time.Millisecond != 0 {
				return
			}
			count, period, err := algo.ParseRate(tt.want)
			if count != tt.count || period != tt.period || err != nil {
				t.Errorf("ParseRate(%q) = %d, %v, %v, want %d, %v, nil", tt.want, count, period, err, tt.count, tt.period)
			}
		})
	}
}

func TestLimitString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		limit algo.Limit
		want  string
	}{
		{algo.Limit{Algorithm: algo.GCRA, Count: 10, Period: time.Second, Burst: 20}, "gcra 10/s burst 20"},
		{algo.Limit{Algorithm: algo.FixedWindow, Count: 30, Period: time.Minute}, "fixed_window 30/min"},
		{algo.Limit{Algorithm: algo.BucketRing, Count: 5, Period: 10 * time.Second, Bucket: time.Second}, "bucket_ring 5/10s"},
	}
	for _, tt := range tests {
		if got := tt.limit.String(); got != tt.want {
			t.Errorf("%#v.String() = %q, want %q", tt.limit, got, tt.want)
		}
	}
}

func TestLimitCapacity(t *testing.T) {
	t.Parallel()
	tests := []struct {
		limit algo.Limit
		want  int64
	}{
		{algo.Limit{Algorithm: algo.TokenBucket, Count: 10}, 10},
		{algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Burst: 25}, 25},
		{algo.Limit{Algorithm: algo.GCRA, Count: 10, Burst: 3}, 3},
		{algo.Limit{Algorithm: algo.LeakyBucket, Count: 10, Burst: 40}, 40},
		{algo.Limit{Algorithm: algo.FixedWindow, Count: 10, Burst: 25}, 10},
		{algo.Limit{Algorithm: algo.BucketRing, Count: 10}, 10},
	}
	for _, tt := range tests {
		if got := tt.limit.Capacity(); got != tt.want {
			t.Errorf("%v.Capacity() = %d, want %d", tt.limit, got, tt.want)
		}
	}
}

func TestAlgorithm(t *testing.T) {
	t.Parallel()
	tests := []struct {
		a                       algo.Algorithm
		valid, burst, canRecord bool
	}{
		{algo.FixedWindow, true, false, true},
		{algo.SlidingLog, true, false, true},
		{algo.SlidingWindow, true, false, false},
		{algo.TokenBucket, true, true, false},
		{algo.LeakyBucket, true, true, false},
		{algo.GCRA, true, true, false},
		{algo.BucketRing, true, false, false},
		{"", false, false, false},
		{"GCRA", false, false, false},
		{"token-bucket", false, false, false},
	}
	for _, tt := range tests {
		if got := tt.a.Valid(); got != tt.valid {
			t.Errorf("Algorithm(%q).Valid() = %v, want %v", tt.a, got, tt.valid)
		}
		if got := tt.a.HasBurst(); got != tt.burst {
			t.Errorf("Algorithm(%q).HasBurst() = %v, want %v", tt.a, got, tt.burst)
		}
		if got := tt.a.CanRecord(); got != tt.canRecord {
			t.Errorf("Algorithm(%q).CanRecord() = %v, want %v", tt.a, got, tt.canRecord)
		}
	}
	if len(algo.Algorithms) != 7 {
		t.Errorf("len(Algorithms) = %d, want 7", len(algo.Algorithms))
	}
}

// fieldErrors returns every *FieldError joined in err, in order.
func fieldErrors(err error) []*algo.FieldError {
	var out []*algo.FieldError
	var walk func(error)
	walk = func(err error) {
		switch e := err.(type) {
		case *algo.FieldError:
			out = append(out, e)
		case interface{ Unwrap() []error }:
			for _, e := range e.Unwrap() {
				walk(e)
			}
		case interface{ Unwrap() error }:
			walk(e.Unwrap())
		}
	}
	if err != nil {
		walk(err)
	}
	return out
}

func TestLimitValidate(t *testing.T) {
	t.Parallel()
	const (
		fw = algo.FixedWindow
		sl = algo.SlidingLog
		sw = algo.SlidingWindow
		tb = algo.TokenBucket
		lb = algo.LeakyBucket
		gc = algo.GCRA
		br = algo.BucketRing
	)
	tests := []struct {
		name   string
		limit  algo.Limit
		fields []string // the fields of the problems, in order; none: valid
		msg    string   // a part of the message
	}{
		{"fixed_window", algo.Limit{Algorithm: fw, Count: 100, Period: time.Minute}, nil, ""},
		{"gcra burst", algo.Limit{Algorithm: gc, Count: 10, Period: time.Second, Burst: 20}, nil, ""},
		{"token_bucket burst", algo.Limit{Algorithm: tb, Count: 10, Period: time.Second, Burst: 1}, nil, ""},
		{"leaky_bucket queue", algo.Limit{Algorithm: lb, Count: 10, Period: time.Second, Burst: 100}, nil, ""},
		{"bucket_ring bucket", algo.Limit{Algorithm: br, Count: 10, Period: 10 * time.Second, Bucket: time.Second}, nil, ""},
		{"bucket_ring one bucket", algo.Limit{Algorithm: br, Count: 10, Period: 10 * time.Second}, nil, ""},
		{"bucket_ring 3600 buckets", algo.Limit{Algorithm: br, Count: 10, Period: time.Hour, Bucket: time.Second}, nil, ""},
		{"longest period", algo.Limit{Algorithm: sw, Count: 1, Period: algo.MaxPeriod}, nil, ""},
		{"largest count", algo.Limit{Algorithm: sw, Count: algo.MaxCount, Period: time.Hour}, nil, ""},
		{"sliding_log largest count", algo.Limit{Algorithm: sl, Count: algo.MaxLogCount, Period: time.Hour}, nil, ""},
		{"gcra one unit per microsecond", algo.Limit{Algorithm: gc, Count: 1000, Period: time.Millisecond}, nil, ""},

		{"zero count", algo.Limit{Algorithm: fw, Count: 0, Period: time.Second}, []string{"rate"}, "count must be at least 1"},
		{"negative count", algo.Limit{Algorithm: gc, Count: -5, Period: time.Second}, []string{"rate"}, "count must be at least 1"},
		{"count too large", algo.Limit{Algorithm: sw, Count: algo.MaxCount + 1, Period: time.Hour}, []string{"rate"}, "count must be at most 1099511627776"},
		{"zero period", algo.Limit{Algorithm: fw, Count: 10}, []string{"rate"}, "period must be positive"},
		{"negative period", algo.Limit{Algorithm: sw, Count: 10, Period: -time.Second}, []string{"rate"}, "period must be positive"},
		{"zero count and period", algo.Limit{Algorithm: fw}, []string{"rate", "rate"}, "count must be at least 1"},
		{"sub-millisecond period", algo.Limit{Algorithm: fw, Count: 10, Period: 500 * time.Microsecond}, []string{"rate"}, "whole number of milliseconds"},
		{"fractional millisecond period", algo.Limit{Algorithm: fw, Count: 10, Period: 1500 * time.Microsecond}, []string{"rate"}, "whole number of milliseconds"},
		{"period too long", algo.Limit{Algorithm: fw, Count: 10, Period: algo.MaxPeriod + time.Millisecond}, []string{"rate"}, "at most 366 days"},
		{"sliding_log count too large", algo.Limit{Algorithm: sl, Count: algo.MaxLogCount + 1, Period: time.Hour}, []string{"rate"}, "use sliding_window"},
		{"gcra too fast", algo.Limit{Algorithm: gc, Count: 1001, Period: time.Millisecond}, []string{"rate"}, "faster than one unit per microsecond"},
		{"token_bucket too fast", algo.Limit{Algorithm: tb, Count: 2_000_000, Period: time.Second}, []string{"rate"}, "faster than one unit per microsecond"},
		{"leaky_bucket too fast", algo.Limit{Algorithm: lb, Count: 2_000_000, Period: time.Second}, []string{"rate"}, "faster than one unit per microsecond"},

		{"negative burst", algo.Limit{Algorithm: tb, Count: 10, Period: time.Second, Burst: -1}, []string{"burst"}, "burst must be"},
		{"burst on fixed_window", algo.Limit{Algorithm: fw, Count: 10, Period: time.Second, Burst: 20}, []string{"burst"}, "fixed_window has no burst"},
		{"burst on sliding_log", algo.Limit{Algorithm: sl, Count: 10, Period: time.Second, Burst: 20}, []string{"burst"}, "sliding_log has no burst"},
		{"burst on sliding_window", algo.Limit{Algorithm: sw, Count: 10, Period: time.Second, Burst: 20}, []string{"burst"}, "sliding_window has no burst"},
		{"burst on bucket_ring", algo.Limit{Algorithm: br, Count: 10, Period: time.Second, Burst: 20}, []string{"burst"}, "bucket_ring has no burst"},
		{"burst too large", algo.Limit{Algorithm: gc, Count: 10, Period: time.Second, Burst: algo.MaxCount + 1}, []string{"burst"}, "burst must be at most"},

		{"unknown algorithm", algo.Limit{Algorithm: "token-bucket", Count: 10, Period: time.Second}, []string{"algorithm"}, "unknown algorithm; use one of fixed_window, sliding_log"},
		{"no algorithm", algo.Limit{Count: 10, Period: time.Second}, []string{"algorithm"}, "unknown algorithm"},

		{"bucket on gcra", algo.Limit{Algorithm: gc, Count: 10, Period: time.Second, Bucket: time.Second}, []string{"bucket"}, "only bucket_ring has buckets"},
		{"bucket on fixed_window", algo.Limit{Algorithm: fw, Count: 10, Period: time.Second, Bucket: 100 * time.Millisecond}, []string{"bucket"}, "only bucket_ring has buckets"},
		{"bucket not dividing the period", algo.Limit{Algorithm: br, Count: 10, Period: time.Second, Bucket: 300 * time.Millisecond}, []string{"bucket"}, "divides the period"},
		{"bucket longer than the period", algo.Limit{Algorithm: br, Count: 10, Period: time.Second, Bucket: 2 * time.Second}, []string{"bucket"}, "divides the period"},
		{"sub-millisecond bucket", algo.Limit{Algorithm: br, Count: 10, Period: time.Second, Bucket: 500 * time.Microsecond}, []string{"bucket"}, "whole number of milliseconds"},
		{"negative bucket", algo.Limit{Algorithm: br, Count: 10, Period: time.Second, Bucket: -time.Second}, []string{"bucket"}, "whole number of milliseconds"},
		{"too many buckets", algo.Limit{Algorithm: br, Count: 10, Period: 2 * time.Hour, Bucket: time.Second}, []string{"bucket"}, "more than 3600 buckets"},

		{"everything wrong", algo.Limit{Algorithm: "nope", Burst: -1, Bucket: time.Second}, []string{"algorithm", "rate", "rate", "burst"}, "unknown algorithm"},
		{"burst and bucket on sliding_window", algo.Limit{Algorithm: sw, Count: 10, Period: time.Second, Burst: 2, Bucket: time.Second}, []string{"burst", "bucket"}, "has no burst"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.limit.Validate()
			var got []string
			for _, fe := range fieldErrors(err) {
				got = append(got, fe.Field)
			}
			if !slices.Equal(got, tt.fields) {
				t.Fatalf("%#v.Validate() = %v, want problems with %v", tt.limit, err, tt.fields)
			}
			if err == nil {
				return
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("%#v.Validate() = %q, want a message containing %q", tt.limit, err, tt.msg)
			}
			// Every line names its field first.
			for i, line := range strings.Split(err.Error(), "\n") {
				if !strings.HasPrefix(line, tt.fields[i]+": ") {
					t.Errorf("%#v.Validate() line %d = %q, want it to start with %q", tt.limit, i, line, tt.fields[i]+": ")
				}
			}
		})
	}
}

func TestFieldErrorError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		err  *algo.FieldError
		want string
	}{
		{&algo.FieldError{Field: "rate", Value: "0/s", Msg: "count must be at least 1"}, `rate: "0/s": count must be at least 1`},
		{&algo.FieldError{Field: "algorithm", Msg: "unknown algorithm"}, "algorithm: unknown algorithm"},
		{&algo.FieldError{Field: "rate", Value: "a\"b\n", Msg: "bad"}, `rate: "a\"b\n": bad`},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("%#v.Error() = %q, want %q", tt.err, got, tt.want)
		}
	}
}

func TestMeterValidate(t *testing.T) {
	t.Parallel()
	gcra := algo.Limit{Algorithm: algo.GCRA, Count: 10, Period: time.Second}
	win := func(count int64, period, bucket time.Duration) algo.Limit {
		return algo.Limit{Algorithm: algo.BucketRing, Count: count, Period: period, Bucket: bucket}
	}
	tests := []struct {
		name  string
		meter algo.Meter
		msg   string // a part of the message; empty: valid
	}{
		{"one limit", algo.Meter{Limits: []algo.Limit{gcra}}, ""},
		{"shadow", algo.Meter{Limits: []algo.Limit{gcra}, Shadow: true}, ""},
		{"three windows", algo.Meter{Limits: []algo.Limit{win(10, time.Second, time.Second), win(15, 3*time.Second, 0), win(20, 5*time.Second, 0)}}, ""},
		{"windows on their gcd", algo.Meter{Limits: []algo.Limit{win(4, 2*time.Second, 0), win(6, 3*time.Second, 0)}}, ""},
		{"record on sliding_log", algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 10, Period: time.Second}}, Record: "GET"}, ""},
		{"record on fixed_window", algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 10, Period: time.Second}}, Record: "GET"}, ""},

		{"no limits", algo.Meter{}, "meter has no limits"},
		{"invalid limit", algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Period: time.Second}}}, "limit 0: rate"},
		{"two algorithms", algo.Meter{Limits: []algo.Limit{win(10, time.Second, 0), gcra}}, "share one algorithm"},
		{"several gcra limits", algo.Meter{Limits: []algo.Limit{gcra, gcra}}, "only bucket_ring meters hold several limits"},
		{"record on gcra", algo.Meter{Limits: []algo.Limit{gcra}, Record: "GET"}, "record: gcra cannot keep recorded values"},
		{"window off the bucket", algo.Meter{Limits: []algo.Limit{win(10, 2*time.Second, 2*time.Second), win(15, 3*time.Second, time.Second)}}, "limit 1: bucket_ring period 3s is not a multiple of the bucket 2s"},
		{"ring too long", algo.Meter{Limits: []algo.Limit{win(10, time.Second, 0), win(15, 3601*time.Second, 0)}}, "spans more than 3600 buckets"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.meter.Validate()
			if tt.msg == "" && err != nil || tt.msg != "" && (err == nil || !strings.Contains(err.Error(), tt.msg)) {
				t.Errorf("Meter.Validate() = %v, want an error containing %q (none if empty)", err, tt.msg)
			}
		})
	}
}

func TestMeterRingBucket(t *testing.T) {
	t.Parallel()
	tests := []struct {
		periods []time.Duration
		buckets []time.Duration
		want    time.Duration
	}{
		{[]time.Duration{time.Second, 3 * time.Second, 5 * time.Second}, []time.Duration{0, 0, 0}, time.Second},
		{[]time.Duration{2 * time.Second, 3 * time.Second}, []time.Duration{0, 0}, time.Second},
		{[]time.Duration{time.Minute, time.Hour}, []time.Duration{0, 0}, time.Minute},
		{[]time.Duration{time.Hour}, []time.Duration{0}, time.Hour},
		{[]time.Duration{time.Hour}, []time.Duration{time.Minute}, time.Minute},
		{[]time.Duration{time.Hour, time.Minute}, []time.Duration{0, 10 * time.Second}, 10 * time.Second},
		{[]time.Duration{time.Hour, time.Minute}, []time.Duration{time.Second, 10 * time.Second}, 10 * time.Second},
	}
	for _, tt := range tests {
		var m algo.Meter
		for i := range tt.periods {
			m.Limits = append(m.Limits, algo.Limit{Algorithm: algo.BucketRing, Count: 1, Period: tt.periods[i], Bucket: tt.buckets[i]})
		}
		if got := m.RingBucket(); got != tt.want {
			t.Errorf("RingBucket(periods %v, buckets %v) = %v, want %v", tt.periods, tt.buckets, got, tt.want)
		}
	}
}

// TestParseQuota checks the rates a policy writes: ParseRate's, and a week or a
// month of the calendar, which have no period; and that ParseRate refuses the
// calendar's units with a message that says what they are.
func TestParseQuota(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in     string
		count  int64
		period time.Duration
		unit   algo.CalendarUnit
	}{
		{"10000/month", 10000, 0, algo.CalendarMonth},
		{" 10000 / Month ", 10000, 0, algo.CalendarMonth},
		{"5/week", 5, 0, algo.CalendarWeek},
		{"10000/day", 10000, 24 * time.Hour, algo.CalendarDay},
		{"10000/d", 10000, 24 * time.Hour, algo.CalendarDay},
		{"10000/days", 10000, 24 * time.Hour, algo.CalendarDay},
		{"10000/2day", 10000, 48 * time.Hour, ""},
		{"5/minute", 5, time.Minute, ""},
		{"5/m", 5, time.Minute, ""},
		{"5/hour", 5, time.Hour, ""},
		{"100/s", 100, time.Second, ""},
	}
	for _, tt := range tests {
		count, period, unit, err := algo.ParseQuota(tt.in)
		if count != tt.count || period != tt.period || unit != tt.unit || err != nil {
			t.Errorf("ParseQuota(%q) = %d, %v, %q, %v, want %d, %v, %q, nil", tt.in, count, period, unit, err, tt.count, tt.period, tt.unit)
		}
	}
	errs := []struct {
		in, msg string
		quota   bool // ParseQuota, else ParseRate
	}{
		{"10/x", `rate: "10/x": unknown unit "x"; use ms, s, min, h, day, week or month`, true},
		{"10/x", `rate: "10/x": unknown unit "x"; use ms, s, min, h or day`, false},
		{"1/2month", `rate: "1/2month": a calendar month takes no multiplier; write COUNT/month, or a period in days such as 1/30day`, true},
		{"5/weeks", `rate: "5/weeks": unknown unit "weeks"; use ms, s, min, h, day, week or month`, true},
		{"10000/month", `rate: "10000/month": unknown unit "month" for a period; a week or a month is a calendar window, which only a policy's fixed_window limit counts; for a period write days, e.g. 7day`, false},
	}
	for _, tt := range errs {
		var err error
		if tt.quota {
			_, _, _, err = algo.ParseQuota(tt.in)
		} else {
			_, _, err = algo.ParseRate(tt.in)
		}
		if err == nil || err.Error() != tt.msg {
			t.Errorf("Parse(%q, quota %v) = %v, want %s", tt.in, tt.quota, err, tt.msg)
		}
	}
}
