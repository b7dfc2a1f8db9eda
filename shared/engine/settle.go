package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// Settlements: a cost already spent (an LLM response's tokens, known once the upstream
// has answered) is charged, never refused. A settlement may take a limit past its
// count; the debt it leaves denies later requests until the algorithm pays it back
// (algo.Meter.Settle).
//
// A settlement never goes through the deny cache (a denied key is still charged) nor
// a lease: it is charged in the store at once. A lease's units were charged in the
// store when it was taken, so the store's count holds both, and an instance serving a
// lease admits at most the units it still holds after the debt appears.
//
// When the store fails, a settlement is not decided by the failure mode (admitting
// or denying it means nothing: the cost is spent) and is not retried by the engine:
// a call that timed out may have run, and running it again could charge twice. It is
// counted (Hooks.SettleFailed) and returned as an error wrapping ErrSettleFailed, so
// the caller knows it did not land for certain and may send it again (the filter
// retries within a bound).

// Errors of settlements and reservations.
var (
	// ErrSettleFailed wraps a store failure that left a settlement (or part of it)
	// not known to be charged.
	ErrSettleFailed = errors.New("settlement failed")
	// ErrUnknownReservation is the error of a settlement for a reservation the store
	// does not hold: never made, settled already, or expired (its estimate stands).
	ErrUnknownReservation = errors.New("unknown reservation")
)

// DefaultReservationTTL is how long a reservation waits for its settlement when the
// caller states no time: past it, the estimate stands as the request's cost.
const DefaultReservationTTL = 5 * time.Minute

// MaxReservationTTL bounds how long a reservation is kept.
const MaxReservationTTL = time.Hour

// maxReservationID bounds a reservation id's length, in bytes.
const maxReservationID = 128

// Reservations keeps the records of reservations where every instance can take them
// (redisstore.Store in Redis; memstore.Store in process).
type Reservations interface {
	// PutReservation keeps value under key for ttl unless key holds one already,
	// and reports whether it was kept.
	PutReservation(ctx context.Context, key, value string, ttl time.Duration) (bool, error)
	// TakeReservation returns the value under key and deletes it in one step;
	// false when key holds nothing.
	TakeReservation(ctx context.Context, key string) (string, bool, error)
}

// settleStore settles c in the store: no deny cache, no lease, no failure mode.
func (e *Engine) settleStore(ctx context.Context, p Plan) (Verdict, error) {
	c := p.Check()
	c.Settle = true
	out, err := e.decideInStore(ctx, p.cur.pol, c)
	if err != nil {
		if e.hooks.SettleFailed != nil {
			e.hooks.SettleFailed(p.Domain, p.Cost, err)
		}
		e.log.Warn("settlement failed; not known to be charged", "domain", p.Domain, "units", p.Cost, "err", err)
		return Verdict{}, fmt.Errorf("engine: %w: %w", ErrSettleFailed, err)
	}
	if e.hooks.Settled != nil {
		e.hooks.Settled(p.Domain, p.Cost)
	}
	return e.verdict(p, out), nil
}

// Settle charges the plan's cost to every item, never refusing (see the settlements
// above): the verdict is allowed, and a limit left in debt shows remaining 0 and a
// reset when the debt is paid. Items whose algorithm cannot settle (sliding_log) are
// refused before anything is charged, with an error wrapping ErrBadRequest; a store
// failure is an error wrapping ErrSettleFailed.
func (e *Engine) Settle(ctx context.Context, p Plan) (Verdict, error) {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if err := canSettle(p); err != nil {
		return Verdict{}, err
	}
	if len(p.Items) == 0 {
		return Verdict{Allowed: true}, nil
	}
	start := e.clock()
	v, err := e.settleStore(ctx, p)
	if err == nil && e.hooks.Decided != nil {
		e.hooks.Decided(p.Domain, v, e.clock().Sub(start))
	}
	return v, err
}

