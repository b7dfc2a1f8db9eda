package erl_test

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// translate translates doc and parses the policy it becomes, failing t on an error.
func translate(t *testing.T, doc string) (erl.Translation, *policy.Policy) {
	t.Helper()
	tr, err := erl.Translate([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	p, err := policy.Parse(tr.Policy)
	if err != nil {
		t.Fatalf("Parse = %v\n%s", err, tr.Policy)
	}
	return tr, p
}

func TestTranslateRefuses(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ doc, want string }{
		{"descriptors: []\n", "domain is empty"},
		{"domain: d\ndescriptors: [{value: x}]\n", "descriptors[0]: key is empty"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: fortnight, requests_per_unit: 5}}]\n", "unit of second, minute, hour, day, week, month or year"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: second}}]\n", "requests_per_unit above 0"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1, replaces: [{name: x}]}}]\n", `replaces "x", which no rate_limit of the file is named`},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, replaces: [{name: x}]}}]\n", `replaces "x", which no rate_limit of the file is named`},
		{"domain: d\ndescriptors: [{key: k, colour: red}]\n", "field colour not found"},
		{"domain: d\ndescriptors: [{key: k, value: v}, {key: k, value: v}]\n", "appears twice"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, unit: day}}]\n", `unlimited and has unit "day"`},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: a}]}}]\n", `rate_limit "a" replaces itself`},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {name: a, unit: second, requests_per_unit: 1, replaces: [{name: ''}]}}]\n", `rate_limit.replaces[0] has no name`},
		{"domain: d\ndescriptors: [{key: k, value: v, share_threshold: true, rate_limit: {unit: second, requests_per_unit: 1}}]\n", `value "v" has no "*"`},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unlimited: true, settle: true}}]\n", "unlimited and settles"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 10}, descriptors: [{key: p, value: r, rate_limit: {unit: minute, requests_per_unit: 20, settle: true}}]}]\n", "give it the parent's unit, requests_per_unit"},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 10}, descriptors: [{key: p, rate_limit: {unit: minute, requests_per_unit: 10, settle: true}}]}]\n", `key "p" keeps a count per value`},
		{"domain: d\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 10}, descriptors: [{key: p, value: 'r*', rate_limit: {unit: minute, requests_per_unit: 10, settle: true}}]}]\n", `key "p" keeps a count per value`},
		{"domain: d\ndescriptors: [{key: K, descriptors: [{key: k-86be9a55, rate_limit: {unit: second, requests_per_unit: 1}}]}]\n", `keys "K" and "k-86be9a55" both become attribute "k-86be9a55"`},
	} {
		if _, err := erl.Translate([]byte(tt.doc)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Translate(%q) = %v, want an error with %q", tt.doc, err, tt.want)
		}
	}
}

// TestTranslateValues keeps ERL's exact values exact, even those that would read as
// tollgate patterns, and its units, shadow mode and unlimited limits.
func TestTranslateValues(t *testing.T) {
	t.Parallel()
	tr, p := translate(t, `domain: d
descriptors:
  - {key: path, value: "/users/{id}", rate_limit: {unit: week, requests_per_unit: 7}}
  - {key: path, value: "!x", shadow_mode: true, rate_limit: {unit: month, requests_per_unit: 30}}
  - {key: path, value: "/free", rate_limit: {unlimited: true}}
  - {key: ua, value: "curl*", share_threshold: true, rate_limit: {unit: year, requests_per_unit: 1, name: Curl Agents}}
`)
	for _, c := range []struct {
		rule, attr, value string
		applies           bool
	}{
		{"path_-users-id", "path", "/users/{id}", true},
		{"path_-users-id", "path", "/users/7", false},
		{"path_-x", "path", "!x", true},
		{"path_-x", "path", "y", false},
		{"curl-agents", "ua", "curl/8", true},
	} {
		var r *policy.Rule
		for _, x := range p.Rules {
			if x.Name == c.rule {
				r = x
			}
		}
		if r == nil {
			t.Fatalf("no rule %s in\n%s", c.rule, tr.Policy)
		}
		attrs := map[string]string{erl.KeysAttribute: c.attr, c.attr: c.value}
		if got := r.WhyNot(attrs) == ""; got != c.applies {
			t.Errorf("rule %s on %s=%q applies: %v, want %v", c.rule, c.attr, c.value, got, c.applies)
		}
	}
	for _, want := range []string{"rate: 7/7day", "shadow: true", "rate: 30/30day", "unlimited: true", "rate: 1/365day"} {
		if !strings.Contains(string(tr.Policy), want) {
			t.Errorf("translation lacks %q:\n%s", want, tr.Policy)
		}
	}
}

