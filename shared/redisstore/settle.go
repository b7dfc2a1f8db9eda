package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// A SettleError is the error of a settlement (algo.Check.Settle) that did not land on
// every meter: Settled lists the meters (indexes into the check's meters) whose charge
// landed, so a caller that settles again sends only the others. A meter whose call
// failed may still have been charged (a call that timed out may have run); Settled
// holds only the meters known to be charged.
type SettleError struct {
	Settled []int
	Err     error
}

func (e *SettleError) Error() string { return e.Err.Error() }
func (e *SettleError) Unwrap() error { return e.Err }

// settle charges every meter of c, never refusing (the library's settle entry): one
// call per cluster slot, each slot on its own, since nothing is refused and so nothing
// must be all-or-nothing. A settlement never joins a batch and never takes undo data.
// Its outcome is allowed; when a slot fails, the others are still settled and the
// error is a *SettleError naming the meters that landed.
func (s *Store) settle(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	for _, m := range c.Meters {
		if !m.Algorithm().CanSettle() {
			return algo.Outcome{}, fmt.Errorf("redisstore: %w", algo.ErrCannotSettle)
		}
	}
	groups := [][]int{nil}
	if s.cluster && !oneSlot(c.Keys) {
		groups = slotGroups(c.Keys)
	} else {
		for i := range c.Keys {
			groups[0] = append(groups[0], i)
		}
	}
	out := algo.Outcome{Allowed: true, Decisions: make([][]algo.Decision, len(c.Meters))}
	var settled []int
	var errs []error
	for _, g := range groups {
		sub := subCheck(c, g)
		sub.Settle = true
		rep, err := s.settleSlot(ctx, sub)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if out.NowMicros == 0 {
			out.NowMicros = rep.NowMicros
		}
		for i, mi := range g {
			out.Decisions[mi] = rep.Decisions[i]
		}
		settled = append(settled, g...)
	}
	if len(errs) > 0 {
		return out, &SettleError{Settled: settled, Err: errors.Join(errs...)}
	}
	return out, nil
}

// settleSlot runs the settle entry for c, whose keys share one cluster slot, through
// the node's breaker. A MOVED reply (the call did not run) is followed once; any other
// error is final, since a call that timed out may have run.
func (s *Store) settleSlot(ctx context.Context, c algo.Check) (algo.Reply, error) {
	node, err := s.nodeOf(ctx, c.Keys[0])
	if err != nil {
		return algo.Reply{}, settleError(c, err)
	}
	var ps pass
	if err := s.enter(&ps, node); err != nil {
		return algo.Reply{}, settleError(c, err)
	}
	sc := settleCall(c)
	s.exec(ctx, sc)
	if _, moved := redis.IsMovedError(sc.cmd.Err()); moved && s.cc != nil {
		s.cc.ReloadState(ctx)
		s.exec(ctx, sc)
	}
	rep, err := sc.answer(c)
	ps.record(node, err)
	s.leave(&ps)
	if cerr := sc.cmd.Err(); cerr != nil {
		return algo.Reply{}, settleError(c, cerr)
	}
	if err != nil {
		return algo.Reply{}, err
	}
	s.waited(sc)
	return rep, nil
}

// settleCall is the call of the settle entry for c: decide's keys and arguments.
func settleCall(c algo.Check) *scriptCall {
	args := algo.AppendDecideArgs(callArgs(c.Keys, 4+2*len(c.Meters)), c, false)
	sc := &scriptCall{entry: algo.EntrySettle, args: args, ints: true}
	if c.Cost > 0 {
		sc.replicas = c.Replicas()
	}
	return sc
}

func settleError(c algo.Check, err error) error {
	return fmt.Errorf("redisstore: settle %q: %w", c.Keys[0], err)
}
