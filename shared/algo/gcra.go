package algo

import (
	"math"
	"time"
)

// tatSlack is how far, in microseconds, a new TAT may pass the burst allowance and
// still be admitted. A TAT is an absolute float (Unix microseconds, about 2^50), held
// to a quarter microsecond; the slack absorbs that rounding so an emission interval
// that is not a whole number of microseconds cannot turn an exact fit into a denial.
const tatSlack = 1

// tatGrid is the rounding of an absolute TAT (a quarter microsecond at today's Unix
// time): times derived from a TAT are rounded up after taking it off, so an exact
// 500ms that the grid made 500.0000001ms reads 500ms.
const tatGrid = 0.25

// ceilTat rounds a time derived from a TAT up to whole microseconds, as ceilUs does,
// after taking off the TAT's rounding.
func ceilTat(x float64) time.Duration { return ceilUs(x - tatGrid) }

// gcra is the generic cell rate algorithm: one theoretical arrival time (TAT) per key.
// Each cost unit moves the TAT by the emission interval T = Period/Count; a request is
// admitted while the new TAT is at most Capacity*T ahead of now. State: Time (the TAT,
// µs). In Redis: one string, an integer whenever the TAT is whole. The arithmetic is
// done relative to now, where doubles are exact to far below a microsecond.
//
// With shape set it is leaky_bucket, a shaper rather than a meter: the same
// admission test, where Capacity is the queue size, and an admitted request is held
// for Delay = TAT - now so that requests leave at the steady rate.
func gcra(l Limit, s State, now, cost int64, shape, force bool) (State, Decision) {
	t := float64(micros(l.Period)) / float64(l.Count)
	b := float64(l.Capacity())
	fnow := float64(now)
	var rel float64 // TAT - now, never negative
	if s.Set {
		rel = math.Max(0, s.Time-fnow)
	}
	newRel := rel + float64(float64(cost)*t)
	burst := float64(b * t)
	d := Decision{Limit: l.Count, Period: l.Period}
	if newRel > burst+tatSlack {
		d.Remaining = max(0, int64(math.Floor((burst-rel+tatSlack)/t)))
		if cost > l.Capacity() {
			d.RetryAfter = l.Period
		} else {
			d.RetryAfter = ceilTat(newRel - burst)
		}
		d.ResetAfter = ceilTat(rel)
		if !force {
			return s, d
		}
	}
	d.Allowed = true
	d.Remaining = max(0, int64(math.Floor((burst-newRel+tatSlack)/t)))
	d.ResetAfter = ceilTat(newRel)
	if shape {
		d.Delay = ceilTat(rel)
	}
	if newRel <= 0 {
		// cost 0 on an idle key: nothing to keep.
		return State{}, d
	}
	newTat := fnow + newRel
	return State{Set: true, Time: newTat, ExpiresMicros: int64(math.Ceil(newTat))}, d
}