// FuzzTranslate translates any document: never a panic, and every translation it
// accepts is a policy tollgate parses.
func FuzzTranslate(f *testing.F) {
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n    descriptors: [{key: p, value: '/x', rate_limit: {unit: minute, requests_per_unit: 1}}]\n  - {key: k, value: v, rate_limit: {unlimited: true}}\n"))
	f.Add([]byte("domain: \"Edge\\nidentity: {trusted_proxies: 3}\\n#\"\ndescriptors: [{key: USER_ID, rate_limit: {unit: second, requests_per_unit: 1}, descriptors: [{key: user_id, rate_limit: {unit: second, requests_per_unit: 2}}]}]\n"))
	f.Add([]byte("domain: ai\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1000}\n    descriptors: [{key: phase, value: response, rate_limit: {unit: minute, requests_per_unit: 1000, settle: true}}, {key: phase, value: 'x*', share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 1000, settle: true}}]\n  - {key: spent, rate_limit: {unit: hour, requests_per_unit: 5, algorithm: token_bucket, settle: true}}\n"))
	f.Add([]byte("domain: w\ndescriptors: [{key: k, value: 'a*b*', share_threshold: true, descriptors: [{key: k, value: '*{x}*', quota_mode: true, rate_limit: {unit: week, requests_per_unit: 1}}]}, {key: k, value: '!*', rate_limit: {unlimited: true}}]\n"))
	for _, doc := range erlTestFiles(f) {
		f.Add(doc.Data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		tr, err := erl.Translate(data)
		if err != nil {
			return
		}
		checkTranslation(t, data, tr)
	})
}

// erlTestFiles returns envoyproxy/ratelimit's configuration test files.
func erlTestFiles(tb testing.TB) []erl.File {
	names, err := filepath.Glob(filepath.Join("testdata", "erl-config", "*.yaml"))
	if err != nil || len(names) == 0 {
		tb.Fatalf("ERL's test files: %v, %v", names, err)
	}
	var out []erl.File
	for _, n := range names {
		b, err := os.ReadFile(n)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, erl.File{Name: filepath.Base(n), Data: b})
	}
	return out
}

// FuzzTranslateFiles translates two files as one directory, merged or not: never a
// panic, an error names the file (or the domain and its files), and every
// translation parses.
func FuzzTranslateFiles(f *testing.F) {
	files := erlTestFiles(f)
	for i, a := range files {
		b := files[(i+1)%len(files)]
		f.Add(a.Data, b.Data, true)
		f.Add(a.Data, a.Data, false)
	}
	f.Fuzz(func(t *testing.T, a, b []byte, merge bool) {
		trs, err := erl.TranslateFiles([]erl.File{{Name: "a.yaml", Data: a}, {Name: "b.yaml", Data: b}}, merge)
		if err != nil {
			e := err.Error()
			named := strings.HasPrefix(e, "a.yaml: ") || strings.HasPrefix(e, "b.yaml: ") ||
				strings.HasPrefix(e, "domain ") && (strings.Contains(e, "(a.yaml") || strings.Contains(e, "(b.yaml"))
			if !named {
				t.Fatalf("TranslateFiles = %v, want an error that names the file, or the domain and its files", err)
			}
			return
		}
		if len(trs) == 0 || len(trs) > 2 {
			t.Fatalf("%d translations of two files", len(trs))
		}
		for _, tr := range trs {
			checkTranslation(t, append(append([]byte(nil), a...), b...), tr)
		}
	})
}

