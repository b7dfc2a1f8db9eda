package algo

// slidingLog keeps one log entry per admitted cost unit and admits while fewer than
// Count entries are younger than Period: an entry admitted at t counts while
// t > now - P. Exact. State: Log. In Redis: a sorted set scored by admission time
// (microseconds) whose members are unique ("time:sequence[:record]").
func slidingLog(l Limit, s State, now, cost int64, record string) (State, Decision) {
	p, n := micros(l.Period), l.Count
	var used, newest int64
	first := -1
	for i, e := range s.Log {
		if e.At > now-p {
			if first < 0 {
				first = i
			}
			used++
			newest = max(newest, e.At)
		}
	}
	d := Decision{Limit: n, Period: l.Period}
	if used > 0 {
		d.ResetAfter = us(newest + p - now)
	}
	if used+cost > n {
		d.Remaining = max(0, n-used)
		if cost > n {
			d.RetryAfter = l.Period
		} else {
			// The (used+cost-n)-th oldest live entry must leave first.
			k := used + cost - n
			for _, e := range s.Log[first:] {
				if e.At > now-p {
					k--
					if k == 0 {
						d.RetryAfter = us(e.At + p - now)
						break
					}
				}
			}
		}
		return s, d
	}
	d.Allowed = true
	d.Remaining = n - used - cost
	ns := State{Set: true, Log: make([]LogEntry, 0, used+cost)}
	for _, e := range s.Log {
		if e.At > now-p {
			ns.Log = append(ns.Log, e)
		}
	}
	if cost > 0 {
		newest = max(newest, now)
		for range cost {
			ns.Log = insertLog(ns.Log, LogEntry{At: now, Value: record})
		}
		d.ResetAfter = us(newest + p - now)
	}
	if len(ns.Log) == 0 {
		return State{}, d
	}
	ns.ExpiresMicros = newest + p
	return ns, d
}

// insertLog adds e after every entry not younger than it, keeping the log sorted by time.
func insertLog(log []LogEntry, e LogEntry) []LogEntry {
	i := len(log)
	for i > 0 && log[i-1].At > e.At {
		i--
	}
	log = append(log, LogEntry{})
	copy(log[i+1:], log[i:])
	log[i] = e
	return log
}
