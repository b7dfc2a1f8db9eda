package memstore

import (
	"context"
	"fmt"
	"math"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// Refund gives back cost units to every meter of c, charged by a decision made at
// chargedMicros (Unix µs), as the Redis refund script's inverses do: fixed_window and
// sliding_window take the units off the counter of the window they were charged in,
// if it is still kept (a window that has ended keeps them); token_bucket and gcra
// give back what the refill since the charge has not made up for already. A refund
// never gives back more than was charged, and never to a later window. Meters of
// other algorithms are an error, and nothing is refunded.
func (s *Store) Refund(_ context.Context, c algo.Check, chargedMicros int64) error {
	if len(c.Keys) != len(c.Meters) {
		return fmt.Errorf("memstore: refund: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	for _, m := range c.Meters {
		switch a := m.Algorithm(); a {
		case algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket, algo.GCRA:
		default:
			return fmt.Errorf("memstore: refund: %s has no refund", a)
		}
	}
	if c.Cost <= 0 {
		return nil
	}
	now := c.NowMicros
	if now == 0 {
		now = s.clock().UnixMicro()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, m := range c.Meters {
		st, ok := s.states[c.Keys[i]]
		if !ok || !st.Set || st.ExpiresMicros <= now {
			continue // nothing kept: the charge has expired with the state
		}
		s.states[c.Keys[i]] = refund(m.Limits[0], st, chargedMicros, now, c.Cost)
	}
	return nil
}

// refund returns st with cost units charged at charged given back at now.
func refund(l algo.Limit, st algo.State, charged, now, cost int64) algo.State {
	p := l.Period.Microseconds()
	switch l.Algorithm {
	case algo.FixedWindow, algo.SlidingWindow:
		w := charged / p // Unix times here are positive
		if l.Calendar.Unit != "" {
			w = l.In(charged).WindowStartMicros // a calendar window is named by its start
		}
		switch st.Window {
		case w:
			st.Count = max(0, st.Count-cost)
		case w + 1:
			if l.Calendar.Unit == "" {
				st.Prev = max(0, st.Prev-cost)
			}
		}
	case algo.TokenBucket:
		// Refill since the charge may have filled the bucket, where the charged
		// tokens would have been lost anyway: give back what it has not made up for.
		give := float64(cost) - math.Max(0, st.Time-float64(charged))*float64(l.Count)/float64(p)
		if give > 0 {
			st.Tokens = math.Min(float64(l.Capacity()), st.Tokens+give)
		}
	case algo.GCRA:
		// The charge moved the TAT by cost emission intervals; the time since has
		// passed part of them.
		give := float64(cost)*float64(p)/float64(l.Count) - math.Max(0, float64(now-charged))
		if give > 0 {
			st.Time = math.Max(float64(now), st.Time-give)
		}
	}
	return st
}