// checkTranslation fails t unless tr, a translation of data, is a policy tollgate
// parses.
func checkTranslation(t *testing.T, data []byte, tr erl.Translation) {
	t.Helper()
	{
		// ERL takes any key and domain, and so does the translation (AttrName,
		// DomainName): a problem is the translator's fault.
		_, err := policy.Parse(tr.Policy)
		ve, ok := errors.AsType[*policy.ValidationError](err)
		if err != nil && !ok {
			t.Fatalf("Parse = %v", err)
		}
		if ok {
			for _, p := range ve.Problems {
				// tollgate's extension fields (algorithm, burst, unit_multiplier) are
				// checked by the policy, as if written there.
				extension := strings.Contains(p.Path, ".limits[") && (bytes.Contains(data, []byte("algorithm")) || bytes.Contains(data, []byte("burst")) || bytes.Contains(data, []byte("unit_multiplier")))
				if !extension {
					t.Fatalf("the translation of %q does not parse: %v\n%s", data, p, tr.Policy)
				}
			}
		}
	}
}

// TestTranslateExtensions reads tollgate's extension fields of a rate_limit: a window
// of unit_multiplier units, and another algorithm with a burst.
func TestTranslateExtensions(t *testing.T) {
	t.Parallel()
	_, p := translate(t, `domain: d
descriptors:
  - {key: a, rate_limit: {unit: minute, requests_per_unit: 10, unit_multiplier: 5}}
  - {key: b, rate_limit: {unit: week, requests_per_unit: 3, unit_multiplier: 2}}
  - {key: c, rate_limit: {unit: second, requests_per_unit: 100, algorithm: gcra, burst: 200}}
`)
	want := []string{"fixed_window 10/5m0s burst 0", "fixed_window 3/336h0m0s burst 0", "gcra 100/1s burst 200"}
	for i, r := range p.Rules {
		l := r.Limits[0]
		if got := fmt.Sprintf("%s %d/%v burst %d", l.Algorithm, l.Count, l.Period, l.Burst); got != want[i] {
			t.Errorf("rule %s: %s, want %s", r.Name, got, want[i])
		}
	}
}

