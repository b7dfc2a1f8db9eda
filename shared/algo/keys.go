package algo

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash/fnv"
	"strings"
)

// MaxEscaped is the longest escaped identity value kept as it is; longer values are
// replaced by a hash of the raw value.
const MaxEscaped = 128

// Escape encodes an identity value (an API key, an address, a path) for use in a key.
// The result holds only [A-Za-z0-9._-@/], and '%' introducing two hex digits, so it can
// never contain a hash-tag brace or the ':' separator; the encoding is injective, so
// two different values never share a key. The empty value becomes "%" (no escape
// produces a lone '%'). A value whose escaped form is longer than MaxEscaped becomes
// "~" followed by the hex SHA-256 of the raw value ('~' is always escaped otherwise).
func Escape(v string) string {
	if v == "" {
		return "%"
	}
	n := 0
	for i := 0; i < len(v); i++ {
		if plain(v[i]) {
			n++
		} else {
			n += 3
		}
	}
	if n > MaxEscaped {
		return HashValue(v)
	}
	if n == len(v) {
		return v
	}
	var b strings.Builder
	b.Grow(n)
	const hexdigits = "0123456789ABCDEF"
	for i := 0; i < len(v); i++ {
		c := v[i]
		if plain(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('%')
			b.WriteByte(hexdigits[c>>4])
			b.WriteByte(hexdigits[c&15])
		}
	}
	return b.String()
}

// HashValue returns "~" and the hex SHA-256 of v: the form Escape gives long values,
// and the form secrets (bearer tokens) always take, so they never reach Redis or logs.
func HashValue(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "~" + hex.EncodeToString(sum[:])
}

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '.' || c == '_' || c == '-' || c == '@' || c == '/'
}

// Key returns the Redis key of one meter of a rule for one client:
//
//	<prefix>{<tag>}<rule>:<identity>:<meter>
//
// tag and identity must come from Escape (identity may join several escaped values
// with ':'); rule must be a policy rule name, and meter names the meter within the
// rule (policy uses MeterID). Every key with the same tag hashes to the same Redis
// Cluster slot, whatever the rule and identity, so the limits of one client can be
// decided in one script.
func Key(prefix, tag, rule, identity, meter string) string {
	return prefix + "{" + tag + "}" + rule + ":" + identity + ":" + meter
}

// MeterID names meter i of a rule in its keys: i, '.', and 8 hex digits of a hash of
// what the meter's state means: each limit's algorithm, period, bucket and calendar,
// and for gcra and leaky_bucket the count. A meter whose algorithm or period changes
// gets new keys, so that a policy reload never reads one algorithm's state as
// another's, or a window of one length as one of another; one whose burst changes, or
// whose count changes where the state counts units (every algorithm but gcra and
// leaky_bucket), keeps its keys and its state. i tells apart meters of one rule whose
// state means the same (policy passes the meter's place among them, so
// that adding a limit of another kind to a rule moves no key).
func MeterID(i int, m Meter) string {
	h := fnv.New32a()
	for _, l := range m.Limits {
		fmt.Fprintf(h, "%s/%d/%d;", l.Algorithm, l.Period, l.Bucket)
		if !countCarries(l.Algorithm) {
			fmt.Fprintf(h, "n%d;", l.Count)
		}
		if c := l.Calendar; c.Unit != "" {
			zone := "UTC"
			if c.Zone != nil {
				zone = c.Zone.String()
			}
			fmt.Fprintf(h, "%s@%s;", c.Unit, zone)
		}
	}
	return fmt.Sprintf("%d.%08x", i, h.Sum32())
}

// countCarries reports whether the state of algorithm a means the same under another
// count: a window's or a log's units, a token_bucket's tokens and a bucket_ring's
// buckets do; a gcra's or leaky_bucket's theoretical arrival time does not, since it
// counts units in emission intervals (period / count), so a new count would revalue
// every unit already charged.
func countCarries(a Algorithm) bool { return a != GCRA && a != LeakyBucket }

// HashTag returns the part of key that Redis Cluster hashes: the text between the
// first '{' and the next '}' when it is not empty, else the whole key.
func HashTag(key string) string {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return key
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return key
	}
	return key[i+1 : i+1+j]
}

// Slot returns the Redis Cluster hash slot of key (CRC16 of its hash tag, mod 16384).
func Slot(key string) int {
	return int(crc16(HashTag(key)) % 16384)
}

// crc16 is CRC-16/XMODEM, the checksum Redis Cluster uses for key slots.
func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
