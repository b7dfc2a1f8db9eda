package policy_test

import (
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

func mustParse(t testing.TB, in string) *policy.Policy {
	t.Helper()
	p, err := policy.Parse([]byte(in))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	return p
}

func ruleNames(ms []policy.Match) []string {
	var names []string
	for _, m := range ms {
		names = append(names, m.Rule.Name)
	}
	return names
}

// keys returns the store key of each meter of m.
func keys(m policy.Match) []string {
	var out []string
	for _, mm := range m.Meters {
		out = append(out, mm.Key)
	}
	return out
}

func TestMatchRules(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(shipped)
	if err != nil {
		t.Fatalf("Load(%q) = %v", shipped, err)
	}
	tests := []struct {
		name  string
		attrs map[string]string
		want  []string
	}{
		{"nothing", nil, nil},
		{"unknown attributes", map[string]string{"method": "GET"}, nil},
		{"api key", map[string]string{"api_key": "k1", "path": "/"}, []string{"per-key"}},
		{"empty api key is a value", map[string]string{"api_key": ""}, []string{"per-key"}},
		{"upload", map[string]string{"api_key": "k1", "path": "/upload"}, []string{"per-key", "uploads"}},
		{"upload without key", map[string]string{"path": "/upload"}, nil},
		{"path is exact", map[string]string{"api_key": "k1", "path": "/upload/"}, []string{"per-key"}},
		{"login", map[string]string{"remote_address": "192.0.2.1", "path": "/login"}, []string{"login-per-ip", "ip-tiers"}},
		{"search", map[string]string{"path": "/search", "remote_address": "192.0.2.1"}, []string{"search-global", "ip-tiers"}},
		{"all", map[string]string{"api_key": "k", "path": "/login", "remote_address": "192.0.2.1", "user": "u"},
			[]string{"per-key", "login-per-ip", "ip-tiers"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := ruleNames(p.Match(tt.attrs)); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Match(%v) = %q, want %q", tt.attrs, got, tt.want)
			}
		})
	}
}

// TestMatchManyRules checks that Match finds the rules that apply among more than 64,
// past the rules whose answer it remembers between its two loops.
func TestMatchManyRules(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\nrules:\n")
	for i := range 70 {
		fmt.Fprintf(&b, "  - {name: r%d, match: {a: v%d}, limits: [{algorithm: gcra, rate: 1/s}]}\n", i, i%3)
	}
	p := mustParse(t, b.String())
	var want []string
	for i := 1; i < 70; i += 3 {
		want = append(want, fmt.Sprintf("r%d", i))
	}
	attrs := map[string]string{"a": "v1"}
	ms := p.Match(attrs)
	if got := ruleNames(ms); !reflect.DeepEqual(got, want) {
		t.Fatalf("Match(%v) = %q, want %q", attrs, got, want)
	}
	for _, m := range ms {
		if got, want := keys(m), []string{"tg:{" + m.Rule.Name + ":v1}" + m.Rule.Name + "::0.acf1c268"}; !reflect.DeepEqual(got, want) {
			t.Errorf("Match(%v) rule %s keys = %q, want %q", attrs, m.Rule.Name, got, want)
		}
	}
}

func TestMatchGlobal(t *testing.T) {
	t.Parallel()
	p := mustParse(t, "domain: d\nrules: [{name: all, limits: [{algorithm: gcra, rate: 1/s}]}, {name: some, match: {a: x}, limits: [{algorithm: gcra, rate: 1/s}]}]\n")
	for _, attrs := range []map[string]string{nil, {}, {"a": "y"}} {
		ms := p.Match(attrs)
		if got, want := ruleNames(ms), []string{"all"}; !reflect.DeepEqual(got, want) {
			t.Errorf("Match(%v) = %q, want %q", attrs, got, want)
			continue
		}
		if got, want := keys(ms[0]), []string{"tg:{all:}all::0.acf1c268"}; !reflect.DeepEqual(got, want) {
			t.Errorf("Match(%v).Keys = %q, want %q", attrs, got, want)
		}
	}
}

