package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// noDump stands for the key's DUMP before and after the charge: no DUMP is equal
// to it (a DUMP ends in an RDB version and a CRC-64 of the rest), so the refund
// script takes the inverse's path, and a RESTORE of it would fail rather than
// write anything.
const noDump = "tollgate:no-dump"

// Refund gives back c.Cost units to each meter of c, charged at chargedMicros (Unix
// µs, the server's clock when the decision ran), with one call of the library's
// refund entry per meter (their keys may be in different cluster slots): the refund
// of engine leases (engine.Refunder). It needs only the charge's keys, meters, cost
// and time, not the decision's undo data: the refund entry is told that the key has
// been written since the charge, so it applies the algorithm's own inverse, which
// takes the units off the window they were charged in (fixed_window,
// sliding_window) or gives back what the refill since the charge has not made up
// for (token_bucket, gcra), and never loses another request's charge. The refund's
// own time is c.NowMicros, or the server's clock when it is 0.
func (s *Store) Refund(ctx context.Context, c algo.Check, chargedMicros int64) error {
	if len(c.Keys) != len(c.Meters) {
		return fmt.Errorf("redisstore: refund: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	c = c.AtWindows(chargedMicros) // a calendar limit gives back to its charge's window
	var errs []error
	for i, k := range c.Keys {
		undo := []algo.Undo{{Keys: []string{k}, Before: []string{noDump}, ExpiresMs: []int64{-2}, After: []string{noDump}}}
		keys, args := algo.RefundCall(c.Meters[i:i+1], c.Keys[i:i+1], undo, chargedMicros, c.NowMicros, c.Cost)
		sc := entryCall(algo.EntryRefund, keys, args)
		s.exec(ctx, sc)
		if err := sc.cmd.Err(); err != nil {
			errs = append(errs, fmt.Errorf("redisstore: refund %q: %w", k, err))
		}
	}
	return errors.Join(errs...)
}
