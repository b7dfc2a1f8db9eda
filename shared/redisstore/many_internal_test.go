package redisstore

import (
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// TestManyArgsShareProfiles checks the many-request script's arguments: requests of
// the same one-limit meter share one profile, even when the batch's first request
// is the one that puts the meter in the cache; a request recording a value, or of
// another meter, gets its own.
func TestManyArgsShareProfiles(t *testing.T) {
	gcra := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 10, Period: time.Second}}}
	other := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 20, Period: time.Second}}}
	logged := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 5, Period: time.Minute}}, Record: "user-1"}
	meters := []algo.Meter{gcra, gcra, logged, gcra, other, other}
	var batch []*call
	for i, m := range meters {
		batch = append(batch, &call{check: algo.Check{Keys: []string{fmt.Sprintf("k%d", i)}, Meters: []algo.Meter{m}, Cost: int64(i)}})
	}
	var ac argCache
	args := ac.many(nil, "sha", batch)
	str := func(i int) string {
		t.Helper()
		if i >= len(args) {
			t.Fatalf("arguments end at %d: %v", len(args), args)
		}
		switch v := args[i].(type) {
		case string:
			return v
		case *string:
			return *v
		case int:
			return fmt.Sprint(v)
		}
		t.Fatalf("argument %d is %T", i, args[i])
		return ""
	}
	num := func(i int) int {
		var n int
		if _, err := fmt.Sscan(str(i), &n); err != nil {
			t.Fatalf("argument %d = %q: %v", i, str(i), err)
		}
		return n
	}
	if str(0) != "evalsha" || str(1) != "sha" || num(2) != len(meters) {
		t.Fatalf("command head %v", args[:3])
	}
	pos := 3 + len(meters)
	if num(pos) != len(meters) {
		t.Fatalf("request count %s, want %d", str(pos), len(meters))
	}
	profiles := num(pos + 1)
	if profiles != 3 {
		t.Errorf("%d profiles for gcra ×3, a recorded sliding_log, another gcra ×2; want 3", profiles)
	}
	pos += 2
	for range profiles {
		pos += 1 + num(pos)
	}
	want := []int{1, 1, 2, 1, 3, 3}
	for i := range meters {
		if nk, p, cost := num(pos), num(pos+1), num(pos+3); nk != 1 || p != want[i] || cost != i {
			t.Errorf("request %d: keys %d, profile %d, cost %d; want 1, %d, %d", i, nk, p, cost, want[i], i)
		}
		pos += 4
	}
	if pos != len(args) {
		t.Errorf("%d arguments left over", len(args)-pos)
	}
}
