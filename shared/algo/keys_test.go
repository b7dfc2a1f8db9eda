package algo_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

func TestEscape(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", algo.MaxEscaped+1)
	tests := []struct {
		in, want string
	}{
		{"", "%"},
		{"alice", "alice"},
		{"alice@example.com", "alice@example.com"},
		{"203.0.113.7", "203.0.113.7"},
		{"/v1/users/_me-2", "/v1/users/_me-2"},
		{"2001:db8::1", "2001%3Adb8%3A%3A1"},
		{"a:b", "a%3Ab"},
		{"{tag}", "%7Btag%7D"},
		{"%", "%25"},
		{"%25", "%2525"},
		{"~", "%7E"},
		{"a b", "a%20b"},
		{"line\nbreak", "line%0Abreak"},
		{"\x00", "%00"},
		{"é", "%C3%A9"},
		{"\xff\xfe", "%FF%FE"},
		{"Bearer x+y=", "Bearer%20x%2By%3D"},
		// MaxEscaped characters are kept; one more and the value is hashed.
		{strings.Repeat("a", algo.MaxEscaped), strings.Repeat("a", algo.MaxEscaped)},
		{long, algo.HashValue(long)},
		{strings.Repeat(":", 42), strings.Repeat("%3A", 42)},
		{strings.Repeat(":", 43), algo.HashValue(strings.Repeat(":", 43))},
		{strings.Repeat(":", 42) + "ab", strings.Repeat("%3A", 42) + "ab"},
		{strings.Repeat(":", 42) + "abc", algo.HashValue(strings.Repeat(":", 42) + "abc")},
	}
	for _, tt := range tests {
		if got := algo.Escape(tt.in); got != tt.want {
			t.Errorf("Escape(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestHashValue(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in, want string
	}{
		// SHA-256 test vectors (FIPS 180-2).
		{"", "~e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
		{"abc", "~ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
	}
	for _, tt := range tests {
		if got := algo.HashValue(tt.in); got != tt.want {
			t.Errorf("HashValue(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// checkEscaped reports what is wrong with e as the escape of a value, or "".
func checkEscaped(e string) string {
	if strings.ContainsAny(e, "{}:") {
		return "holds a brace or a colon"
	}
	if e == "" {
		return "is empty"
	}
	if strings.HasPrefix(e, "~") {
		if len(e) != 65 || strings.Trim(e[1:], "0123456789abcdef") != "" {
			return "is not ~ and 64 hex digits"
		}
		return ""
	}
	if len(e) > algo.MaxEscaped {
		return "is longer than MaxEscaped"
	}
	for i := 0; i < len(e); i++ {
		c := e[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte("._-@/", c) >= 0:
		case c == '%' && e == "%":
		case c == '%' && i+2 < len(e) && strings.IndexByte("0123456789ABCDEF", e[i+1]) >= 0 && strings.IndexByte("0123456789ABCDEF", e[i+2]) >= 0:
			i += 2
		default:
			return "holds " + string(c) + " outside [A-Za-z0-9._-@/] and %XX"
		}
	}
	return ""
}

// unescape decodes an escape that is not a hash; Escape is injective because unescape
// undoes it.
func unescape(e string) string {
	if e == "%" {
		return ""
	}
	var b strings.Builder
	for i := 0; i < len(e); i++ {
		if e[i] != '%' {
			b.WriteByte(e[i])
			continue
		}
		var c byte
		for _, h := range e[i+1 : i+3] {
			c = c<<4 | byte(strings.IndexRune("0123456789ABCDEF", h))
		}
		b.WriteByte(c)
		i += 2
	}
	return b.String()
}

func TestEscapeInjective(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", algo.MaxEscaped+1)
	tests := []struct {
		a, b string
	}{
		{"", "%"},
		{"%", "%25"},
		{"%25", "%2525"},
		{"a:b", "a%3Ab"},
		{":", "%3A"},
		{"~", "%7E"},
		{"A", "a"},
		{"\x00", ""},
		{"\x00", "%00"},
		{"{", "}"},
		{"a b", "a+b"},
		{"a/b", "a%2Fb"},
		{"é", "%C3%A9"},
		{"\xc3", "\xc3\xa9"},
		// A hash never equals the escape of a short value, nor of the hash itself.
		{long, algo.HashValue(long)},
		{long, long + "x"},
		{long, strings.Repeat("x", algo.MaxEscaped)},
		{strings.Repeat(":", 42), strings.Repeat(":", 43)},
		{strings.Repeat("%", 42), strings.Repeat("%25", 42)},
	}
	for _, tt := range tests {
		ea, eb := algo.Escape(tt.a), algo.Escape(tt.b)
		if ea == eb {
			t.Errorf("Escape(%q) = Escape(%q) = %q, want different escapes", tt.a, tt.b, ea)
		}
		for _, p := range [][2]string{{tt.a, ea}, {tt.b, eb}} {
			if msg := checkEscaped(p[1]); msg != "" {
				t.Errorf("Escape(%q) = %q, which %s", p[0], p[1], msg)
			}
			if !strings.HasPrefix(p[1], "~") && unescape(p[1]) != p[0] {
				t.Errorf("unescape(Escape(%q)) = %q, want %q", p[0], unescape(p[1]), p[0])
			}
		}
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		prefix, tag, rule, identity string
		idx                         int
		want                        string
	}{
		{"tg:", "203.0.113.7", "login", "alice", 0, "tg:{203.0.113.7}login:alice:0"},
		{"", "%", "r", "", 12, "{%}r::12"},
		{"tg:", "k1", "api", "k1:GET:%2Fv1", 3, "tg:{k1}api:k1:GET:%2Fv1:3"},
	}
	for _, tt := range tests {
		if got := algo.Key(tt.prefix, tt.tag, tt.rule, tt.identity, strconv.Itoa(tt.idx)); got != tt.want {
			t.Errorf("Key(%q, %q, %q, %q, %d) = %q, want %q", tt.prefix, tt.tag, tt.rule, tt.identity, tt.idx, got, tt.want)
		}
	}
}

// TestKeyHostileIdentities builds keys from identities chosen to break the key syntax:
// the hash tag is always the escaped identity, so every key of one identity is in one
// cluster slot.
func TestKeyHostileIdentities(t *testing.T) {
	t.Parallel()
	hostile := []string{
		"", "{", "}", "{}", "}{", "{a}", ":", "::", "a:b", "{tag}:0", "\n", "line\r\nbreak",
		"%", "%7B", "~", "\x00", "\xff\xfe\xfd", "\xc3", "é", "日本", " ",
		strings.Repeat("{", 10240), strings.Repeat("a", 10240), strings.Repeat("}:", 5120),
	}
	for _, id := range hostile {
		tag := algo.Escape(id)
		keys := []string{
			algo.Key("tg:", tag, "login", tag, "0"),
			algo.Key("tg:", tag, "api{x}", tag+":"+algo.Escape("{GET}"), "7"),
			algo.Key("other:", tag, "", "", "123"),
		}
		for _, k := range keys {
			if got := algo.HashTag(k); got != tag {
				t.Errorf("HashTag(%.60q) = %.60q, want %.60q", k, got, tag)
			}
			if got, want := algo.Slot(k), algo.Slot(tag); got != want {
				t.Errorf("Slot(%.60q) = %d, want %d (the slot of the tag)", k, got, want)
			}
		}
	}
}

func TestHashTag(t *testing.T) {
	t.Parallel()
	// The rules of the Redis Cluster specification, "Hash tags".
	tests := []struct {
		key, want string
	}{
		{"foo", "foo"},
		{"{user1000}.following", "user1000"},
		{"{user1000}.followers", "user1000"},
		{"foo{}{bar}", "foo{}{bar}"},
		{"foo{{bar}}zap", "{bar"},
		{"foo{bar}{zap}", "bar"},
		{"{}", "{}"},
		{"a{b", "a{b"},
		{"a}b{c}", "c"},
		{"", ""},
	}
	for _, tt := range tests {
		if got := algo.HashTag(tt.key); got != tt.want {
			t.Errorf("HashTag(%q) = %q, want %q", tt.key, got, tt.want)
		}
	}
}

func TestSlot(t *testing.T) {
	t.Parallel()
	// The answers of CLUSTER KEYSLOT (redis-server 7.0.15, cluster-enabled).
	tests := []struct {
		key  string
		want int
	}{
		{"foo", 12182},
		{"123456789", 12739}, // CRC-16/XMODEM check value 0x31C3
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"somekey", 11058},
		{"foo{hash_tag}", 2515},
		{"foo{}{bar}", 8363},
		{"foo{{bar}}zap", 4015},
		{"foo{bar}{zap}", 5061},
		{"{}", 15257},
		{"a{b", 13340},
		{"", 0},
	}
	for _, tt := range tests {
		if got := algo.Slot(tt.key); got != tt.want {
			t.Errorf("Slot(%q) = %d, want %d", tt.key, got, tt.want)
		}
	}
}

// TestMeterID checks that a meter's name in keys keeps its place and changes with
// each parameter that changes what its state means (algorithm, period, bucket; for
// gcra and leaky_bucket the count), so that a reloaded policy starts those limits
// afresh, and stays when only a count or a burst changes, so that their state
// carries over. The value is pinned: changing the hash would orphan every key in
// production.
func TestMeterID(t *testing.T) {
	t.Parallel()
	base := algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Period: time.Second, Burst: 20}
	m := func(ls ...algo.Limit) algo.Meter { return algo.Meter{Limits: ls} }
	if got, want := algo.MeterID(0, m(base)), "0.54d3c8b9"; got != want {
		t.Errorf("MeterID(0, %v) = %s, want %s", base, got, want)
	}
	if a, b := algo.MeterID(3, m(base)), algo.MeterID(3, m(base)); a != b || !strings.HasPrefix(a, "3.") {
		t.Errorf("MeterID(3, …) = %s then %s, want one stable value starting 3.", a, b)
	}
	seen := map[string]string{algo.MeterID(0, m(base)): "base"}
	for name, l := range map[string]algo.Limit{
		"algorithm":  {Algorithm: algo.GCRA, Count: 10, Period: time.Second, Burst: 20},
		"period":     {Algorithm: algo.TokenBucket, Count: 10, Period: time.Minute, Burst: 20},
		"bucket":     {Algorithm: algo.TokenBucket, Count: 10, Period: time.Second, Burst: 20, Bucket: time.Millisecond},
		"gcra count": {Algorithm: algo.GCRA, Count: 11, Period: time.Second, Burst: 20},
		"calendar":   algo.NewCalendarLimit(10, algo.CalendarMonth, nil),
	} {
		id := algo.MeterID(0, m(l))
		if other, dup := seen[id]; dup {
			t.Errorf("changing the %s gives MeterID %s, the same as %s", name, id, other)
		}
		seen[id] = name
	}
	for _, tt := range []struct{ from, to algo.Limit }{
		{base, algo.Limit{Algorithm: algo.TokenBucket, Count: 11, Period: time.Second, Burst: 20}},
		{base, algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Period: time.Second, Burst: 5}},
		{algo.Limit{Algorithm: algo.FixedWindow, Count: 2, Period: time.Minute}, algo.Limit{Algorithm: algo.FixedWindow, Count: 5, Period: time.Minute}},
		{algo.NewCalendarLimit(10000, algo.CalendarMonth, nil), algo.NewCalendarLimit(12000, algo.CalendarMonth, nil)},
		{algo.Limit{Algorithm: algo.SlidingLog, Count: 2, Period: time.Minute}, algo.Limit{Algorithm: algo.SlidingLog, Count: 1, Period: time.Minute}},
		{algo.Limit{Algorithm: algo.SlidingWindow, Count: 2, Period: time.Minute}, algo.Limit{Algorithm: algo.SlidingWindow, Count: 9, Period: time.Minute}},
		{algo.Limit{Algorithm: algo.GCRA, Count: 10, Period: time.Second, Burst: 20}, algo.Limit{Algorithm: algo.GCRA, Count: 10, Period: time.Second, Burst: 50}},
		{algo.Limit{Algorithm: algo.LeakyBucket, Count: 10, Period: time.Second}, algo.Limit{Algorithm: algo.LeakyBucket, Count: 10, Period: time.Second, Burst: 3}},
	} {
		if a, b := algo.MeterID(0, m(tt.from)), algo.MeterID(0, m(tt.to)); a != b {
			t.Errorf("MeterID(0, %v) = %s, MeterID(0, %v) = %s, want one name: the state carries over", tt.from, a, tt.to, b)
		}
	}
	ring := algo.Limit{Algorithm: algo.BucketRing, Count: 10, Period: time.Second, Bucket: 100 * time.Millisecond}
	wide := ring
	wide.Period, wide.Count = 10*time.Second, 50
	if algo.MeterID(0, m(ring)) == algo.MeterID(0, m(ring, wide)) {
		t.Error("adding a window to a ring keeps its MeterID, want a new one")
	}
}
