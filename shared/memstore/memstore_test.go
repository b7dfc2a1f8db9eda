package memstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
)

func TestBoundedAndAllOrNothing(t *testing.T) {
	t.Parallel()
	s := memstore.New(100, nil)
	m := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 1, Period: time.Hour}}}
	ctx := context.Background()
	now := int64(1_700_000_000_000_000)
	for i := range 1000 {
		if _, err := s.Decide(ctx, algo.Check{Keys: []string{fmt.Sprint("k", i)}, Meters: []algo.Meter{m}, Cost: 1, NowMicros: now}); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > 100 {
		t.Errorf("Len() = %d after 1000 keys, want at most 100", n)
	}
	// Two meters, the second full: the first must not be charged.
	tight := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 1, Period: time.Hour}}}
	loose := algo.Meter{Limits: []algo.Limit{{Algorithm: algo.FixedWindow, Count: 5, Period: time.Hour}}}
	c := algo.Check{Keys: []string{"tight", "loose"}, Meters: []algo.Meter{tight, loose}, Cost: 1, NowMicros: now}
	if out, _ := s.Decide(ctx, c); !out.Allowed {
		t.Fatalf("first check = %+v, want allowed", out)
	}
	if out, _ := s.Decide(ctx, c); out.Allowed {
		t.Fatalf("second check = %+v, want denied by the tight meter", out)
	}
	st, ok := s.State("loose", now)
	if !ok || st.Count != 1 {
		t.Errorf("loose meter count = %d (%v), want 1: a denied request charges nothing", st.Count, ok)
	}
}
