package policy_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// shipped is the policy the Lambda front doors deploy with.
const shipped = "../../lambda/policy.yaml"

func TestLoadShipped(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(shipped)
	if err != nil {
		t.Fatalf("Load(%q) = %v", shipped, err)
	}
	if p.Domain != "public-api" || p.ShardBy != "api_key" || p.Prefix != "tg:" {
		t.Errorf("Load(%q) = domain %q, shard_by %q, prefix %q, want public-api, api_key, tg:", shipped, p.Domain, p.ShardBy, p.Prefix)
	}
	wantFailure := policy.Failure{Mode: policy.FailOpen, Timeout: 50 * time.Millisecond, ExpectedInstances: 4,
		Breaker: policy.Breaker{Failures: 5, OpenFor: 5 * time.Second}}
	if p.Failure != wantFailure {
		t.Errorf("Load(%q).Failure = %+v, want %+v", shipped, p.Failure, wantFailure)
	}
	if want := (policy.Identity{TrustedProxies: 0, IPv6Prefix: 64}); p.Identity != want {
		t.Errorf("Load(%q).Identity = %+v, want %+v", shipped, p.Identity, want)
	}
	if want := (policy.DenyCache{Enabled: true, MaxEntries: 100000}); p.DenyCache != want {
		t.Errorf("Load(%q).DenyCache = %+v, want %+v", shipped, p.DenyCache, want)
	}

	gcra := algo.Limit{Algorithm: algo.GCRA, Count: 100, Period: time.Second, Burst: 200}
	daily := algo.Limit{Algorithm: algo.FixedWindow, Count: 10000, Period: 24 * time.Hour}
	login := algo.Limit{Algorithm: algo.SlidingLog, Count: 5, Period: time.Minute}
	search := algo.Limit{Algorithm: algo.TokenBucket, Count: 1000, Period: time.Second, Burst: 2000}
	upload := algo.Limit{Algorithm: algo.LeakyBucket, Count: 10, Period: time.Second, Burst: 20}
	proRate := algo.Limit{Algorithm: algo.GCRA, Count: 1000, Period: time.Second, Burst: 2000}
	proDaily := algo.Limit{Algorithm: algo.FixedWindow, Count: 1000000, Period: 24 * time.Hour}
	orders := algo.Limit{Algorithm: algo.GCRA, Count: 20, Period: time.Second}
	ring := []algo.Limit{
		{Algorithm: algo.BucketRing, Count: 1000, Period: time.Second},
		{Algorithm: algo.BucketRing, Count: 5000, Period: 10 * time.Second},
		{Algorithm: algo.BucketRing, Count: 7000, Period: 15 * time.Second},
	}
	want := []struct {
		name    string
		match   map[string]string
		shadow  bool
		records []string
		meters  []algo.Meter
	}{
		{"per-key", map[string]string{"api_key": "*"}, false, []string{"", ""},
			[]algo.Meter{{Limits: []algo.Limit{gcra}}, {Limits: []algo.Limit{daily}}}},
		{"login-per-ip", map[string]string{"remote_address": "*", "path": "/login"}, false, []string{"user"},
			[]algo.Meter{{Limits: []algo.Limit{login}}}},
		{"search-global", map[string]string{"path": "/search"}, false, []string{""},
			[]algo.Meter{{Limits: []algo.Limit{search}}}},
		{"uploads", map[string]string{"api_key": "*", "path": "/upload"}, false, []string{""},
			[]algo.Meter{{Limits: []algo.Limit{upload}}}},
		{"ip-tiers", map[string]string{"remote_address": "*"}, true, []string{"", "", ""},
			[]algo.Meter{{Limits: ring, Shadow: true}}},
		{"pro", map[string]string{"api_key": "*", "plan": "pro"}, false, []string{"", ""},
			[]algo.Meter{{Limits: []algo.Limit{proRate}}, {Limits: []algo.Limit{proDaily}}}},
		{"orders", map[string]string{"api_key": "*", "path": "/users/{id}/orders"}, false, []string{""},
			[]algo.Meter{{Limits: []algo.Limit{orders}}}},
	}
	if p.Plans == nil || p.Plans.Default != "free" || p.Plans.Plan("k-pro-example", false) != "pro" || p.Plans.Plan("k-other", false) != "free" {
		t.Errorf("Load(%q).Plans = %+v, want k-pro-example on pro and the rest on free", shipped, p.Plans)
	}
	if got := p.Rules[5].Replaces; !reflect.DeepEqual(got, []string{"per-key"}) {
		t.Errorf("Load(%q): pro replaces %q, want per-key", shipped, got)
	}
	if len(p.Rules) != len(want) {
		t.Fatalf("Load(%q) has %d rules, want %d", shipped, len(p.Rules), len(want))
	}
	for i, w := range want {
		r := p.Rules[i]
		if r.Name != w.name || !reflect.DeepEqual(r.MatchText(), w.match) || r.Shadow != w.shadow || !reflect.DeepEqual(records(r), w.records) {
			t.Errorf("Load(%q).Rules[%d] = %s %v shadow %v records %q, want %s %v shadow %v records %q",
				shipped, i, r.Name, r.MatchText(), r.Shadow, records(r), w.name, w.match, w.shadow, w.records)
		}
		if got := meters(r); !reflect.DeepEqual(got, w.meters) {
			t.Errorf("Load(%q).Rules[%d].Meters = %v, want %v", shipped, i, got, w.meters)
		}
		for j, m := range meters(r) {
			if err := m.Validate(); err != nil {
				t.Errorf("Load(%q).Rules[%d].Meters[%d].Validate() = %v, want nil", shipped, i, j, err)
			}
		}
	}
	if got, want := p.Attributes(), []string{"api_key", "path", "remote_address", "user"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Attributes() = %q, want %q", got, want)
	}
}

