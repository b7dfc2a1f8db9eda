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

// PolicyItem formats one quota policy of the RateLimit-Policy header
// (draft-ietf-httpapi-ratelimit-headers-10): "name";q=COUNT;w=SECONDS.
func PolicyItem(name string, d Decision) string {
	return sfString(name) + ";q=" + strconv.FormatInt(d.Limit, 10) + ";w=" + strconv.FormatInt(max(1, Seconds(d.Period)), 10)
}

// LimitItem formats one item of the RateLimit header: "name";r=REMAINING;t=SECONDS,
// t being the time until the quota resets.
func LimitItem(name string, d Decision) string {
	return sfString(name) + ";r=" + strconv.FormatInt(max(0, d.Remaining), 10) + ";t=" + strconv.FormatInt(Seconds(d.ResetAfter), 10)
}

// Headers returns the rate-limit response headers for a decision of the named policy:
// RateLimit-Policy, RateLimit, X-RateLimit-Limit, X-RateLimit-Remaining,
// X-RateLimit-Reset, and Retry-After when the decision denies.
func Headers(name string, d Decision) [][2]string {
	h := [][2]string{
		{"RateLimit-Policy", PolicyItem(name, d)},
		{"RateLimit", LimitItem(name, d)},
		{"X-RateLimit-Limit", strconv.FormatInt(d.Limit, 10)},
		{"X-RateLimit-Remaining", strconv.FormatInt(max(0, d.Remaining), 10)},
		{"X-RateLimit-Reset", strconv.FormatInt(Seconds(d.ResetAfter), 10)},
	}
	if !d.Allowed {
		h = append(h, [2]string{"Retry-After", strconv.FormatInt(RetryAfterSeconds(d.RetryAfter), 10)})
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
