package algo

import "math"

// tokenBucket holds up to Capacity tokens (Burst, or Count) and refills Count tokens
// per Period continuously; a request takes cost tokens or is denied. An absent key is
// a full bucket. State: Tokens, Time (last refill, µs). In Redis: one hash {t, s, e}, e the
// state's ExpiresMicros, so that the script, like a store of the model, reads a
// state past it as an absent key.
func tokenBucket(l Limit, s State, now, cost int64, force bool) (State, Decision) {
	p, n, b := float64(micros(l.Period)), float64(l.Count), float64(l.Capacity())
	tokens, last := b, float64(now)
	if s.Set {
		tokens, last = s.Tokens, s.Time
	}
	elapsed := math.Max(0, float64(now)-last)
	// A request timed before the last refill (a caller's clock behind) waits for
	// refills from that refill on: ahead is how far the refill is past now.
	ahead := math.Max(0, last-float64(now))
	avail := math.Min(b, tokens+elapsed*n/p)
	d := Decision{Limit: l.Count, Period: l.Period}
	if avail < float64(cost) {
		// A settlement's debt leaves fewer than no tokens: none remain.
		d.Remaining = max(0, int64(math.Floor(avail)))
		if cost > l.Capacity() {
			d.RetryAfter = l.Period
		} else {
			d.RetryAfter = ceilUs(ahead + (float64(cost)-avail)*p/n)
		}
		d.ResetAfter = ceilUs(ahead + (b-avail)*p/n)
		if !force {
			return s, d
		}
	}
	left := avail - float64(cost)
	d.Allowed = true
	d.Remaining = int64(math.Floor(left))
	d.ResetAfter = ceilUs(ahead + (b-left)*p/n)
	ns := State{Set: true, Tokens: left, Time: math.Max(float64(now), last)}
	ns.ExpiresMicros = now + max(micros(d.ResetAfter), 1)
	return ns, d
}
