package engine

import (
	"context"
	"fmt"
)

// Grants: a front door that lets its clients admit requests themselves (Envoy's
// rate limit quota filter, package rlqs) first takes the units it grants them from
// the limit in the store, so that the store's count is always at least what the
// clients may admit, and later gives back what they did not use. Both are ordinary
// charges on the plan's keys: the same state every other front door decides on.

// A Take is the answer to Engine.Take.
type Take struct {
	// Units is how many units were taken from every item of the plan, 0 to the
	// units asked for.
	Units int64
	// Verdict is the store's last decision: each limit's remaining and reset after
	// the take, and the store's time (NowMicros), which a give back names.
	Verdict Verdict
}

// Take charges up to want units to every item of p, in the store, all-or-nothing
// across the items: want when the limits hold that many, else what the most
// restrictive one has left (a second round trip), else nothing. It never goes
// through the deny cache, a lease or the failure mode: a store failure is an error,
// so that the caller decides what its clients may admit without the store. p's cost
// is ignored.
func (e *Engine) Take(ctx context.Context, p Plan, want int64) (Take, error) {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if want <= 0 || len(p.Items) == 0 {
		return Take{}, nil
	}
	for try := 0; try < 2 && want > 0; try++ {
		p.Cost = want
		out, err := e.decideInStore(ctx, p.cur.pol, p.Check())
		if err != nil {
			return Take{}, fmt.Errorf("engine: take %d units: %w", want, err)
		}
		v := e.verdict(p, out)
		if out.Allowed {
			return Take{Units: want, Verdict: v}, nil
		}
		left := want
		for _, l := range v.Limits {
			if !l.Shadow {
				left = min(left, l.Remaining)
			}
		}
		if try == 1 || left <= 0 || left >= want {
			return Take{Verdict: v}, nil
		}
		want = left
	}
	return Take{}, nil
}

// GiveBack gives back units of every item of p that a Take charged at
// chargedMicros (its Verdict.NowMicros, the store's time): units that were taken and
// never admitted. A window algorithm takes them off the window they were charged to,
// never a later one.
func (e *Engine) GiveBack(ctx context.Context, p Plan, units, chargedMicros int64) error {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if units <= 0 || len(p.Items) == 0 {
		return nil
	}
	if err := e.refund(ctx, p, units, chargedMicros); err != nil {
		return fmt.Errorf("engine: give back %d units: %w", units, err)
	}
	return nil
}
