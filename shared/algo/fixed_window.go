package algo

import "strconv"

// fixedWindow decides on a counter per window aligned to the Unix epoch: window
// w = floor(now/P) admits Count units. State: Window (the newest window charged),
// Count (its units), Prev (the units of the window before it, for a caller whose
// clock runs a window behind), Records (recorded values of Window). In Redis: one
// integer string per window, named KEY:w, written with INCRBY and PEXPIRE in one
// script, plus KEY:w:r (a hash of recorded value -> units) when the meter records.
//
// A calendar window (Limit.In set WindowStartMicros and Period) is named by its start
// instead of its index, KEY:c<start>; a now outside it is taken to its start or to the
// window that follows it, of the same length, as the Lua script does.
func fixedWindow(l Limit, s State, now, cost int64, record string, force bool) (State, Decision) {
	if l.Calendar.Unit != "" && l.WindowStartMicros == 0 {
		l = l.In(now)
	}
	n, off := l.Count, l.WindowStartMicros
	w, end := fixedWindowAt(l, now)
	prev := w - 1
	if off != 0 {
		prev = -1 // the previous calendar window's start is not known here
	}
	var used int64
	if s.Set {
		switch w {
		case s.Window:
			used = s.Count
		case prev:
			used = s.Prev
		}
	}
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
		if !force {
			return s, d
		}
	}
	d.Allowed = true
	d.Remaining = n - used - cost
	if used+cost == 0 {
		d.ResetAfter = 0
	}
	if s.Set && w < s.Window {
		// A late request for an older window: charge it there, keep the newer one.
		ns := s
		ns.Records = copyRecords(s.Records)
		if w == prev {
			ns.Prev += cost
		}
		return ns, d
	}
	ns := State{Set: true, Window: w, Count: used + cost, ExpiresMicros: end}
	if s.Set && off == 0 && w == s.Window+1 {
		ns.Prev = s.Count
	}
	if record != "" {
		if s.Set && s.Window == w {
			ns.Records = copyRecords(s.Records)
		}
		if ns.Records == nil {
			ns.Records = make(map[string]int64, 1)
		}
		ns.Records[record] += cost
	}
	return ns, d
}

func copyRecords(r map[string]int64) map[string]int64 {
	if r == nil {
		return nil
	}
	c := make(map[string]int64, len(r)+1)
	for k, v := range r {
		c[k] = v
	}
	return c
}

// fixedWindowAt returns the window of the fixed_window limit l (a calendar limit set to
// its window, see Limit.In) that holds now: w names it (its index since the epoch, or
// a calendar window's start) and it ends at end (Unix µs).
func fixedWindowAt(l Limit, now int64) (w, end int64) {
	p, off := micros(l.Period), l.WindowStartMicros
	if off != 0 {
		w = off + max(0, floorDiv(now-off, p))*p
		return w, w + p
	}
	w = floorDiv(now, p)
	return w, (w + 1) * p
}

// WindowKey returns the key that counts the window of the fixed_window meter key at
// now (Unix µs), as the Lua library names it (key:<index>, or key:c<start> for a
// calendar window), and the window's end.
func (l Limit) WindowKey(key string, now int64) (name string, end int64) {
	l = l.In(now)
	w, end := fixedWindowAt(l, now)
	if l.WindowStartMicros != 0 {
		return key + ":c" + strconv.FormatInt(w, 10), end
	}
	return key + ":" + strconv.FormatInt(w, 10), end
}

// Counted is the decision of the fixed_window limit l whose window at now already held
// used units before cost more were counted into it: what the Go model (and the Lua
// library) decide from the same count. A store that counts with INCRBY decides with
// it.
func (l Limit) Counted(now, used, cost int64) Decision {
	l = l.In(now)
	w, _ := fixedWindowAt(l, now)
	_, d := fixedWindow(l, State{Set: true, Window: w, Count: used}, now, cost, "", false)
	return d
}
