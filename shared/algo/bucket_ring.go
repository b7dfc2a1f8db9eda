package algo

// bucketRing counts admitted units in buckets of width W on a ring of
// len = longest period / W buckets, and answers every window of the meter (each a
// multiple of W) by summing its last period/W buckets. State: Window (the last bucket
// written, as an absolute bucket number), Buckets. In Redis: one hash with field "l"
// (the last bucket) and one field per bucket number modulo the ring's length; the
// buckets between the last write and now are cleared before the current one is
// incremented, so a stale lap is never counted.
func bucketRing(m Meter, s State, now, cost int64, force bool) (State, []Decision) {
	w := micros(m.RingBucket())
	size := int64(0)
	for _, l := range m.Limits {
		size = max(size, micros(l.Period)/w)
	}
	cur := floorDiv(now, w)
	last := s.Window
	set := s.Set && int64(len(s.Buckets)) == size
	if set && last > cur {
		cur = last // the clock went back: stay in the newest bucket written
	}
	// bucket returns the count of absolute bucket j, zero where the ring holds none.
	bucket := func(j int64) int64 {
		if !set || j > last || j <= last-size {
			return 0
		}
		return s.Buckets[mod(j, size)]
	}
	ds := make([]Decision, len(m.Limits))
	sums := make([]int64, len(m.Limits))
	allowed := true
	for i, l := range m.Limits {
		span := micros(l.Period) / w
		var sum int64
		for j := cur - span + 1; j <= cur; j++ {
			sum += bucket(j)
		}
		sums[i] = sum
		ds[i] = Decision{Limit: l.Count, Period: l.Period, Allowed: sum+cost <= l.Count}
		allowed = allowed && ds[i].Allowed
	}
	var ns State
	if allowed || force {
		ns = State{Set: true, Window: cur, Buckets: make([]int64, size), ExpiresMicros: (cur + size) * w}
		for j := max(cur-size+1, last-size+1); set && j <= last; j++ {
			ns.Buckets[mod(j, size)] = bucket(j)
		}
		ns.Buckets[mod(cur, size)] += cost
	}
	// newest returns the last absolute bucket with a count, or cur-size if none.
	newest := func(after bool) int64 {
		for j := cur; j > cur-size; j-- {
			c := bucket(j)
			if after && j == cur {
				c += cost
			}
			if c > 0 {
				return j
			}
		}
		return cur - size
	}
	for i, l := range m.Limits {
		span := micros(l.Period) / w
		d := &ds[i]
		if d.Allowed && allowed {
			d.Remaining = l.Count - sums[i] - cost
		} else {
			d.Remaining = max(0, l.Count-sums[i])
		}
		if jz := newest(allowed); jz > cur-span {
			d.ResetAfter = us((jz+span)*w - now)
		}
		if d.Allowed {
			continue
		}
		if cost > l.Count {
			d.RetryAfter = l.Period
			continue
		}
		sum := sums[i]
		for k := int64(1); k <= span; k++ {
			sum -= bucket(cur - span + k)
			if sum+cost <= l.Count {
				d.RetryAfter = us((cur+k)*w - now)
				break
			}
		}
	}
	if !allowed && !force {
		// Windows that would allow are still not charged: report them as allowed with
		// what they have, so a caller sees which window denied.
		return s, ds
	}
	return ns, ds
}

// mod is the non-negative remainder of a divided by b.
func mod(a, b int64) int64 {
	r := a % b
	if r < 0 {
		r += b
	}
	return r
}
