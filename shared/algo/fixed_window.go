package algo

// fixedWindow decides on a counter per window aligned to the Unix epoch: window
// w = floor(now/P) admits Count units. State: Window (w), Count (units admitted in w),
// Records (recorded values of w). In Redis: one integer string per window, named
// KEY:w, written with INCRBY and PEXPIRE in one script, plus KEY:w:r (a hash of
// recorded value -> units) when the meter records.
func fixedWindow(l Limit, s State, now, cost int64, record string) (State, Decision) {
	p, n := micros(l.Period), l.Count
	w := floorDiv(now, p)
	var used int64
	if s.Set && s.Window == w {
		used = s.Count
	}
	end := (w + 1) * p
	d := Decision{Limit: n, Period: l.Period, ResetAfter: us(end - now)}
	if used+cost > n {
		d.Remaining = max(0, n-used)
		d.RetryAfter = us(end - now)
		if cost > n {
			d.RetryAfter = l.Period
		}
		if used == 0 {
			d.ResetAfter = 0
		}
		return s, d
	}
	d.Allowed = true
	d.Remaining = n - used - cost
	if used+cost == 0 {
		d.ResetAfter = 0
	}
	ns := State{Set: true, Window: w, Count: used + cost, Expires: end}
	if record != "" {
		ns.Records = make(map[string]int64, len(s.Records)+1)
		if s.Set && s.Window == w {
			for k, v := range s.Records {
				ns.Records[k] = v
			}
		}
		ns.Records[record] += cost
	}
	return ns, d
}
