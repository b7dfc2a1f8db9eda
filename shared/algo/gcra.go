package algo

import "math"

// gcra is the generic cell rate algorithm: one theoretical arrival time (TAT) per key.
// Each cost unit moves the TAT by the emission interval T = Period/Count; a request is
// admitted while the new TAT is at most Capacity*T ahead of now. State: Time (the TAT,
// µs). In Redis: one string, an integer whenever the TAT is whole.
//
// With shape set it is leaky_bucket, a shaper rather than a meter: the same
// admission test, where Capacity is the queue size, and an admitted request is held
// for Delay = TAT - now so that requests leave at the steady rate.
func gcra(l Limit, s State, now, cost int64, shape bool) (State, Decision) {
	t := float64(micros(l.Period)) / float64(l.Count)
	b := float64(l.Capacity())
	fnow := float64(now)
	tat := fnow
	if s.Set {
		tat = math.Max(s.Time, fnow)
	}
	newTat := tat + float64(cost)*t
	burst := b * t
	d := Decision{Limit: l.Count, Period: l.Period}
	if newTat-fnow > burst {
		d.Remaining = max(0, int64(math.Floor((burst-(tat-fnow))/t)))
		if cost > l.Capacity() {
			d.RetryAfter = l.Period
		} else {
			d.RetryAfter = ceilUs(newTat - fnow - burst)
		}
		d.ResetAfter = ceilUs(tat - fnow)
		return s, d
	}
	d.Allowed = true
	d.Remaining = int64(math.Floor((burst - (newTat - fnow)) / t))
	d.ResetAfter = ceilUs(newTat - fnow)
	if shape {
		d.Delay = ceilUs(tat - fnow)
	}
	ns := State{Set: true, Time: newTat, Expires: int64(math.Ceil(newTat))}
	if newTat <= fnow {
		// cost 0 on an idle key: nothing to keep.
		return State{}, d
	}
	return ns, d
}
