package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// Refund gives back c.Cost units to each meter of c, charged at chargedMicros (Unix
// µs, the server's clock when the decision ran), with one call of the library's
// refund entry per meter (their keys may be in different cluster slots): the refund
// of engine leases (engine.Refunder). It needs only the charge's keys, meters, cost
// and time, not the decision's undo data: with no undo keys the refund entry applies
// the algorithm's own inverse, which
// takes the units off the window they were charged in (fixed_window,
// sliding_window) or gives back what the refill since the charge has not made up
// for (token_bucket, gcra), and never loses another request's charge. The refund's
// own time is c.NowMicros, or the server's clock when it is 0. Each call goes to its
// node through the node's circuit breaker, as a decision does.
func (s *Store) Refund(ctx context.Context, c algo.Check, chargedMicros int64) error {
	if len(c.Keys) != len(c.Meters) {
		return fmt.Errorf("redisstore: refund: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	c = c.AtWindows(chargedMicros) // a calendar limit gives back to its charge's window
	var errs []error
	for i := range c.Keys {
		sub := algo.Check{Keys: c.Keys[i : i+1], Meters: c.Meters[i : i+1], Cost: c.Cost}
		errs = append(errs, s.refundMeter(ctx, sub, chargedMicros, c.NowMicros))
	}
	return errors.Join(errs...)
}

// refundMeter refunds the one meter of c through the breaker of its node.
func (s *Store) refundMeter(ctx context.Context, c algo.Check, charged, now int64) error {
	node, err := s.nodeOf(ctx, c.Keys[0])
	if err != nil {
		return fmt.Errorf("redisstore: refund %q: %w", c.Keys[0], err)
	}
	var ps pass
	if err := s.enter(&ps, node); err != nil {
		return fmt.Errorf("redisstore: refund %q: %w", c.Keys[0], err)
	}
	err = s.refund(ctx, c, []algo.Undo{{}}, charged, now)
	ps.record(node, err)
	s.leave(&ps)
	return err
}
