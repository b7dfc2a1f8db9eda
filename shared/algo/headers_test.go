package algo_test

import (
	"slices"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

func TestHeaders(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		policy   string
		decision algo.Decision
		want     [][2]string
	}{
		{
			name:     "allowed",
			policy:   "per-key",
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
			if got := algo.Headers(tt.policy, tt.decision); !slices.Equal(got, tt.want) {
				t.Errorf("Headers(%q, %+v) = %q, want %q", tt.policy, tt.decision, got, tt.want)
			}
		})
	}
}

func TestPolicyItemNames(t *testing.T) {
	t.Parallel()
	d := algo.Decision{Limit: 3, Period: 10 * time.Second}
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
		if got := algo.PolicyItem(tt.name, d); got != tt.want {
			t.Errorf("PolicyItem(%q, %+v) = %q, want %q", tt.name, d, got, tt.want)
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
