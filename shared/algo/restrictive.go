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
