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
	// Every value is formatted into one buffer and sliced from one string: two
	// allocations per decision instead of nine.
	var buf [192]byte
	var cut [6]int
	b := appendSF(buf[:0], name)
	b = append(b, ";q="...)
	b = strconv.AppendInt(b, d.Limit, 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, max(1, Seconds(d.Period)), 10)
	cut[0] = len(b)
	b = appendSF(b, name)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, max(0, d.Remaining), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, Seconds(d.ResetAfter), 10)
	cut[1] = len(b)
	b = strconv.AppendInt(b, d.Limit, 10)
	cut[2] = len(b)
	b = strconv.AppendInt(b, max(0, d.Remaining), 10)
	cut[3] = len(b)
	b = strconv.AppendInt(b, Seconds(d.ResetAfter), 10)
	cut[4] = len(b)
	n := 5
	if !d.Allowed {
		b = strconv.AppendInt(b, RetryAfterSeconds(d.RetryAfter), 10)
		cut[5] = len(b)
		n = 6
	}
	s := string(b)
	h := make([][2]string, n)
	from := 0
	for i := range n {
		h[i] = [2]string{headerNames[i], s[from:cut[i]]}
		from = cut[i]
	}
	return h
}

var headerNames = [6]string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"}

// appendSF appends s as a structured-field string, as sfString formats it.
func appendSF(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
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
