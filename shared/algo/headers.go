package algo

import (
	"strconv"
	"strings"
	"time"
)

// Seconds rounds d up to whole seconds, as the rate-limit headers count time.
func Seconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// RetryAfterSeconds is the Retry-After value for a denial: d in whole seconds, rounded
// up, and at least 1.
func RetryAfterSeconds(d time.Duration) int64 {
	return max(1, Seconds(d))
}

// A Quota is one limit of a request with its decision, as the RateLimit headers
// state it.
type Quota struct {
	// Name names the quota policy, unique among a request's quotas.
	Name     string
	Limit    Limit
	Decision Decision
}

// QuotaWindow returns the quota q and window w that the headers state for l, so that
// a decision's remaining units never exceed q: the count per period, or, for an
// algorithm with a burst (token_bucket, gcra, leaky_bucket), the burst over the time
// the rate takes to refill it (100/s with a burst of 200: q=200 over 2s). A burst
// the rate refills in less than a second is stated as the rate per second, which is
// larger (100/s with a burst of 10: q=100 over 1s), since w counts whole seconds.
func QuotaWindow(l Limit) (q int64, w time.Duration) {
	q = l.Capacity()
	if q == l.Count || l.Count <= 0 {
		return q, l.Period
	}
	w = time.Duration(float64(l.Period) * float64(q) / float64(l.Count))
	if w < time.Second {
		return int64(float64(l.Count) * float64(time.Second) / float64(l.Period)), time.Second
	}
	return q, w
}

// PolicyItem formats one quota policy of the RateLimit-Policy header
// (draft-ietf-httpapi-ratelimit-headers-10): "name";q=QUOTA;w=SECONDS.
func PolicyItem(qt Quota) string {
	q, w := QuotaWindow(qt.Limit)
	return sfString(qt.Name) + ";q=" + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(max(1, Seconds(w)), 10)
}

// LimitItem formats one service limit of the RateLimit header:
// "name";r=REMAINING;t=SECONDS, t being the time until the quota is whole again.
func LimitItem(qt Quota) string {
	return sfString(qt.Name) + ";r=" + strconv.FormatInt(max(0, qt.Decision.Remaining), 10) + ";t=" + strconv.FormatInt(Seconds(qt.Decision.ResetAfter), 10)
}

// OneQuotaNames names the three headers that describe the deciding quota alone: its
// limit, what remains of it and the seconds until it is whole again. An empty name
// leaves its header out.
type OneQuotaNames struct{ Limit, Remaining, Reset string }

// XRateLimit names the one-quota headers of the HTTP API and the authorizer.
var XRateLimit = OneQuotaNames{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}

// Headers returns the rate-limit response headers of a request's quotas:
// RateLimit-Policy and RateLimit list every quota in order; X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset describe qs[deciding], the most
// restrictive, and Retry-After is added when its decision denies. No quotas, no
// headers.
func Headers(qs []Quota, deciding int) [][2]string {
	return HeadersNamed(qs, deciding, XRateLimit)
}

// HeadersNamed is Headers with the one-quota headers named by names.
func HeadersNamed(qs []Quota, deciding int, names OneQuotaNames) [][2]string {
	if len(qs) == 0 {
		return nil
	}
	policies := make([]string, len(qs))
	limits := make([]string, len(qs))
	for i, qt := range qs {
		policies[i], limits[i] = PolicyItem(qt), LimitItem(qt)
	}
	d := qs[deciding]
	q, _ := QuotaWindow(d.Limit)
	h := [][2]string{
		{"RateLimit-Policy", strings.Join(policies, ", ")},
		{"RateLimit", strings.Join(limits, ", ")},
	}
	for _, f := range []struct {
		name  string
		value int64
	}{{names.Limit, q}, {names.Remaining, max(0, d.Decision.Remaining)}, {names.Reset, Seconds(d.Decision.ResetAfter)}} {
		if f.name != "" {
			h = append(h, [2]string{f.name, strconv.FormatInt(f.value, 10)})
		}
	}
	if !d.Decision.Allowed {
		h = append(h, [2]string{"Retry-After", strconv.FormatInt(RetryAfterSeconds(d.Decision.RetryAfter), 10)})
	}
	return h
}

// sfString formats s as a structured-field string (RFC 9651): quoted, with '"' and
// '\' escaped; bytes outside printable ASCII become '?'.
func sfString(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e:
			b.WriteByte('?')
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
