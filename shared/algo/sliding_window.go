package algo

import (
	"math"
	"time"
)

// slidingWindow estimates the units of the last Period from two aligned window
// counters: estimate = prev*(P-elapsed)/P + cur, where elapsed is the time since the
// current window began. It admits while estimate + cost <= Count. O(1) memory; the
// estimate assumes the previous window's units were spread evenly. State: Window,
// Count (cur), Prev. In Redis: one hash {w, c, p}.
func slidingWindow(l Limit, s State, now, cost int64, force bool) (State, Decision) {
	p := micros(l.Period)
	w := floorDiv(now, p)
	var shift int64
	if s.Set && s.Window > w {
		// The caller's clock is behind the stored window: decide at its start, so a
		// newer window is never overwritten by an older one, and count the times
		// from the caller's now.
		w = s.Window
		shift = w*p - now
		now = w * p
	}
	ns, d := slidingWindowAt(l, s, w, now, cost, force)
	if d.RetryAfter > 0 && cost <= l.Count {
		d.RetryAfter += us(shift)
	}
	if d.ResetAfter > 0 {
		d.ResetAfter += us(shift)
	}
	return ns, d
}

// slidingWindowAt decides at now, in window w.
func slidingWindowAt(l Limit, s State, w, now, cost int64, force bool) (State, Decision) {
	p, n := micros(l.Period), l.Count
	e := now - w*p
	var cur, prev int64
	if s.Set {
		switch s.Window {
		case w:
			cur, prev = s.Count, s.Prev
		case w - 1:
			prev = s.Count
		}
	}
	est := float64(prev)*float64(p-e)/float64(p) + float64(cur)
	d := Decision{Limit: n, Period: l.Period}
	if est+float64(cost) > float64(n) {
		d.Remaining = max(0, int64(math.Floor(float64(n)-est)))
		switch {
		case cost > n:
			d.RetryAfter = l.Period
		case cur+cost <= n:
			// Wait in this window until the previous window's weight has decayed enough.
			t := math.Ceil(float64(p) - float64(n-cur-cost)*float64(p)/float64(prev))
			d.RetryAfter = us(max(1, int64(t)-e))
		default:
			// Wait for the next window, where this window's count is the previous one.
			t := int64(0)
			if cur > 0 {
				t = max(0, int64(math.Ceil(float64(p)-float64(n-cost)*float64(p)/float64(cur))))
			}
			d.RetryAfter = us((w+1)*p - now + t)
		}
		d.ResetAfter = slidingWindowReset(w, p, now, cur, prev)
		if !force {
			return s, d
		}
	}
	d.Allowed = true
	d.Remaining = int64(math.Floor(float64(n) - est - float64(cost)))
	d.ResetAfter = slidingWindowReset(w, p, now, cur+cost, prev)
	ns := State{Set: true, Window: w, Count: cur + cost, Prev: prev, ExpiresMicros: (w + 2) * p}
	return ns, d
}

// slidingWindowReset is the time until both counters stop weighing on the estimate.
func slidingWindowReset(w, p, now, cur, prev int64) time.Duration {
	switch {
	case cur > 0:
		return us((w+2)*p - now)
	case prev > 0:
		return us((w+1)*p - now)
	}
	return 0
}