func TestMatchKeys(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(shipped)
	if err != nil {
		t.Fatalf("Load(%q) = %v", shipped, err)
	}
	attrs := map[string]string{"api_key": "k:1", "path": "/upload", "remote_address": "203.0.113.9", "user": "bob"}
	want := []struct {
		rule     string
		keys     []string
		identity string
	}{
		{"per-key", []string{"tg:{k%3A1}per-key::0.c5936300", "tg:{k%3A1}per-key::0.0c8a238f"}, "k%3A1"},
		{"uploads", []string{"tg:{k%3A1}uploads:/upload:0.413c6940"}, "k%3A1:/upload"},
		{"ip-tiers", []string{"tg:{ip-tiers:203.0.113.9}ip-tiers::0.78c79e85"}, "203.0.113.9"},
	}
	ms := p.Match(attrs)
	if len(ms) != len(want) {
		t.Fatalf("Match(%v) = %q, want %d rules", attrs, ruleNames(ms), len(want))
	}
	for i, w := range want {
		m := ms[i]
		if m.Rule.Name != w.rule || !reflect.DeepEqual(keys(m), w.keys) || m.Identity != w.identity {
			t.Errorf("Match(%v)[%d] = %s %q %q, want %s %q %q", attrs, i, m.Rule.Name, keys(m), m.Identity, w.rule, w.keys, w.identity)
		}
		if len(m.Meters) != len(m.Rule.Meters) {
			t.Errorf("Match(%v)[%d] has %d meters, want the rule's %d", attrs, i, len(m.Meters), len(m.Rule.Meters))
		}
	}
	if got, want := algo.Slot(ms[0].Meters[0].Key), algo.Slot(ms[1].Meters[0].Key); got != want {
		t.Errorf("Slot(%q) = %d, want %d, the slot of %q", ms[1].Meters[0].Key, want, got, ms[0].Meters[0].Key)
	}

	attrs = map[string]string{"remote_address": "203.0.113.9", "path": "/login", "user": "bob"}
	ms = p.Match(attrs)
	if got, want := keys(ms[0]), []string{"tg:{login-per-ip:/login:203.0.113.9}login-per-ip::0.4d4ca757"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Match(%v)[0].Keys = %q, want %q", attrs, got, want)
	}
	if got := ms[0].Meters[0].Meter.Record; got != "bob" {
		t.Errorf("Match(%v)[0].Meters[0].Meter.Record = %q, want %q", attrs, got, "bob")
	}
	if got := p.Rules[1].Meters[0].Meter.Record; got != "" {
		t.Errorf("after Match, Rules[1].Meters[0].Meter.Record = %q, want the rule unchanged", got)
	}
	delete(attrs, "user")
	if got := p.Match(attrs)[0].Meters[0].Meter.Record; got != "" {
		t.Errorf("Match(%v)[0].Meters[0].Meter.Record = %q, want empty when the attribute is absent", attrs, got)
	}
}

// hostile holds attribute values that try to break out of a key: braces that would
// move the hash tag, the ':' separator, escapes, newlines, a long value, bytes that
// are not UTF-8.
var hostile = []string{
	"", "%", "%25", "a", "A", "a:b", "a%3Ab", "a%3ab", "{", "}", "{}", "{x}", "}{", "a}b{c", ":", "::", "a:",
	":a", "\n", "a\nb", "\r\n", " ", "\x00", "~", "~" + strings.Repeat("0", 64), "\xff\xfe", "\xc3\x28", "é", "e\u0301",
	strings.Repeat("k", 10240), strings.Repeat("k", 10240) + "x", strings.Repeat("{", 10240), strings.Repeat("a", algo.MaxEscaped),
	strings.Repeat("a", algo.MaxEscaped+1), strings.Repeat(":", 43), strings.Repeat(":", 42),
}

