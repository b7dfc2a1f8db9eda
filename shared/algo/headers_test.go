package algo_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
)

func TestHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		policy   string
		limit    algo.Limit
		decision algo.Decision
		want     [][2]string
	}{
		{
			name:     "allowed",
			policy:   "per-key",
			limit:    algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Minute},
			decision: algo.Decision{Allowed: true, Limit: 100, Period: time.Minute, Remaining: 42, ResetAfter: 17 * time.Second},
			want: [][2]string{
				{"RateLimit-Policy", `"per-key";q=100;w=60`},
				{"RateLimit", `"per-key";r=42;t=17`},
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "42"},
				{"X-RateLimit-Reset", "17"},
			},
		},
		{
			name:     "allowed, reset rounded up",
			policy:   "per-key",
			limit:    algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Minute},
			decision: algo.Decision{Allowed: true, Limit: 100, Period: time.Minute, Remaining: 42, ResetAfter: 16*time.Second + time.Microsecond},
			want: [][2]string{
				{"RateLimit-Policy", `"per-key";q=100;w=60`},
				{"RateLimit", `"per-key";r=42;t=17`},
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "42"},
				{"X-RateLimit-Reset", "17"},
			},
		},
		{
			name:     "allowed, nothing to reset",
			policy:   "burst",
			limit:    algo.Limit{Algorithm: algo.FixedWindow, Count: 5, Period: time.Second},
			decision: algo.Decision{Allowed: true, Limit: 5, Period: time.Second, Remaining: 5},
			want: [][2]string{
				{"RateLimit-Policy", `"burst";q=5;w=1`},
				{"RateLimit", `"burst";r=5;t=0`},
				{"X-RateLimit-Limit", "5"},
				{"X-RateLimit-Remaining", "5"},
				{"X-RateLimit-Reset", "0"},
			},
		},
		{
			name:     "denied",
			policy:   "per-key",
			limit:    algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Minute},
			decision: algo.Decision{Limit: 100, Period: time.Minute, Remaining: 0, ResetAfter: 30 * time.Second, RetryAfter: 1500 * time.Millisecond},
			want: [][2]string{
				{"RateLimit-Policy", `"per-key";q=100;w=60`},
				{"RateLimit", `"per-key";r=0;t=30`},
				{"X-RateLimit-Limit", "100"},
				{"X-RateLimit-Remaining", "0"},
				{"X-RateLimit-Reset", "30"},
				{"Retry-After", "2"},
			},
		},
		{
			name:     "denied, no retry time",
			policy:   "p",
			limit:    algo.Limit{Algorithm: algo.FixedWindow, Count: 1, Period: 500 * time.Millisecond},
			decision: algo.Decision{Limit: 1, Period: 500 * time.Millisecond, Remaining: -3},
			want: [][2]string{
				{"RateLimit-Policy", `"p";q=1;w=1`},
				{"RateLimit", `"p";r=0;t=0`},
				{"X-RateLimit-Limit", "1"},
				{"X-RateLimit-Remaining", "0"},
				{"X-RateLimit-Reset", "0"},
				{"Retry-After", "1"},
			},
		},
		{
			name:     "quoted name",
			policy:   `a"b\c`,
			limit:    algo.Limit{Algorithm: algo.FixedWindow, Count: 10, Period: 1500 * time.Millisecond},
			decision: algo.Decision{Allowed: true, Limit: 10, Period: 1500 * time.Millisecond, Remaining: 9, ResetAfter: 150 * time.Millisecond},
			want: [][2]string{
				{"RateLimit-Policy", `"a\"b\\c";q=10;w=2`},
				{"RateLimit", `"a\"b\\c";r=9;t=1`},
				{"X-RateLimit-Limit", "10"},
				{"X-RateLimit-Remaining", "9"},
				{"X-RateLimit-Reset", "1"},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := algo.Headers([]algo.Quota{{Name: tt.policy, Limit: tt.limit, Decision: tt.decision}}, 0); !slices.Equal(got, tt.want) {
				t.Errorf("Headers(%q, %v, %+v) = %q, want %q", tt.policy, tt.limit, tt.decision, got, tt.want)
			}
		})
	}
}