func TestJSONEqualsYAML(t *testing.T) {
	t.Parallel()
	y, err := policy.Load(shipped)
	if err != nil {
		t.Fatalf("Load(%q) = %v", shipped, err)
	}
	j, err := policy.Load("testdata/policy.json")
	if err != nil {
		t.Fatalf("Load(testdata/policy.json) = %v", err)
	}
	if !reflect.DeepEqual(y, j) {
		t.Errorf("Load(testdata/policy.json) = %+v, want the YAML policy %+v", j, y)
	}
}

func TestDefaults(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse([]byte("domain: d\nrules: [{name: all, limits: [{algorithm: sliding_window, rate: 10/s}]}]\n"))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	want := policy.Policy{
		Domain: "d", Prefix: "tg:",
		Failure: policy.Failure{Mode: policy.FailOpen, Timeout: 50 * time.Millisecond, ExpectedInstances: 1,
			Breaker: policy.Breaker{Failures: 5, OpenFor: 5 * time.Second}},
		Identity:  policy.Identity{IPv6Prefix: 64},
		DenyCache: policy.DenyCache{Enabled: true, MaxEntries: 100000},
	}
	got := *p
	got.Rules = nil
	if got.Domain != want.Domain || got.Prefix != want.Prefix || got.ShardBy != "" || got.Failure != want.Failure ||
		got.Identity != want.Identity || got.DenyCache != want.DenyCache {
		t.Errorf("Parse() = %+v, want defaults %+v", got, want)
	}
	if len(p.Rules) != 1 || len(p.Rules[0].Match) != 0 {
		t.Errorf("Parse() rules = %+v, want one global rule", p.Rules)
	}
}

func TestParseOptional(t *testing.T) {
	t.Parallel()
	in := `
domain: d
prefix: "rl:"
failure: {mode: local, timeout: 20ms, expected_instances: 3, breaker: {failures: 2, open_for: 1s}}
identity: {trusted_proxies: 2, ipv6_prefix: 56}
deny_cache: {enabled: false, max_entries: 10}
rules:
  - name: merged
    match: {x-tenant: acme, port: 443}
    limits:
      - &base {algorithm: token_bucket, rate: 10/s}
      - {<<: *base, burst: 5}
      - {algorithm: bucket_ring, rate: 10/s, bucket: 500ms}
      - {algorithm: bucket_ring, rate: 50/10s}
`
	p, err := policy.Parse([]byte(in))
	if err != nil {
		t.Fatalf("Parse() = %v", err)
	}
	want := policy.Policy{Domain: "d", Prefix: "rl:",
		Failure:   policy.Failure{Mode: policy.FailLocal, Timeout: 20 * time.Millisecond, ExpectedInstances: 3, Breaker: policy.Breaker{Failures: 2, OpenFor: time.Second}},
		Identity:  policy.Identity{TrustedProxies: 2, IPv6Prefix: 56},
		DenyCache: policy.DenyCache{Enabled: false, MaxEntries: 10},
	}
	if p.Prefix != want.Prefix || p.Failure != want.Failure || p.Identity != want.Identity || p.DenyCache != want.DenyCache {
		t.Errorf("Parse() = %+v, want %+v", *p, want)
	}
	r := p.Rules[0]
	if want := map[string]string{"x-tenant": "acme", "port": "443"}; !reflect.DeepEqual(r.MatchText(), want) {
		t.Errorf("Parse() match = %v, want %v", r.MatchText(), want)
	}
	tb := algo.Limit{Algorithm: algo.TokenBucket, Count: 10, Period: time.Second}
	tb5 := tb
	tb5.Burst = 5
	wantMeters := []algo.Meter{
		{Limits: []algo.Limit{tb}},
		{Limits: []algo.Limit{tb5}},
		{Limits: []algo.Limit{
			{Algorithm: algo.BucketRing, Count: 10, Period: time.Second, Bucket: 500 * time.Millisecond},
			{Algorithm: algo.BucketRing, Count: 50, Period: 10 * time.Second},
		}},
	}
	if got := meters(r); !reflect.DeepEqual(got, wantMeters) {
		t.Errorf("Parse() meters = %v, want %v", got, wantMeters)
	}
}

// meters returns the algo.Meter of each meter of r.
func meters(r *policy.Rule) []algo.Meter {
	var out []algo.Meter
	for _, m := range r.Meters {
		out = append(out, m.Meter)
	}
	return out
}

// records returns the attribute each limit of r records, "" for none.
func records(r *policy.Rule) []string {
	var out []string
	for _, l := range r.Limits {
		out = append(out, l.Record)
	}
	return out
}

