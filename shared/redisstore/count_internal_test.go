package redisstore

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestWindowSetBounded fills a windowSet past maxWindows: windows expired by then are
// forgotten first, and a set of live windows only starts over.
func TestWindowSetBounded(t *testing.T) {
	var w windowSet
	for i := range maxWindows {
		w.add(fmt.Sprintf("old:%d", i), 100, 0) // expires at 100 µs
	}
	if !w.has("old:7", 50) || w.has("old:7", 100) {
		t.Fatal("a window is known until its expiry, and not at it")
	}
	w.add("new", 1000, 200) // full: the expired windows go
	if n := len(w.expires); n != 1 || !w.has("new", 200) {
		t.Fatalf("after adding to a full set of expired windows: %d held, new known %v; want 1, true", n, w.has("new", 200))
	}
	for i := range maxWindows - 1 {
		w.add(fmt.Sprintf("live:%d", i), 1000, 200)
	}
	if n := len(w.expires); n != maxWindows {
		t.Fatalf("%d held, want %d", n, maxWindows)
	}
	w.add("one-more", 1000, 200) // full of live windows: starts over
	if n := len(w.expires); n != 1 || !w.has("one-more", 200) || w.has("new", 200) {
		t.Fatalf("after adding to a full set of live windows: %d held; want only the new one", n)
	}
	// Full, with a few windows expired: forgetting those would free too little room.
	clear(w.expires)
	for i := range maxWindows {
		exp := int64(1000)
		if i < 10 {
			exp = 100
		}
		w.add(fmt.Sprintf("mixed:%d", i), exp, 0)
	}
	w.add("last", 1000, 200)
	if n := len(w.expires); n != 1 {
		t.Fatalf("after adding to a full set with 10 expired windows: %d held; want 1 (started over)", n)
	}
}

// TestClockCheck: Preload measures the offset between this clock and the server's
// (on one machine, small: counting stays on); a store whose check found them too far
// apart (an offset past maxClockOffset, set here: a server's TIME cannot be moved to
// show it) sends one-limit fixed_window requests to the library.
func TestClockCheck(t *testing.T) {
	srv := redistest.StartServer(t)
	s, err := New(srv.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	if off, counting := s.ClockOffset(); !counting || off > maxClockOffset || off < -maxClockOffset {
		t.Fatalf("one machine's clocks: offset %v, counting %v; want within %v and counting", off, counting, maxClockOffset)
	}
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 5, Period: time.Minute}}}
	c := algo.Check{Keys: []string{"k"}, Meters: []algo.Meter{m}, Cost: 1}
	if !s.counts(c) {
		t.Fatal("a one-limit fixed_window check does not count with the clocks in step")
	}
	s.clockOffset.Store(int64(2 * maxClockOffset)) // as checkClock stores a server's clock a second ahead
	if s.counts(c) {
		t.Fatal("a store whose clock is off still counts")
	}
	out, err := s.Decide(ctx, c)
	if err != nil || !out.Allowed {
		t.Fatalf("Decide with counting off = %v, %v; want allowed by the library", out.Allowed, err)
	}
	if n := srv.ScriptCalls(t); n != 1 {
		t.Errorf("library calls = %d, want 1", n)
	}
}