// canSettle reports an item of p whose algorithm cannot settle.
func canSettle(p Plan) error {
	for _, it := range p.Items {
		if !it.Meter.Algorithm().CanSettle() {
			return fmt.Errorf("%w: rule %q: %w", ErrBadRequest, it.Rule.Name, algo.ErrCannotSettle)
		}
	}
	return nil
}

// A reserved is the record a reservation keeps in the store.
type reserved struct {
	Keys     []string `json:"k"`
	Estimate int64    `json:"e"`
	Charged  int64    `json:"t"` // the store's time of the charge, Unix µs
}

// reservationKey is the store key of reservation id in domain.
func reservationKey(domain, id string) string { return "tollgate:reservation:" + domain + ":" + id }

// refundable reports whether every algorithm of p can give back a charge (the refund
// of a reservation's unused estimate), naming the fix when not.
func refundable(p Plan) error {
	for _, it := range p.Items {
		switch a := it.Meter.Algorithm(); a {
		case algo.FixedWindow, algo.SlidingWindow, algo.TokenBucket, algo.GCRA:
		default:
			return fmt.Errorf("%w: rule %q: %s cannot give back an unused estimate; reserve on fixed_window, sliding_window, token_bucket or gcra limits, or settle the whole cost after the response without reserve_id", ErrBadRequest, it.Rule.Name, a)
		}
	}
	return nil
}

// checkReservation validates a reservation's id and ttl, naming the field.
func checkReservation(id string, ttl time.Duration) error {
	switch {
	case id == "":
		return fmt.Errorf("%w: reserve_id is empty: send the id that the settlement will name", ErrBadRequest)
	case len(id) > maxReservationID:
		return fmt.Errorf("%w: reserve_id is %d bytes: use at most %d", ErrBadRequest, len(id), maxReservationID)
	case ttl < 0 || ttl > MaxReservationTTL:
		return fmt.Errorf("%w: reservation ttl %s: use 0 (the default, %s) up to %s", ErrBadRequest, ttl, DefaultReservationTTL, MaxReservationTTL)
	}
	return nil
}

// Reserve decides the plan at its cost, the estimate of a request whose actual cost
// is known later, and when it is admitted keeps a reservation named id for ttl (0:
// DefaultReservationTTL), so that SettleReserved on any instance charges or gives back
// the difference. A denial charges nothing and keeps nothing. A reservation never
// comes from the deny cache's admissions nor a lease: the estimate is charged in the
// store, where the settlement finds it. When the store fails, the failure mode decides
// and no reservation is kept (SettleReserved then answers ErrUnknownReservation: the
// caller settles the whole cost with Settle).
func (e *Engine) Reserve(ctx context.Context, p Plan, id string, ttl time.Duration) (Verdict, error) {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if err := checkReservation(id, ttl); err != nil {
		return Verdict{}, err
	}
	if err := refundable(p); err != nil {
		return Verdict{}, err
	}
	if ttl == 0 {
		ttl = DefaultReservationTTL
	}
	if len(p.Items) == 0 {
		return Verdict{Allowed: true}, nil
	}
	start := e.clock()
	now := start.UnixMicro()
	if v, ok := e.fromDenyCache(p, now); ok {
		return v, nil
	}
	out, err := e.decideInStore(ctx, p.cur.pol, p.Check())
	if err != nil {
		return e.failureMode(ctx, p, now, err), nil
	}
	v := e.verdict(p, out)
	p.cur.deny.remember(p, v, now)
	if e.hooks.Decided != nil {
		e.hooks.Decided(p.Domain, v, e.clock().Sub(start))
	}
	if !v.Allowed || p.Cost == 0 {
		return v, nil
	}
	rec := reserved{Keys: p.Check().Keys, Estimate: p.Cost, Charged: out.NowMicros}
	b, err := json.Marshal(rec)
	if err == nil {
		var kept bool
		kept, err = e.reservations.PutReservation(ctx, reservationKey(p.Domain, id), string(b), ttl)
		if err == nil && !kept {
			err = fmt.Errorf("%w: reserve_id %q is held by another reservation: use an id per request", ErrBadRequest, id)
		}
	}
	if err != nil {
		// Without its record the estimate could never be settled: give it back.
		if rerr := e.refund(ctx, p, p.Cost, out.NowMicros); rerr != nil {
			e.log.Warn("refund of an unkept reservation failed; its estimate stands", "err", rerr)
		}
		return Verdict{}, fmt.Errorf("engine: reserve: %w", err)
	}
	return v, nil
}