// TestQuotaWindow checks the quota and window the headers state for each kind of
// limit.
func TestQuotaWindow(t *testing.T) {
	t.Parallel()
	tests := []struct {
		l     algo.Limit
		q     int64
		w     time.Duration
		items string
	}{
		{algo.Limit{Algorithm: algo.FixedWindow, Count: 100, Period: time.Minute}, 100, time.Minute, `"x";q=100;w=60`},
		{algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second}, 100, time.Second, `"x";q=100;w=1`},
		{algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 200}, 200, 2 * time.Second, `"x";q=200;w=2`},
		{algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Period: time.Minute, Burst: 15}, 15, 90 * time.Second, `"x";q=15;w=90`},
		{algo.Limit{Algorithm: algo.LeakyBucket, Count: 10, Period: time.Second, Burst: 20}, 20, 2 * time.Second, `"x";q=20;w=2`},
		// Refilled in 100ms: stated as the rate per second, which is larger.
		{algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 10}, 100, time.Second, `"x";q=100;w=1`},
		{algo.Limit{Algorithm: algo.TokenBucket, Count: 3000, Period: time.Minute, Burst: 20}, 50, time.Second, `"x";q=50;w=1`},
	}
	for _, tt := range tests {
		q, w := algo.QuotaWindow(tt.l)
		if q != tt.q || w != tt.w {
			t.Errorf("QuotaWindow(%v) = %d, %v, want %d, %v", tt.l, q, w, tt.q, tt.w)
		}
		if got := algo.PolicyItem(algo.Quota{Name: "x", Limit: tt.l}); got != tt.items {
			t.Errorf("PolicyItem(%v) = %s, want %s", tt.l, got, tt.items)
		}
	}
}

