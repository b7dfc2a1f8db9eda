package decision

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
)

// hostile are string pieces that encoding/json escapes or replaces, mixed with plain
// ones.
var hostile = []string{
	"", "a", "public-api", " ", "/", "'", "\"", "\\", "\\\"", "\x00", "\x01", "\b", "\f",
	"\n", "\r", "\t", "\x0b", "\x1f", "\x7f", "<", ">", "&", "</script>", "\u2028", "\u2029",
	"\u2027", "\u202a", "é", "日本", "\U0001F600", "\ufffd", "\xff", "\xfe\xff", "\xc3",
	"\xe2\x80", "\xed\xa0\x80", "\xf4\x90\x80\x80", "\xc0\xaf", "\x80",
}

// randString joins up to 6 random pieces of hostile.
func randString(r *rand.Rand) string {
	var b strings.Builder
	for range r.IntN(7) {
		b.WriteString(hostile[r.IntN(len(hostile))])
	}
	return b.String()
}

// randInt returns an int64 near zero, near a bound or anywhere.
func randInt(r *rand.Rand) int64 {
	switch r.IntN(4) {
	case 0:
		return r.Int64N(2000) - 1000
	case 1:
		return []int64{0, -1, 1, math.MaxInt64, math.MinInt64, math.MaxInt64 - 1, math.MinInt64 + 1}[r.IntN(7)]
	case 2:
		return -r.Int64()
	}
	return r.Int64()
}

func randCheckResponse(r *rand.Rand) CheckResponse {
	cr := CheckResponse{
		Allowed: r.IntN(2) == 0, Domain: randString(r), Rule: randString(r), Reason: randString(r),
		Limit: randInt(r), Remaining: randInt(r), ResetAfterMs: randInt(r), RetryAfterMs: randInt(r),
		DelayMs: randInt(r), Degraded: r.IntN(2) == 0, Cached: r.IntN(2) == 0,
	}
	if n := r.IntN(5) - 1; n >= 0 { // nil a fifth of the time
		cr.Limits = make([]LimitJSON, n)
		for i := range cr.Limits {
			cr.Limits[i] = LimitJSON{
				Rule: randString(r), Algorithm: randString(r), Allowed: r.IntN(2) == 0, Shadow: r.IntN(2) == 0,
				Limit: randInt(r), WindowMs: randInt(r), Remaining: randInt(r), ResetAfterMs: randInt(r),
				RetryAfterMs: randInt(r), DelayMs: randInt(r),
			}
		}
	}
	return cr
}

// checkAppend fails t unless appendCheckResponse encodes cr as json.Marshal does.
func checkAppend(t *testing.T, cr CheckResponse) {
	t.Helper()
	want, err := json.Marshal(cr)
	if err != nil {
		t.Fatal(err)
	}
	prefix := []byte("prefix")
	got := appendCheckResponse(prefix, &cr)
	if string(got) != "prefix"+string(want) {
		t.Fatalf("appendCheckResponse(%#v) =\n%s\nwant prefix and json.Marshal's\n%s", cr, got, want)
	}
}

func TestAppendCheckResponseMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	checkAppend(t, CheckResponse{})
	checkAppend(t, CheckResponse{Limits: []LimitJSON{}})
	checkAppend(t, CheckResponse{Allowed: true, Domain: "api", Rule: "r", Reason: "over_limit", Cached: true, Limits: []LimitJSON{{}, {Rule: "<&>", Algorithm: "gcra"}}})
	for seed := range uint64(4) {
		r := rand.New(rand.NewPCG(seed, 0x7011))
		for range 2000 {
			checkAppend(t, randCheckResponse(r))
		}
	}
}

func FuzzAppendCheckResponse(f *testing.F) {
	f.Add("public-api", "per-key", "over_limit", "gcra", int64(100), int64(-5), uint8(0xff))
	f.Add("<script>&\u2028", "\"\\\n", "", "\xff\xc3", int64(math.MinInt64), int64(math.MaxInt64), uint8(0))
	f.Fuzz(func(t *testing.T, domain, rule, reason, algorithm string, n, m int64, flags uint8) {
		flag := func(i int) bool { return flags&(1<<i) != 0 }
		cr := CheckResponse{
			Allowed: flag(0), Domain: domain, Rule: rule, Reason: reason, Limit: n, Remaining: m,
			ResetAfterMs: n ^ m, RetryAfterMs: -n, DelayMs: m / 3, Degraded: flag(1), Cached: flag(2),
		}
		if !flag(3) {
			cr.Limits = []LimitJSON{}
			for i := range int(flags>>5) + 1 {
				cr.Limits = append(cr.Limits, LimitJSON{
					Rule: rule + reason[:min(i, len(reason))], Algorithm: algorithm, Allowed: flag(4), Shadow: flag(5),
					Limit: m, WindowMs: n, Remaining: int64(i), ResetAfterMs: -m, RetryAfterMs: n + m, DelayMs: n * m,
				})
			}
		}
		checkAppend(t, cr)
	})
}