// TestTranslateNames serves ERL's domains and keys as they are written, where
// tollgate's own names are narrower: upper case, other characters, great length. Each
// becomes a name the policy takes, keys that differ only in case keep apart, and a
// key that is already one of tollgate's names stays as it is.
func TestTranslateNames(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("Key", 40)
	tr, p := translate(t, `domain: Edge.Service
descriptors:
  - {key: USER_ID, value: Bob, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: user_id, value: Bob, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: "path:prefix", rate_limit: {unit: minute, requests_per_unit: 4}}
  - {key: `+long+`, rate_limit: {unit: minute, requests_per_unit: 5}}
`)
	if tr.Domain != "Edge.Service" || p.Domain != erl.DomainName("Edge.Service") || !policy.ValidName(p.Domain) {
		t.Errorf("domain %q, policy domain %q; want the file's, and DomainName's (a valid name)", tr.Domain, p.Domain)
	}
	// A domain is any text: one with line breaks stays out of the policy's fields.
	tr2, err := erl.Translate([]byte("domain: \"edge\\nidentity: {trusted_proxies: 3}\\u2028\\u0085#\"\ndescriptors: [{key: k, rate_limit: {unit: minute, requests_per_unit: 1}}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if p2, err := policy.Parse(tr2.Policy); err != nil || p2.Identity.TrustedProxies != 0 {
		t.Errorf("a domain with line breaks: Parse = %v, trusted proxies %v; want a policy with no field of the domain's text\n%s", err, p2, tr2.Policy)
	}
	if got := erl.AttrName("user_id"); got != "user_id" {
		t.Errorf("AttrName(user_id) = %q, want it as it is", got)
	}
	seen := map[string]string{}
	for _, key := range []string{"USER_ID", "user_id", "User_Id", "path:prefix", "path-prefix", long, "ключ", ":::"} {
		a := erl.AttrName(key)
		if !policy.ValidAttribute(a) {
			t.Errorf("AttrName(%q) = %q, not an attribute name", key, a)
		}
		if other, dup := seen[a]; dup {
			t.Errorf("AttrName(%q) = AttrName(%q) = %q", key, other, a)
		}
		seen[a] = key
	}
	for _, c := range []struct {
		key    string
		period string // the limit of the rule that applies
	}{{"USER_ID", "2/1m0s"}, {"user_id", "3/1m0s"}, {"path:prefix", "4/1m0s"}, {long, "5/1m0s"}} {
		attrs := map[string]string{erl.KeysAttribute: c.key, erl.AttrName(c.key): "Bob"}
		var got []string
		for _, r := range p.Rules {
			if r.WhyNot(attrs) == "" {
				got = append(got, fmt.Sprintf("%d/%v", r.Limits[0].Count, r.Limits[0].Period))
			}
		}
		if len(got) != 1 || got[0] != c.period {
			t.Errorf("key %.20q: the rules that apply have limits %v, want only %s\n%s", c.key, got, c.period, tr.Policy)
		}
	}
}

// TestTranslateSettle reads tollgate's settle extension: the rule of a rate_limit
// marked settle settles; under a descriptor with the same rate_limit it shares that
// descriptor's count (the response phase's cost charges the request phase's count,
// as ERL's one descriptor for both would), elsewhere it counts on its own.
func TestTranslateSettle(t *testing.T) {
	t.Parallel()
	_, p := translate(t, `domain: ai
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1000}
    descriptors:
      - {key: phase, value: response, rate_limit: {unit: minute, requests_per_unit: 1000, settle: true}}
  - {key: spent, rate_limit: {unit: hour, requests_per_unit: 5, settle: true}}
`)
	want := map[string]struct {
		settle  bool
		counter string
	}{"tenant": {false, "tenant"}, "tenant.phase_response": {true, "tenant"}, "spent": {true, ""}}
	for _, r := range p.Rules {
		w, ok := want[r.Name]
		if !ok {
			t.Errorf("rule %s, want only %v", r.Name, want)
			continue
		}
		if r.Settle != w.settle || r.Limits[0].Counter != w.counter {
			t.Errorf("rule %s: settle %v counter %q, want %v %q", r.Name, r.Settle, r.Limits[0].Counter, w.settle, w.counter)
		}
	}
	keys := func(attrs map[string]string) []string {
		var out []string
		for _, m := range p.Match(attrs) {
			for _, mm := range m.Meters {
				out = append(out, mm.Key)
			}
		}
		return out
	}
	check := keys(map[string]string{erl.KeysAttribute: "tenant", "tenant": "t1"})
	spent := keys(map[string]string{erl.KeysAttribute: "tenant,phase", "tenant": "t1", "phase": "response"})
	if len(check) != 1 || len(spent) != 1 || check[0] != spent[0] {
		t.Errorf("the request phase's keys %v and the response phase's %v, want one key both charge", check, spent)
	}
}

// TestTranslateReservedKeys translates keys named like the attributes tollgate sets
// itself (descriptor.keys, descriptor.N): AttrName renames them, so they load and
// never stand for tollgate's own attributes. TestERLKeyNamedLikeTollgates (package
// rls) decides with them.
func TestTranslateReservedKeys(t *testing.T) {
	t.Parallel()
	_, p := translate(t, `domain: reserved
descriptors:
  - key: descriptor.keys
    value: x
    rate_limit: {unit: minute, requests_per_unit: 2}
    descriptors:
      - {key: descriptor.1, rate_limit: {unit: minute, requests_per_unit: 1}}
`)
	if len(p.Rules) == 0 {
		t.Fatalf("the translated policy has no rule")
	}
	for _, key := range []string{erl.KeysAttribute, erl.EntryAttribute(1), "descriptor.none", "Descriptor.Keys"} {
		a := erl.AttrName(key)
		if !policy.ValidAttribute(a) || strings.HasPrefix(a, "descriptor.") || a == erl.KeysAttribute {
			t.Errorf("AttrName(%q) = %q, want a valid attribute apart from tollgate's descriptor.*", key, a)
		}
	}
	if a, b := erl.AttrName(erl.KeysAttribute), erl.AttrName(erl.EntryAttribute(1)); a == b {
		t.Errorf("AttrName(%q) = AttrName(%q) = %q", erl.KeysAttribute, erl.EntryAttribute(1), a)
	}
}