// refund gives back units of every item of p, charged at charged (Unix µs).
func (e *Engine) refund(ctx context.Context, p Plan, units, charged int64) error {
	if e.refunder == nil {
		return errors.New("engine: no refunder")
	}
	c := p.Check()
	c.Cost = units
	t0 := time.Now()
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), max(p.cur.pol.Failure.Timeout, time.Second))
	err := e.refunder.Refund(rctx, c, charged)
	cancel()
	if e.hooks.StoreCall != nil {
		e.hooks.StoreCall(time.Since(t0), err)
	}
	return err
}

// SettleReserved settles reservation id with the request's actual cost, the plan's
// cost: the part above the estimate is settled (never refused, see Settle), the part
// below is given back (the store's refund: from the window the estimate was charged
// in, or what the refill has not yet made up for). The plan must reach the same limits
// as the reservation's (the same domain and attributes). The reservation is taken
// once: a second settlement, one for an unknown id, or one after the reservation
// expired (its estimate stands) fails with ErrUnknownReservation.
func (e *Engine) SettleReserved(ctx context.Context, p Plan, id string) (Verdict, error) {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if err := checkReservation(id, 0); err != nil {
		return Verdict{}, err
	}
	if err := canSettle(p); err != nil {
		return Verdict{}, err
	}
	v, ok, err := e.reservations.TakeReservation(ctx, reservationKey(p.Domain, id))
	if err != nil {
		if e.hooks.SettleFailed != nil {
			e.hooks.SettleFailed(p.Domain, p.Cost, err)
		}
		return Verdict{}, fmt.Errorf("engine: %w: %w", ErrSettleFailed, err)
	}
	if !ok {
		return Verdict{}, fmt.Errorf("%w %q: never reserved, settled already, or expired (its estimate stands); settle the cost without reserve_id if it was never reserved", ErrUnknownReservation, id)
	}
	var rec reserved
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return Verdict{}, fmt.Errorf("engine: reservation %q: %w", id, err)
	}
	if keys := p.Check().Keys; !slices.Equal(keys, rec.Keys) {
		return Verdict{}, fmt.Errorf("%w: reservation %q was made for limits %q, the settlement reaches %q: send the reservation's attributes (or did the policy change?)", ErrBadRequest, id, rec.Keys, keys)
	}
	diff := p.Cost - rec.Estimate
	switch {
	case diff > 0:
		extra := p
		extra.Cost = diff
		sv, err := e.Settle(ctx, extra)
		if err != nil {
			return Verdict{}, e.keepAgain(ctx, p.Domain, id, v, err)
		}
		return sv, nil
	case diff < 0:
		if err := e.refund(ctx, p, -diff, rec.Charged); err != nil {
			err = fmt.Errorf("engine: %w: give back %d units of reservation %q: %w", ErrSettleFailed, -diff, id, err)
			return Verdict{}, e.keepAgain(ctx, p.Domain, id, v, err)
		}
	}
	// Settled at the estimate or below: nothing more is charged.
	return e.Peek(ctx, p)
}

// keepAgain puts back the record of reservation id, taken by a settlement that then
// failed with cause, so that the settlement sent again finds it (the reservation
// waits DefaultReservationTTL more). It returns cause, saying whether the
// reservation is kept.
func (e *Engine) keepAgain(ctx context.Context, domain, id, record string, cause error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if kept, err := e.reservations.PutReservation(rctx, reservationKey(domain, id), record, DefaultReservationTTL); err != nil || !kept {
		return fmt.Errorf("%w (reservation %q lost: its estimate stands)", cause, id)
	}
	return fmt.Errorf("%w (reservation %q kept: send the settlement again)", cause, id)
}