func TestMatchHostileValues(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `
domain: d
shard_by: api_key
rules:
  - {name: key, match: {api_key: "*"}, limits: [{algorithm: gcra, rate: 1/s}]}
  - {name: key-user, match: {api_key: "*", user: "*"}, limits: [{algorithm: gcra, rate: 1/s}, {algorithm: sliding_log, rate: 1/s, record: user}]}
  - {name: user, match: {user: "*"}, limits: [{algorithm: gcra, rate: 1/s}]}
  - {name: user-path, match: {user: "*", path: "*"}, limits: [{algorithm: gcra, rate: 1/s}]}
`)
	seen := map[string]string{} // key -> what made it
	record := func(key, what string) {
		if prev, ok := seen[key]; ok {
			t.Errorf("key %q made by both %s and %s", key, prev, what)
		}
		seen[key] = what
	}
	for i, v := range hostile {
		// A hostile API key: its keys stay in the slot of its own escaped value.
		attrs := map[string]string{"api_key": v, "user": "u"}
		ms := p.Match(attrs)
		if got, want := ruleNames(ms), []string{"key", "key-user", "user"}; !reflect.DeepEqual(got, want) {
			t.Fatalf("Match(api_key %.20q) = %q, want %q", v, got, want)
		}
		tag := algo.Escape(v)
		for _, m := range ms[:2] {
			for _, k := range keys(m) {
				if got := algo.HashTag(k); got != tag {
					t.Errorf("HashTag(%.80q) = %.40q, want %.40q", k, got, tag)
				}
				record(k, fmt.Sprintf("api_key hostile[%d]", i))
			}
		}

		// A hostile user under a fixed API key: the slot does not move.
		attrs = map[string]string{"api_key": "k", "user": v, "path": "/"}
		ms = p.Match(attrs)
		slot := algo.Slot(ms[0].Meters[0].Key)
		for _, k := range keys(ms[1]) {
			if got := algo.Slot(k); got != slot {
				t.Errorf("Slot(%.80q) = %d, want %d, the slot of the API key", k, got, slot)
			}
			record(k, fmt.Sprintf("user hostile[%d]", i))
		}
		if got := ms[1].Meters[1].Meter.Record; got != v {
			t.Errorf("Match(user %.20q).Meters[1].Meter.Record = %.20q, want the raw value", v, got)
		}
		// Rules without the shard attribute: one tag per client, and it is the rule's.
		for _, m := range ms[2:] {
			for _, k := range keys(m) {
				if got, want := algo.HashTag(k), m.Rule.Name+":"+m.Identity; got != want {
					t.Errorf("HashTag(%.80q) = %.40q, want %.40q", k, got, want)
				}
				record(k, fmt.Sprintf("%s hostile[%d]", m.Rule.Name, i))
			}
		}
		// Two hostile attributes in one key cannot pass for another pair.
		for j, w := range hostile[:12] {
			attrs := map[string]string{"user": v, "path": w}
			for _, m := range p.Match(attrs)[1:] {
				record(m.Meters[0].Key, fmt.Sprintf("user-path hostile[%d], hostile[%d]", i, j))
			}
		}
	}
}

func TestMatchConcurrent(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(shipped)
	if err != nil {
		t.Fatalf("Load(%q) = %v", shipped, err)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				attrs := map[string]string{"api_key": fmt.Sprint(g), "path": "/login", "remote_address": "192.0.2.1", "user": fmt.Sprint(i)}
				ms := p.Match(attrs)
				if got := ms[1].Meters[0].Meter.Record; got != fmt.Sprint(i) {
					t.Errorf("Match(%v)[1].Meters[0].Meter.Record = %q, want %q", attrs, got, fmt.Sprint(i))
					return
				}
			}
		})
	}
	wg.Wait()
}

func TestMatchAllocations(t *testing.T) {
	p, err := policy.Load(shipped)
	if err != nil {
		t.Fatalf("Load(%q) = %v", shipped, err)
	}
	none := map[string]string{"method": "GET"}
	if n := testing.AllocsPerRun(100, func() { p.Match(none) }); n != 0 {
		t.Errorf("Match(%v) allocates %v times, want 0", none, n)
	}
	// One rule, one meter, a plain value: the result, its meters, and the key string.
	one := map[string]string{"api_key": "k", "path": "/"}
	p2 := mustParse(t, "domain: d\nshard_by: api_key\nrules: [{name: r, match: {api_key: '*'}, limits: [{algorithm: gcra, rate: 1/s}]}]\n")
	if n := testing.AllocsPerRun(100, func() { p2.Match(one) }); n > 3 {
		t.Errorf("Match(%v) allocates %v times, want at most 3", one, n)
	}
}

func BenchmarkMatch(b *testing.B) {
	p, err := policy.Load(shipped)
	if err != nil {
		b.Fatalf("Load(%q) = %v", shipped, err)
	}
	attrs := map[string]string{"api_key": "k-0123456789", "path": "/upload", "remote_address": "203.0.113.9", "user": "bob"}
	b.ReportAllocs()
	for b.Loop() {
		p.Match(attrs)
	}
}