// TestHeadersRemainingWithinQuota drives every algorithm, with and without a burst,
// through the Go models with a random mix of costs and pauses, and checks every
// answer's headers: RateLimit's r never exceeds RateLimit-Policy's q, both list the
// same quota, and X-RateLimit-Remaining never exceeds X-RateLimit-Limit.
func TestHeadersRemainingWithinQuota(t *testing.T) {
	t.Parallel()
	var limits []algo.Limit
	for _, a := range algo.Algorithms {
		base := algo.Limit{Algorithm: a, Count: 20, Period: 2 * time.Second}
		if a == algo.BucketRing {
			base.Bucket = 200 * time.Millisecond
		}
		limits = append(limits, base)
		if a.HasBurst() {
			for _, burst := range []int64{1, 5, 60} {
				b := base
				b.Burst = burst
				limits = append(limits, b)
			}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, l := range limits {
		if err := l.Validate(); err != nil {
			t.Fatalf("%v: %v", l, err)
		}
		now := time.Unix(1_700_000_000, 0)
		st := memstore.New(10, func() time.Time { return now })
		m := algo.Meter{Limits: []algo.Limit{l}}
		for i := range 400 {
			cost := int64(rng.IntN(3))
			out, err := st.Decide(context.Background(), algo.Check{Keys: []string{"k"}, Meters: []algo.Meter{m}, Cost: cost, NowMicros: now.UnixMicro()})
			if err != nil {
				t.Fatalf("%v: Decide = %v", l, err)
			}
			h := algo.Headers([]algo.Quota{{Name: "x", Limit: l, Decision: out.Decisions[0][0]}}, 0)
			q := param(t, h, "RateLimit-Policy", "q")
			r := param(t, h, "RateLimit", "r")
			if r > q || header(h, "X-RateLimit-Remaining") > header(h, "X-RateLimit-Limit") || header(h, "X-RateLimit-Limit") != q {
				t.Fatalf("%v, step %d (cost %d): headers %q: remaining above the quota", l, i, cost, h)
			}
			now = now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
	}
}

// param returns the integer parameter p of the one item of header name.
func param(t *testing.T, h [][2]string, name, p string) int64 {
	t.Helper()
	for _, kv := range h {
		if kv[0] != name {
			continue
		}
		for _, part := range strings.Split(kv[1], ";")[1:] {
			if v, ok := strings.CutPrefix(part, p+"="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("%s: %q: %v", name, kv[1], err)
				}
				return n
			}
		}
	}
	t.Fatalf("headers %q: no %s with %s", h, name, p)
	return 0
}

func header(h [][2]string, name string) int64 {
	for _, kv := range h {
		if kv[0] == name {
			n, _ := strconv.ParseInt(kv[1], 10, 64)
			return n
		}
	}
	return -1
}

// TestHeadersListEveryQuota checks that every quota of a request is listed, in
// order, and that the X- headers and Retry-After follow the deciding one.
func TestHeadersListEveryQuota(t *testing.T) {
	t.Parallel()
	qs := []algo.Quota{
		{Name: "per-key.1", Limit: algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 200},
			Decision: algo.Decision{Allowed: true, Remaining: 150, ResetAfter: 500 * time.Millisecond}},
		{Name: "per-key.2", Limit: algo.Limit{Algorithm: algo.FixedWindow, Count: 10000, Period: 24 * time.Hour},
			Decision: algo.Decision{Remaining: 0, ResetAfter: time.Hour, RetryAfter: time.Hour}},
	}
	want := [][2]string{
		{"RateLimit-Policy", `"per-key.1";q=200;w=2, "per-key.2";q=10000;w=86400`},
		{"RateLimit", `"per-key.1";r=150;t=1, "per-key.2";r=0;t=3600`},
		{"X-RateLimit-Limit", "10000"},
		{"X-RateLimit-Remaining", "0"},
		{"X-RateLimit-Reset", "3600"},
		{"Retry-After", "3600"},
	}
	if got := algo.Headers(qs, 1); !slices.Equal(got, want) {
		t.Errorf("Headers = %q, want %q", got, want)
	}
	if got := algo.Headers(nil, 0); got != nil {
		t.Errorf("Headers(no quotas) = %q, want none", got)
	}
}

func TestPolicyItemNames(t *testing.T) {
	t.Parallel()
	l := algo.Limit{Algorithm: algo.FixedWindow, Count: 3, Period: 10 * time.Second}
	tests := []struct {
		name, want string
	}{
		{"per-key", `"per-key";q=3;w=10`},
		{"", `"";q=3;w=10`},
		{`say "hi"`, `"say \"hi\"";q=3;w=10`},
		{`C:\path\`, `"C:\\path\\";q=3;w=10`},
		{"tab\there", `"tab?here";q=3;w=10`},
		{"line\n", `"line?";q=3;w=10`},
		{"\x7f", `"?";q=3;w=10`},
		{"é", `"??";q=3;w=10`},
		{" ~!", `" ~!";q=3;w=10`},
	}
	for _, tt := range tests {
		if got := algo.PolicyItem(algo.Quota{Name: tt.name, Limit: l}); got != tt.want {
			t.Errorf("PolicyItem(%q, %v) = %q, want %q", tt.name, l, got, tt.want)
		}
	}
}

func TestSeconds(t *testing.T) {
	t.Parallel()
	tests := []struct {
		d                   time.Duration
		seconds, retryAfter int64
	}{
		{-time.Second, 0, 1},
		{0, 0, 1},
		{time.Nanosecond, 1, 1},
		{time.Microsecond, 1, 1},
		{500 * time.Millisecond, 1, 1},
		{time.Second, 1, 1},
		{time.Second + time.Nanosecond, 2, 2},
		{1500 * time.Millisecond, 2, 2},
		{59*time.Second + 999*time.Millisecond, 60, 60},
		{time.Hour, 3600, 3600},
	}
	for _, tt := range tests {
		if got := algo.Seconds(tt.d); got != tt.seconds {
			t.Errorf("Seconds(%v) = %d, want %d", tt.d, got, tt.seconds)
		}
		if got := algo.RetryAfterSeconds(tt.d); got != tt.retryAfter {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tt.d, got, tt.retryAfter)
		}
	}
}
