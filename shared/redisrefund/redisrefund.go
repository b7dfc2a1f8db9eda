// Package redisrefund gives back units charged on Redis by tollgate's decision
// script, with its refund script (algo.RefundScript): the refund of engine leases
// (engine.Refunder). It needs only the charge's keys, meters, cost and time, not the
// decision's undo data: the refund script is told that the key has been written
// since the charge, so it applies the algorithm's own inverse, which takes the units
// off the window they were charged in (fixed_window, sliding_window) or gives back
// what the refill since the charge has not made up for (token_bucket, gcra), and
// never loses another request's charge.
package redisrefund

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// noDump stands for the key's DUMP before and after the charge: no DUMP is equal
// to it (a DUMP ends in an RDB version and a CRC-64 of the rest), so the refund
// script takes the inverse's path, and a RESTORE of it would fail rather than
// write anything.
const noDump = "tollgate:no-dump"

// Refunder runs the refund script on a Redis client. It is safe for simultaneous
// use.
type Refunder struct {
	client redis.UniversalClient
	script *redis.Script
}

// New returns a Refunder on client.
func New(client redis.UniversalClient) (*Refunder, error) {
	if client == nil {
		return nil, errors.New("redisrefund: nil client")
	}
	return &Refunder{client: client, script: redis.NewScript(algo.RefundScript())}, nil
}

// Refund gives back c.Cost units to each meter of c, charged at chargedMicros (Unix
// µs, the server's clock when the decision script ran), with one script call per
// meter (their keys may be in different cluster slots). The refund's own time is
// c.NowMicros, or the server's clock when it is 0.
func (r *Refunder) Refund(ctx context.Context, c algo.Check, chargedMicros int64) error {
	if len(c.Keys) != len(c.Meters) {
		return fmt.Errorf("redisrefund: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	c = c.AtWindows(chargedMicros) // a calendar limit gives back to its charge's window
	var errs []error
	for i, k := range c.Keys {
		undo := []algo.Undo{{Keys: []string{k}, Before: []string{noDump}, ExpiresMs: []int64{-2}, After: []string{noDump}}}
		keys, args := algo.RefundCall(c.Meters[i:i+1], c.Keys[i:i+1], undo, chargedMicros, c.NowMicros, c.Cost)
		if err := r.script.Run(ctx, r.client, keys, args...).Err(); err != nil {
			errs = append(errs, fmt.Errorf("redisrefund: refund %q: %w", k, err))
		}
	}
	return errors.Join(errs...)
}