// problems returns the problems of a *ValidationError as "path: msg" lines, or the
// error itself if it is another error.
func problems(err error) []string {
	if err == nil {
		return nil
	}
	ve, ok := errors.AsType[*policy.ValidationError](err)
	if !ok {
		return []string{"not a *ValidationError: " + err.Error()}
	}
	var out []string
	for _, p := range ve.Problems {
		s := p.Msg
		if p.Path != "" {
			s = p.Path + ": " + s
		}
		out = append(out, s)
	}
	return out
}

// rule wraps limit lines into a one-rule policy.
func rule(limits ...string) string {
	return "domain: d\nrules:\n  - name: r\n    limits:\n" + "      - " + strings.Join(limits, "\n      - ") + "\n"
}

func TestValidation(t *testing.T) {
	t.Parallel()
	const algos = "fixed_window, sliding_log, sliding_window, token_bucket, leaky_bucket, gcra, bucket_ring"
	const nameRule = "use 1 to 63 characters of a-z, 0-9, '_', '.' and '-', starting with a letter or digit"
	const attrRule = "use 1 to 64 characters of a-z, 0-9, '_', '.' and '-' (header attributes are named by their lower-case header name, e.g. x-tenant)"
	tests := []struct {
		name string
		in   string
		want []string
	}{
		{"bad plans", "domain: d\nplans: {attribute: Plan, keys: {\"sha256:abc\": pro, k1: free, k1: pro}}\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`plans.attribute: "Plan": ` + attrRule, `plans.keys."sha256:abc": "sha256:abc": want sha256: and 64 lower-case hex digits (sha256sum of the key)`, "plans.keys.k1: appears twice; give each key one plan"}},
		{"plans without keys", "domain: d\nplans: {default: free}\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`plans.keys: missing; map keys to plans, e.g. keys: {"sha256:9f86d081…": pro}`}},
		{"bad calendar", "domain: d\nrules:\n- {name: a, limits: [{algorithm: gcra, rate: 10/month, calendar: {timezone: Europe/Berlin}}, {algorithm: fixed_window, rate: 10/fortnight, calendar: {}}, {algorithm: fixed_window, rate: 10/day, calendar: {timezone: Moon/Base, tz: x}}]}\n",
			[]string{
				`rules[0].limits[0].calendar: "gcra": only fixed_window has calendar windows; use algorithm: fixed_window`,
				`rules[0].limits[1].rate: "10/fortnight": a calendar window is a day, a week or a month: write COUNT/day, COUNT/week or COUNT/month`,
				`rules[0].limits[2].calendar.timezone: "Moon/Base": not an IANA time zone; use a name such as Europe/Berlin, America/New_York or UTC`,
				"rules[0].limits[2].calendar.tz: unknown field; known fields: timezone",
			}},
		{"bad each", "domain: d\nrules: [{name: r, match: {path: {each: '/api/*', colour: red}, ua: {each: '~('}}, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"rules[0].match.path.colour: unknown field; known fields: each", `rules[0].match.ua: "~(": not an RE2 regular expression: error parsing regexp: missing closing ): ` + "`(`"}},
		{"replaces an unknown rule", "domain: d\nrules:\n- {name: per-key, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: acme, replaces: [per-kye], limits: [{algorithm: gcra, rate: 9/s}]}\n",
			[]string{`rules[1].replaces[0]: "per-kye": no rule has this name; did you mean "per-key"?`}},
		{"a suggestion among equally close names does not depend on map order", "domain: d\nrules:\n- {name: r3, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: r1, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: b, replaces: [r0], limits: [{algorithm: gcra, rate: 9/s}]}\n",
			[]string{`rules[2].replaces[0]: "r0": no rule has this name; did you mean "r1"?`}},
		{"replaces itself", "domain: d\nrules:\n- {name: a, replaces: [a], limits: [{algorithm: gcra, rate: 1/s}]}\n",
			[]string{"rules[0].replaces[0]: a rule cannot replace itself; name another rule"}},
		{"replaces in a cycle", "domain: d\nrules:\n- {name: a, replaces: [b], limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: b, replaces: [c], limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: c, replaces: [a], limits: [{algorithm: gcra, rate: 1/s}]}\n",
			[]string{`rules[0].replaces: rules replace each other in a cycle through "a"; a rule may replace another only one way`}},
		{"replaces not a list", "domain: d\nrules:\n- {name: a, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: b, replaces: a, limits: [{algorithm: gcra, rate: 1/s}]}\n",
			[]string{`rules[1].replaces: want a list of rule names, e.g. replaces: [per-key], got the string "a"`}},
		{"unlimited with limits", "domain: d\nrules:\n- {name: a, unlimited: true, shadow: true, limits: [{algorithm: gcra, rate: 1/s}]}\n",
			[]string{"rules[0].unlimited: an unlimited rule limits nothing to shadow; remove shadow, or unlimited", "rules[0].limits: an unlimited rule has no limits; remove limits, or unlimited"}},
		{"lease on algorithms that cannot lease", rule("{algorithm: sliding_log, rate: 10/s, lease: {units: 2, for: 100ms}}", "{algorithm: leaky_bucket, rate: 10/s, lease: {units: 2, for: 100ms}}", "{algorithm: bucket_ring, rate: 10/s, lease: {units: 2, for: 100ms}}"),
			[]string{
				"rules[0].limits[0].lease: sliding_log cannot lease (each request must reach the store); remove lease or use fixed_window, sliding_window, token_bucket or gcra",
				"rules[0].limits[1].lease: leaky_bucket cannot lease (each request must reach the store); remove lease or use fixed_window, sliding_window, token_bucket or gcra",
				"rules[0].limits[2].lease: bucket_ring cannot lease (each request must reach the store); remove lease or use fixed_window, sliding_window, token_bucket or gcra",
			}},
		{"lease units and for out of range", rule("{algorithm: gcra, rate: 100/s, burst: 20, lease: {units: 21, for: 2h}}", "{algorithm: fixed_window, rate: 100/s, lease: {units: 0, for: 100}}", "{algorithm: token_bucket, rate: 100/s, lease: {units: 10, for: 1500us}}"),
			[]string{
				"rules[0].limits[0].lease.units: units must be 1 to the limit's capacity (20); a tenth of it or less leaves room for other instances, e.g. units: 2",
				`rules[0].limits[0].lease.for: "2h": must be from 1ms to 1h`,
				"rules[0].limits[1].lease.units: 0: must be from 1 to 1099511627776",
				"rules[0].limits[1].lease.for: want a duration with a unit, such as 100ms, got the number 100",
				"rules[0].limits[2].lease.for: for must be a whole number of milliseconds from 1ms to 1h, e.g. for: 100ms",
			}},
		{"a bucket's lease whose refill does not fit its burst", rule("{algorithm: gcra, rate: 100/s, burst: 100, lease: {units: 50, for: 1s}}", "{algorithm: token_bucket, rate: 100/s, burst: 100, lease: {units: 50, for: 500ms}}"),
			[]string{
				"rules[0].limits[0].lease.for: a gcra lease charges units plus the refill over for (50 + 100) at once, more than the burst of 100; shorten for (e.g. for: 250ms) or lower units",
			}},
		{"replicas out of range", rule("{algorithm: gcra, rate: 100/s, replicas: {count: 0, timeout: 2s}}", "{algorithm: fixed_window, rate: 100/s, replicas: {count: 11, timeout: 5}}", "{algorithm: token_bucket, rate: 100/s, replicas: {count: 1, timeout: 1500us}}"),
			[]string{
				"rules[0].limits[0].replicas.count: 0: must be from 1 to 10",
				`rules[0].limits[0].replicas.timeout: "2s": must be from 1ms to 1s`,
				"rules[0].limits[1].replicas.count: 11: must be from 1 to 10",
				"rules[0].limits[1].replicas.timeout: want a duration with a unit, such as 5ms, got the number 5",
				"rules[0].limits[2].replicas.timeout: Redis waits in whole milliseconds; round it, e.g. timeout: 5ms",
			}},
		{"replicas missing fields", rule("{algorithm: gcra, rate: 100/s, replicas: {cont: 1}}", "{algorithm: gcra, rate: 100/s, replicas: 1}"),
			[]string{
				"rules[0].limits[0].replicas.count: missing; say how many replicas must acknowledge each charge, e.g. count: 1",
				"rules[0].limits[0].replicas.timeout: missing; say how long the master may wait for them, e.g. timeout: 5ms",
				`rules[0].limits[0].replicas.cont: unknown field; known fields: count, timeout; did you mean "count"?`,
				"rules[0].limits[1].replicas: want a mapping with count and timeout, e.g. replicas: {count: 1, timeout: 5ms}, got the number 1",
			}},
		{"lease missing fields", rule("{algorithm: gcra, rate: 100/s, lease: {unit: 5}}", "{algorithm: gcra, rate: 100/s, lease: 5}"),
			[]string{
				"rules[0].limits[0].lease.units: missing; say how many units to reserve at a time, e.g. units: 50",
				"rules[0].limits[0].lease.for: missing; say how long a reservation may be spent from, e.g. for: 100ms",
				`rules[0].limits[0].lease.unit: unknown field; known fields: units, for; did you mean "units"?`,
				"rules[0].limits[1].lease: want a lease: a mapping with units and for, e.g. lease: {units: 50, for: 100ms}, got the number 5",
			}},
		{"lease with record or in a shadow rule", "domain: d\nrules:\n- {name: a, match: {user: \"*\"}, limits: [{algorithm: fixed_window, rate: 10/s, record: path, lease: {units: 2, for: 1s}}]}\n- {name: b, shadow: true, limits: [{algorithm: gcra, rate: 10/s, lease: {units: 2, for: 100ms}}]}\n",
			[]string{
				"rules[0].limits[0].lease: a limit that records each request's value cannot lease; remove lease or record",
				"rules[1].limits[0].lease: a shadow rule's limits never deny, so there is nothing to lease; remove lease or shadow",
			}},
		{"unknown top-level field", "domain: d\ncolour: red\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"colour: unknown field; known fields: domain, prefix, shard_by, failure, identity, deny_cache, plans, rules"}},
		{"unknown limit field", rule("{algorithm: gcra, rate: 1/s, colour: red}"),
			[]string{"rules[0].limits[0].colour: unknown field; known fields: algorithm, rate, burst, bucket, record, calendar, lease, replicas, counter"}},
		{"misspelt field", rule("{algorithm: gcra, rate: 1/s, brust: 3}"),
			[]string{`rules[0].limits[0].brust: unknown field; known fields: algorithm, rate, burst, bucket, record, calendar, lease, replicas, counter; did you mean "burst"?`}},
		{"unknown fields everywhere", "domain: d\nfailure: {mode: open, retries: 3, breaker: {fails: 1}}\nidentity: {proxies: 1}\ndeny_cache: {size: 1}\nrules: [{name: r, when: x, limits: [{algorithm: gcra, rate: 1/s, cost: 2}]}]\n",
			[]string{
				"failure.retries: unknown field; known fields: mode, timeout, expected_instances, breaker",
				"failure.breaker.fails: unknown field; known fields: failures, open_for",
				"identity.proxies: unknown field; known fields: trusted_proxies, ipv6_prefix",
				"deny_cache.size: unknown field; known fields: enabled, max_entries",
				"rules[0].when: unknown field; known fields: name, match, limits, unlimited, replaces, shadow, settle, rlqs",
				"rules[0].limits[0].cost: unknown field; known fields: algorithm, rate, burst, bucket, record, calendar, lease, replicas, counter",
			}},
		{"repeated field", "domain: d\ndomain: e\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"domain: appears twice (first on line 1); remove one"}},
		{"bad rate unit", "domain: d\nrules:\n- {name: a, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: b, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: c, limits: [{algorithm: fixed_window, rate: 10/x}]}\n",
			[]string{`rules[2].limits[0].rate: "10/x": unknown unit "x"; use ms, s, min, h, day, week or month`}},
		{"bad rate form", rule("{algorithm: gcra, rate: 100}"),
			[]string{`rules[0].limits[0].rate: "100": want COUNT/PERIOD, e.g. "100/s", "5/10s", "30/min"`}},
		{"zero count", rule("{algorithm: gcra, rate: 0/s}"),
			[]string{`rules[0].limits[0].rate: "0/s": count must be at least 1`}},
		{"rate too fast", rule("{algorithm: gcra, rate: 2000000/s}"),
			[]string{`rules[0].limits[0].rate: "2000000/s": rate is faster than one unit per microsecond; use a longer period or a smaller count`}},
		{"missing algorithm and rate", rule("{burst: 2}"),
			[]string{
				"rules[0].limits[0].algorithm: missing; use one of " + algos,
				"rules[0].limits[0].rate: missing; write COUNT/PERIOD, e.g. rate: 100/s",
			}},
		{"unknown algorithm", rule("{algorithm: fixed, rate: 1/s}"),
			[]string{`rules[0].limits[0].algorithm: "fixed": unknown algorithm; use one of ` + algos}},
		{"duplicate rule names", "domain: d\nrules:\n- {name: per-key, limits: [{algorithm: gcra, rate: 1/s}]}\n- {name: per-key, limits: [{algorithm: gcra, rate: 1/s}]}\n",
			[]string{`rules[1].name: "per-key" is used by rules[0]; rule names must be unique`}},
		{"record on token_bucket", rule("{algorithm: token_bucket, rate: 1/s, record: user}"),
			[]string{"rules[0].limits[0].record: token_bucket cannot keep recorded values; remove record or use sliding_log or fixed_window"}},
		{"bad record attribute", rule("{algorithm: sliding_log, rate: 1/s, record: User}"),
			[]string{`rules[0].limits[0].record: "User": ` + attrRule}},
		{"burst on sliding_log", rule("{algorithm: sliding_log, rate: 5/min, burst: 10}"),
			[]string{`rules[0].limits[0].burst: "10": sliding_log has no burst; remove it or use token_bucket, gcra or leaky_bucket`}},
		{"burst zero", rule("{algorithm: gcra, rate: 5/min, burst: 0}"),
			[]string{"rules[0].limits[0].burst: 0: must be from 1 to 1099511627776"}},
		{"bucket off the ring", rule("{algorithm: gcra, rate: 5/min, bucket: 1s}"),
			[]string{`rules[0].limits[0].bucket: "1s": only bucket_ring has buckets; remove it`}},
		{"bucket does not divide", rule("{algorithm: bucket_ring, rate: 5/min, bucket: 7s}"),
			[]string{`rules[0].limits[0].bucket: "7s": bucket must be a whole number of milliseconds that divides the period`}},
		{"ring buckets differ", rule("{algorithm: bucket_ring, rate: 1/s, bucket: 100ms}", "{algorithm: bucket_ring, rate: 5/10s, bucket: 200ms}"),
			[]string{`rules[0].limits[1].bucket: "200ms": the bucket_ring limits of a rule share one key and one bucket width; use 100ms as in rules[0].limits[0], or leave bucket out`}},
		{"ring period off the bucket", rule("{algorithm: bucket_ring, rate: 10/2s, bucket: 400ms}", "{algorithm: bucket_ring, rate: 1/1s}"),
			[]string{"rules[0].limits[1].rate: the period 1s is not a multiple of the ring's bucket width 400ms (the bucket set on the ring); set a bucket that divides every period of the ring"}},
		{"ring too many buckets", rule("{algorithm: bucket_ring, rate: 10/h}", "{algorithm: bucket_ring, rate: 1/1001ms}"),
			[]string{"rules[0].limits[0].rate: the period 1h spans more than 3600 buckets of 1ms (the greatest common divisor of the ring's periods); set a wider bucket that divides every period of the ring"}},
		{"unused shard_by", "domain: d\nshard_by: tenant\nrules: [{name: r, match: {api_key: '*'}, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`shard_by: "tenant": no rule matches on this attribute; match on it in a rule or remove shard_by`}},
		{"bad shard_by", "domain: d\nshard_by: Tenant\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`shard_by: "Tenant": ` + attrRule}},
		{"empty domain", "domain: ''\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`domain: "": ` + nameRule}},
		{"missing domain", "rules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"domain: missing; name the policy, e.g. domain: public-api"}},
		{"null domain", "domain:\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"domain: missing; name the policy, e.g. domain: public-api"}},
		{"no rules", "domain: d\nrules: []\n",
			[]string{"rules: the policy has no rules; add at least one"}},
		{"missing rules", "domain: d\n",
			[]string{"rules: missing; list the rules, each with a name, a match and limits"}},
		{"rule without limits", "domain: d\nrules: [{name: r, limits: []}, {name: s}]\n",
			[]string{
				"rules[0].limits: the rule has no limits; add at least one",
				"rules[1].limits: missing; list at least one limit, e.g. limits: [{algorithm: gcra, rate: 100/s}]",
			}},
		{"rule without name", "domain: d\nrules: [{limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"rules[0].name: missing; give the rule a name, e.g. name: per-key"}},
		{"bad rule name", "domain: d\nrules: [{name: Per Key, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`rules[0].name: "Per Key": ` + nameRule}},
		{"bad match", "domain: d\nrules: [{name: r, match: {X-Tenant: a, path: '', user: ~, ip: [1, {a: b}]}, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{
				`rules[0].match.X-Tenant: "X-Tenant": ` + attrRule,
				`rules[0].match.path: the value is empty; write the value to match, or "*" for any value`,
				`rules[0].match.user: want a value to match, "*" for any value, or a list of values, got nothing (null)`,
				"rules[0].match.ip: want a list of values, got an element that is a mapping",
			}},
		{"bad failure mode", "domain: d\nfailure: {mode: opne}\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`failure.mode: "opne": unknown failure mode; use open, closed or local`}},
		{"failure out of range", "domain: d\nfailure: {timeout: 11s, expected_instances: 0, breaker: {failures: 0, open_for: 2h}}\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{
				`failure.timeout: "11s": must be from 1ms to 10s`,
				"failure.expected_instances: 0: must be from 1 to 10000",
				"failure.breaker.failures: 0: must be from 1 to 1000000",
				`failure.breaker.open_for: "2h": must be from 1ms to 1h`,
			}},
		{"identity out of range", "domain: d\nidentity: {trusted_proxies: -1, ipv6_prefix: 129}\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{
				"identity.trusted_proxies: -1: must be from 0 to 32",
				"identity.ipv6_prefix: 129: must be from 1 to 128",
			}},
		{"bad prefix", "domain: d\nprefix: 'a{b'\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n",
			[]string{`prefix: "a{b": use printable ASCII without spaces, '{' or '}' (braces would move the cluster hash tag)`}},
		{"wrong types", "domain: [d]\nfailure: {timeout: 50, expected_instances: '4', mode: {a: 1}}\ndeny_cache: {enabled: 'true', max_entries: 1.5}\nidentity: open\nrules: [{name: r, shadow: yes, limits: [{algorithm: gcra, rate: 1/s, burst: '200', bucket: 1}]}, hello, {name: s, match: [a], limits: {a: 1}}]\n",
			[]string{
				"domain: want a domain name, got a list",
				"failure.timeout: want a duration with a unit, such as 50ms, got the number 50",
				`failure.expected_instances: want a whole number, got the string "4"; remove the quotes`,
				"failure.mode: want open, closed or local, got a mapping",
				`deny_cache.enabled: want true or false, got the string "true"; remove the quotes`,
				"deny_cache.max_entries: want a whole number from 1 to 10000000, got the number 1.5",
				`identity: want a mapping with trusted_proxies or ipv6_prefix, got the string "open"`,
				`rules[0].shadow: want true or false, got the string "yes"`,
				`rules[0].limits[0].burst: want a whole number, got the string "200"; remove the quotes`,
				"rules[0].limits[0].bucket: want a duration with a unit, such as 100ms, got the number 1",
				`rules[1]: want a rule: a mapping with name, match and limits, got the string "hello"`,
				`rules[2].match: want a mapping of attribute names to values (or "*" for any value), got a list`,
				"rules[2].limits: want a list of limits, got a mapping",
			}},
		{"rules not a list", "domain: d\nrules: {name: r}\n",
			[]string{"rules: want a list of rules, got a mapping"}},
		{"not a mapping", "- domain\n",
			[]string{"want a policy: a mapping with at least domain and rules, got a list"}},
		{"empty", "  \n# nothing\n",
			[]string{"the policy is empty; write a mapping with at least domain and rules"}},
		{"null document", "~\n",
			[]string{"want a policy: a mapping with at least domain and rules, got nothing (null)"}},
		{"YAML syntax", "domain: d\nrules: [\n",
			[]string{"invalid YAML: did not find expected node content"}},
		{"YAML tab", "domain: d\n\trules: []\n",
			[]string{"invalid YAML: found a tab character that violates indentation"}},
		{"JSON syntax", "{\n\t\"domain\": \"d\",\n\t\"rules\": [{\"name\": \"r\" \"limits\": []}]\n}\n",
			[]string{`invalid JSON at column 25: invalid character '"' after object key:value pair`}},
		{"JSON wrong types", `{"domain": "d", "shard_by": 7, "rules": [{"name": "r", "match": {"api_key": "*"}, "shadow": "true", "limits": [{"algorithm": "gcra", "rate": "1/s", "burst": "2"}]}]}`,
			[]string{
				`shard_by: "7": no rule matches on this attribute; match on it in a rule or remove shard_by`,
				`rules[0].shadow: want true or false, got the string "true"; remove the quotes`,
				`rules[0].limits[0].burst: want a whole number, got the string "2"; remove the quotes`,
			}},
		{"two documents", "domain: d\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n---\ndomain: e\n",
			[]string{"the policy must be one YAML document; remove the '---' separator and what follows it"}},
		{"too large", "domain: d\n#" + strings.Repeat("x", policy.MaxSize),
			[]string{"the policy is 1048587 bytes; it must be at most 1048576 bytes (1 MiB)"}},
		{"merge of a scalar", "domain: d\nrules: [{name: r, limits: [{<<: 5, algorithm: gcra, rate: 1/s}]}]\n",
			[]string{"rules[0].limits[0].<<: want a mapping (or a list of mappings) to merge, got the number 5"}},
		{"long values are shortened", "domain: d\nrules: [{name: r, limits: [{algorithm: gcra, rate: " + strings.Repeat("9", 100) + "/s}]}]\n",
			[]string{`rules[0].limits[0].rate: "` + strings.Repeat("9", 64) + `"…: count "` + strings.Repeat("9", 100) + `" is not a whole number`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := policy.Parse([]byte(tt.in))
			if got := problems(err); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse(%.60q) problems =\n\t%s\nwant\n\t%s", tt.in, strings.Join(got, "\n\t"), strings.Join(tt.want, "\n\t"))
			}
			if p != nil {
				t.Errorf("Parse(%.60q) = %v, %v; want a nil policy with the error", tt.in, p, err)
			}
		})
	}
}

func TestValidationErrorMessage(t *testing.T) {
	t.Parallel()
	in := "domain: d\nrules:\n- {name: a, limits: [{algorithm: gcra, rate: 1/x}]}\n- {name: a, limits: [{algorithm: gcra, rate: 1/s, colour: red}]}\n"
	_, err := policy.Parse([]byte(in))
	want := `policy: 3 problems:
	rules[0].limits[0].rate: "1/x": unknown unit "x"; use ms, s, min, h, day, week or month (line 3)
	rules[1].name: "a" is used by rules[0]; rule names must be unique (line 4)
	rules[1].limits[0].colour: unknown field; known fields: algorithm, rate, burst, bucket, record, calendar, lease, replicas, counter (line 4)`
	if err == nil || err.Error() != want {
		t.Errorf("Parse().Error() = %v, want %s", err, want)
	}

	_, err = policy.Parse([]byte("domain: d\nrules: []\n"))
	if want := "policy: rules: the policy has no rules; add at least one (line 2)"; err == nil || err.Error() != want {
		t.Errorf("Parse().Error() = %v, want %s", err, want)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("domain: d\nrules: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big.yaml")
	if err := os.WriteFile(big, make([]byte, policy.MaxSize+10), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path string
		want string
	}{
		{bad, "policy: " + bad + ": rules: the policy has no rules; add at least one (line 2)"},
		{big, "policy: " + big + ": the policy is larger than 1048576 bytes (1 MiB); make it smaller"},
		{filepath.Join(dir, "missing.yaml"), "policy: load: open " + filepath.Join(dir, "missing.yaml") + ": no such file or directory"},
	}
	for _, tt := range tests {
		p, err := policy.Load(tt.path)
		if p != nil || err == nil || err.Error() != tt.want {
			t.Errorf("Load(%q) = %v, %v, want nil, %s", tt.path, p, err, tt.want)
		}
	}
}

// TestProblemLimit checks that a policy with very many problems reports a bounded
// number of them.
func TestProblemLimit(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\nrules:\n")
	for range 1500 {
		b.WriteString("- {name: r, limits: [{algorithm: gcra, rate: 1/s}]}\n")
	}
	_, err := policy.Parse([]byte(b.String()))
	got := problems(err)
	if len(got) != 101 || got[100] != "1399 more problems not shown; fix these first" {
		t.Errorf("Parse(1500 rules named r) = %d problems, last %q; want 101, the last saying 1399 more", len(got), got[len(got)-1])
	}
}

func mustFail(t *testing.T, in string) error {
	t.Helper()
	p, err := policy.Parse([]byte(in))
	if err == nil {
		t.Fatalf("Parse(%.60q) = %v, nil; want an error", in, p)
	}
	return err
}

// TestAliasExpansion checks that aliases cannot make a small policy expensive.
func TestAliasExpansion(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\nrules:\n- &r {name: r, limits: &l [")
	for i := range 2000 {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("{algorithm: gcra, rate: 1/s}")
	}
	b.WriteString("]}\n")
	for range 2000 {
		b.WriteString("- *r\n")
	}
	start := time.Now()
	_, err := policy.Parse([]byte(b.String()))
	if err == nil || !strings.Contains(err.Error(), "the policy expands to more than 1000000 values through aliases") {
		t.Errorf("Parse(alias bomb) = %v, want the expansion problem", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Parse(alias bomb) took %s", d)
	}

	// Billion laughs.
	laughs := "domain: d\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n"
	for i := 1; i < 10; i++ {
		laughs += fmt.Sprintf("a%d: &a%d [*a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d, *a%d]\n", i, i, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1, i-1)
	}
	laughs += "rules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n"
	if got, want := problems(mustFail(t, laughs)), []string{"the policy expands to more than 1000000 values through aliases; write it out with fewer aliases"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Parse(billion laughs) problems = %q, want %q", got, want)
	}

	// A merge key that refers to its own mapping.
	if got, want := problems(mustFail(t, "domain: d\nrules:\n- &r {name: r, <<: *r, limits: [{algorithm: gcra, rate: 1/s}]}\n")),
		[]string{"the alias *r refers to a value that contains it; remove the cycle"}; !reflect.DeepEqual(got, want) {
		t.Errorf("Parse(self merge) problems = %q, want %q", got, want)
	}
}

// TestMeterLease parses leased limits beside a bucket_ring (whose limits form one
// meter) and checks that each meter gets its own limit's lease.
func TestMeterLease(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse([]byte(rule(
		"{algorithm: bucket_ring, rate: 10/s}",
		"{algorithm: gcra, rate: 100/s, lease: {units: 10, for: 100ms}}",
		"{algorithm: bucket_ring, rate: 50/10s}",
		"{algorithm: fixed_window, rate: 1000/min}",
		"{algorithm: sliding_window, rate: 1000/min, lease: {units: 20, for: 1s}}",
	)))
	if err != nil {
		t.Fatal(err)
	}
	r := p.Rules[0]
	want := []policy.Lease{{}, {Units: 10, For: 100 * time.Millisecond}, {}, {Units: 20, For: time.Second}}
	if len(r.Meters) != len(want) {
		t.Fatalf("%d meters, want %d", len(r.Meters), len(want))
	}
	for i, w := range want {
		if got := r.Meters[i].Lease; got != w {
			t.Errorf("Meters[%d].Lease = %+v, want %+v (meter %v)", i, got, w, r.Meters[i].Meter.Limits)
		}
	}
	if !p.Leasing() {
		t.Error("Leasing() = false, want true")
	}
	plain, err := policy.Parse([]byte(rule("{algorithm: gcra, rate: 100/s}")))
	if err != nil {
		t.Fatal(err)
	}
	if l := plain.Rules[0].Limits[0]; plain.Leasing() || l.Lease != (policy.Lease{}) {
		t.Errorf("a policy without leases: Leasing() = %v, Limits[0].Lease = %+v; want false, none", plain.Leasing(), l.Lease)
	}
}

// TestMeterReplicas parses limits that ask for replicas beside a bucket_ring (whose
// limits form one meter, which asks for the most any of them asks) and one that asks
// for none.
func TestMeterReplicas(t *testing.T) {
	t.Parallel()
	p, err := policy.Parse([]byte(`domain: d
rules:
  - name: r
    limits:
      - {algorithm: bucket_ring, rate: 10/s, replicas: {count: 1, timeout: 20ms}}
      - {algorithm: gcra, rate: 5/s}
      - {algorithm: bucket_ring, rate: 50/10s, replicas: {count: 2, timeout: 5ms}}
      - {algorithm: fixed_window, rate: 5/s, replicas: {count: 1, timeout: 5ms}}
`))
	if err != nil {
		t.Fatal(err)
	}
	want := []algo.Replicas{{Count: 2, Timeout: 20 * time.Millisecond}, {}, {Count: 1, Timeout: 5 * time.Millisecond}}
	r := p.Rules[0]
	if len(r.Meters) != len(want) {
		t.Fatalf("Parse() = %d meters, want %d", len(r.Meters), len(want))
	}
	for i, w := range want {
		if got := r.Meters[i].Meter.Replicas; got != w {
			t.Errorf("Meters[%d].Replicas = %+v, want %+v (meter %v)", i, got, w, r.Meters[i].Meter.Limits)
		}
	}
	plain, err := policy.Parse([]byte("domain: d\nrules: [{name: r, limits: [{algorithm: gcra, rate: 1/s}]}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := plain.Rules[0].Limits[0].Replicas; got != (algo.Replicas{}) {
		t.Errorf("a policy without replicas: Limits[0].Replicas = %+v, want none", got)
	}
}