func TestScale(t *testing.T) {
	t.Parallel()
	gcra := algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 200}
	ring := []algo.Limit{
		{Algorithm: algo.BucketRing, Count: 1000, Period: time.Second},
		{Algorithm: algo.BucketRing, Count: 7, Period: 15 * time.Second},
	}
	tests := []struct {
		m    algo.Meter
		n    int
		want algo.Meter
	}{
		{algo.Meter{Limits: []algo.Limit{gcra}}, 4,
			algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 25, Period: time.Second, Burst: 50}}}},
		{algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 100, Period: time.Minute}}, Record: "u", Shadow: true}, 3,
			algo.Meter{Limits: []algo.Limit{{Algorithm: algo.SlidingLog, Count: 33, Period: time.Minute}}, Record: "u", Shadow: true}},
		{algo.Meter{Limits: []algo.Limit{gcra}}, 1000,
			algo.Meter{Limits: []algo.Limit{{Algorithm: algo.GCRA, Count: 1, Period: time.Second, Burst: 1}}}},
		{algo.Meter{Limits: ring}, 10,
			algo.Meter{Limits: []algo.Limit{{Algorithm: algo.BucketRing, Count: 100, Period: time.Second}, {Algorithm: algo.BucketRing, Count: 1, Period: 15 * time.Second}}}},
		{algo.Meter{Limits: []algo.Limit{gcra}}, 1, algo.Meter{Limits: []algo.Limit{gcra}}},
		{algo.Meter{Limits: []algo.Limit{gcra}}, 0, algo.Meter{Limits: []algo.Limit{gcra}}},
		{algo.Meter{Limits: []algo.Limit{gcra}}, -3, algo.Meter{Limits: []algo.Limit{gcra}}},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%v/%d", tt.m.Limits, tt.n), func(t *testing.T) {
			t.Parallel()
			before := fmt.Sprint(tt.m)
			got := policy.Scale(tt.m, tt.n)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Scale(%v, %d) = %v, want %v", tt.m, tt.n, got, tt.want)
			}
			if after := fmt.Sprint(tt.m); after != before {
				t.Errorf("Scale(%v, %d) changed its argument to %v", before, tt.n, after)
			}
			if err := got.Validate(); err != nil {
				t.Errorf("Scale(%v, %d).Validate() = %v, want nil", tt.m, tt.n, err)
			}
		})
	}
}

// TestMatchOverrides checks replaces and unlimited: a rule that applies takes the
// place of the rules it replaces, an unlimited one matches without a limit, and a
// rule that does not apply replaces nothing.
func TestMatchOverrides(t *testing.T) {
	t.Parallel()
	p := mustParse(t, `domain: d
rules:
  - {name: per-key, match: {api_key: "*"}, limits: [{algorithm: gcra, rate: 10/s}]}
  - {name: per-ip, match: {remote_address: "*"}, limits: [{algorithm: gcra, rate: 50/s}]}
  - {name: acme, match: {api_key: k-acme}, replaces: [per-key], limits: [{algorithm: gcra, rate: 1000/s}]}
  - {name: internal, match: {api_key: k-internal}, unlimited: true, replaces: [per-key, per-ip]}
`)
	tests := []struct {
		attrs  map[string]string
		rules  []string
		meters int
	}{
		{map[string]string{"api_key": "k-1", "remote_address": "192.0.2.1"}, []string{"per-key", "per-ip"}, 2},
		{map[string]string{"api_key": "k-acme", "remote_address": "192.0.2.1"}, []string{"per-ip", "acme"}, 2},
		{map[string]string{"api_key": "k-internal", "remote_address": "192.0.2.1"}, []string{"internal"}, 0},
		{map[string]string{"remote_address": "192.0.2.1"}, []string{"per-ip"}, 1},
	}
	for _, tt := range tests {
		ms := p.Match(tt.attrs)
		meters := 0
		for _, m := range ms {
			meters += len(m.Meters)
		}
		if got := ruleNames(ms); !reflect.DeepEqual(got, tt.rules) || meters != tt.meters {
			t.Errorf("Match(%v) = %q with %d meters, want %q with %d", tt.attrs, got, meters, tt.rules, tt.meters)
		}
	}
	if p.KeyRequired(map[string]string{"remote_address": "192.0.2.1"}, p.Match(map[string]string{"remote_address": "192.0.2.1"})) {
		t.Error("KeyRequired for a request per-ip limits = true, want false")
	}
}
