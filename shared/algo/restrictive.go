package algo

// MoreRestrictive reports whether decision a should be reported rather than b when a
// request passed several limits: a denial over an admission; between denials the one
// that frees up later; between admissions the one with fewer units remaining, then
// the one that resets later. A tie keeps b, so that the first of equals is reported.
// The engine and the Envoy filter's local limits both choose with it.
func MoreRestrictive(a, b Decision) bool {
	switch {
	case a.Allowed != b.Allowed:
		return !a.Allowed
	case !a.Allowed:
		return a.RetryAfter > b.RetryAfter
	case a.Remaining != b.Remaining:
		return a.Remaining < b.Remaining
	}
	return a.ResetAfter > b.ResetAfter
}

// MostRestrictive returns the index of the most restrictive of n decisions
// (MoreRestrictive), among those for which at reports ok, or -1 when at reports none.
// It is the one fold every front door's answer comes from: the engine's verdict, each
// gRPC descriptor's status and the Envoy filter's local limits.
func MostRestrictive(n int, at func(i int) (d Decision, ok bool)) int {
	best := -1
	var bestD Decision
	for i := range n {
		d, ok := at(i)
		if ok && (best < 0 || MoreRestrictive(d, bestD)) {
			best, bestD = i, d
		}
	}
	return best
}
