package algo_test

import (
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

func TestMoreRestrictive(t *testing.T) {
	t.Parallel()
	allow := func(rem int64, reset time.Duration) algo.Decision {
		return algo.Decision{Allowed: true, Remaining: rem, ResetAfter: reset}
	}
	deny := func(retry time.Duration) algo.Decision { return algo.Decision{RetryAfter: retry} }
	tests := []struct {
		name string
		a, b algo.Decision
		want bool
	}{
		{"denial over admission", deny(time.Second), allow(0, time.Hour), true},
		{"admission under denial", allow(0, time.Hour), deny(time.Second), false},
		{"later retry", deny(2 * time.Second), deny(time.Second), true},
		{"earlier retry", deny(time.Second), deny(2 * time.Second), false},
		{"equal denials keep the first", deny(time.Second), deny(time.Second), false},
		{"fewer remaining", allow(1, time.Second), allow(2, time.Hour), true},
		{"more remaining", allow(3, time.Hour), allow(2, time.Second), false},
		{"same remaining, later reset", allow(2, time.Hour), allow(2, time.Second), true},
		{"equal admissions keep the first", allow(2, time.Second), allow(2, time.Second), false},
	}
	for _, tt := range tests {
		if got := algo.MoreRestrictive(tt.a, tt.b); got != tt.want {
			t.Errorf("%s: MoreRestrictive(%+v, %+v) = %v, want %v", tt.name, tt.a, tt.b, got, tt.want)
		}
	}
}

func TestMostRestrictive(t *testing.T) {
	t.Parallel()
	ds := []algo.Decision{
		{Allowed: true, Remaining: 5},
		{RetryAfter: time.Second},
		{Allowed: true, Remaining: 1},
		{RetryAfter: 3 * time.Second},
	}
	all := func(i int) (algo.Decision, bool) { return ds[i], true }
	if got := algo.MostRestrictive(len(ds), all); got != 3 {
		t.Errorf("MostRestrictive(all) = %d, want 3", got)
	}
	allowed := func(i int) (algo.Decision, bool) { return ds[i], ds[i].Allowed }
	if got := algo.MostRestrictive(len(ds), allowed); got != 2 {
		t.Errorf("MostRestrictive(allowed only) = %d, want 2", got)
	}
	none := func(i int) (algo.Decision, bool) { return ds[i], false }
	if got := algo.MostRestrictive(len(ds), none); got != -1 {
		t.Errorf("MostRestrictive(none) = %d, want -1", got)
	}
}
