package policy_test

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/policy"
)

// keysOf returns every key Match gives a request with attrs.
func keysOf(p *policy.Policy, attrs map[string]string) []string {
	var keys []string
	for _, m := range p.Match(attrs) {
		for _, mm := range m.Meters {
			keys = append(keys, mm.Key)
		}
	}
	return keys
}

// TestFresh checks which limits a reload starts afresh: those whose state means
// something else under the new policy, never those whose count or burst alone
// changed; and that Fresh agrees with the keys Match writes: a limit it does not
// list keeps the key the old policy gave the same request.
func TestFresh(t *testing.T) {
	t.Parallel()
	const head = "domain: d\nrules:\n"
	per := func(limits string) string {
		return head + "  - {name: per-key, match: {api_key: \"*\"}, limits: [" + limits + "]}\n"
	}
	plans := func(free, pro string) string {
		return head + "  - {name: free, match: {api_key: \"*\", plan: free}, limits: [" + free + "]}\n" +
			"  - {name: pro, match: {api_key: \"*\", plan: pro}, limits: [" + pro + "]}\n"
	}
	tests := []struct {
		name       string
		prev, next string
		attrs      map[string]string // a request both policies limit
		want       []string
	}{
		{"nothing changes", per("{algorithm: gcra, rate: 10/s}"), per("{algorithm: gcra, rate: 10/s}"), nil, nil},
		{"a monthly quota raised", per("{algorithm: fixed_window, rate: 10000/month}"), per("{algorithm: fixed_window, rate: 12000/month}"), nil, nil},
		{"a calendar quota raised", per("{algorithm: fixed_window, rate: 10000/month, calendar: {timezone: Europe/Berlin}}"), per("{algorithm: fixed_window, rate: 12000/month, calendar: {timezone: Europe/Berlin}}"), nil, nil},
		{"a per-minute limit raised", per("{algorithm: fixed_window, rate: 2/min}"), per("{algorithm: fixed_window, rate: 5/min}"), nil, nil},
		{"counts of every counting algorithm lowered",
			per("{algorithm: sliding_log, rate: 50/min}, {algorithm: sliding_window, rate: 50/min}, {algorithm: token_bucket, rate: 50/min, burst: 80}, {algorithm: bucket_ring, rate: 50/s}, {algorithm: bucket_ring, rate: 500/min}"),
			per("{algorithm: sliding_log, rate: 5/min}, {algorithm: sliding_window, rate: 5/min}, {algorithm: token_bucket, rate: 5/min, burst: 8}, {algorithm: bucket_ring, rate: 5/s}, {algorithm: bucket_ring, rate: 50/min}"), nil, nil},
		{"a gcra's burst changes", per("{algorithm: gcra, rate: 10/s, burst: 20}, {algorithm: leaky_bucket, rate: 10/s}"), per("{algorithm: gcra, rate: 10/s, burst: 50}, {algorithm: leaky_bucket, rate: 10/s, burst: 3}"), nil, nil},
		{"a gcra's count changes", per("{algorithm: gcra, rate: 10/s}, {algorithm: leaky_bucket, rate: 10/s}"), per("{algorithm: gcra, rate: 20/s}, {algorithm: leaky_bucket, rate: 5/s}"), nil,
			[]string{"rules[0].limits[0]", "rules[0].limits[1]"}},
		{"a period changes", per("{algorithm: fixed_window, rate: 2/min}, {algorithm: token_bucket, rate: 5/s}"), per("{algorithm: fixed_window, rate: 2/h}, {algorithm: token_bucket, rate: 5/s}"), nil,
			[]string{"rules[0].limits[0]"}},
		{"an algorithm changes", per("{algorithm: fixed_window, rate: 2/min}"), per("{algorithm: sliding_window, rate: 2/min}"), nil, []string{"rules[0].limits[0]"}},
		{"a ring gains a window", per("{algorithm: bucket_ring, rate: 5/s}, {algorithm: gcra, rate: 1/s}"), per("{algorithm: bucket_ring, rate: 5/s}, {algorithm: gcra, rate: 1/s}, {algorithm: bucket_ring, rate: 50/min}"), nil,
			[]string{"rules[0].limits[0]", "rules[0].limits[2]"}},
		{"a limit of another kind added in front", per("{algorithm: gcra, rate: 10/s}"), per("{algorithm: fixed_window, rate: 1000/day}, {algorithm: gcra, rate: 10/s}"), nil,
			[]string{"rules[0].limits[0]"}},
		{"a rule renamed and a rule added", per("{algorithm: gcra, rate: 10/s}"),
			head + "  - {name: per-client, match: {api_key: \"*\"}, limits: [{algorithm: gcra, rate: 10/s}]}\n  - {name: login, match: {path: /login}, limits: [{algorithm: gcra, rate: 1/s}]}\n",
			map[string]string{"path": "/x"}, []string{"rules[0].limits[0]", "rules[1].limits[0]"}},
		{"the prefix changes", per("{algorithm: gcra, rate: 10/s}"), "prefix: \"x:\"\n" + per("{algorithm: gcra, rate: 10/s}"), nil, []string{"rules[0].limits[0]"}},
		{"shard_by starts naming the rule's attribute", per("{algorithm: gcra, rate: 10/s}"), "shard_by: api_key\n" + per("{algorithm: gcra, rate: 10/s}"), nil, []string{"rules[0].limits[0]"}},
		{"a limit moves into a counter", plans("{algorithm: fixed_window, rate: 100/day}", "{algorithm: fixed_window, rate: 1000/day}"),
			plans("{algorithm: fixed_window, rate: 100/day, counter: daily}", "{algorithm: fixed_window, rate: 1000/day}"), map[string]string{"plan": "free"}, []string{"rules[0].limits[0]"}},
		{"a shared counter raised", plans("{algorithm: fixed_window, rate: 100/day, counter: daily}", "{algorithm: fixed_window, rate: 1000/day, counter: daily}"),
			plans("{algorithm: fixed_window, rate: 200/day, counter: daily}", "{algorithm: fixed_window, rate: 2000/day, counter: daily}"), map[string]string{"plan": "pro"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			prev, next := mustParse(t, tt.prev), mustParse(t, tt.next)
			if got := policy.Fresh(prev, next); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Fresh() = %q, want %q", got, tt.want)
			}
			attrs := map[string]string{"api_key": "k1"}
			for a, v := range tt.attrs {
				attrs[a] = v
			}
			oldKeys, newKeys := keysOf(prev, attrs), keysOf(next, attrs)
			kept := 0
			for _, k := range newKeys {
				if slices.Contains(oldKeys, k) {
					kept++
				}
			}
			if fresh := len(newKeys) - kept; (fresh == 0) != (len(tt.want) == 0) {
				t.Errorf("Match(%v) writes %d keys the old policy did not (%q, before %q); Fresh() = %q", attrs, fresh, newKeys, oldKeys, tt.want)
			}
		})
	}
	if got := policy.Fresh(nil, mustParse(t, per("{algorithm: gcra, rate: 10/s}"))); got != nil {
		t.Errorf("Fresh(nil, …) = %q, want nil", got)
	}
}

// TestCounterSharesState checks that limits of two plans' rules that name one
// counter get one key per client, whichever rule applies, and that their other
// limits, and other clients, keep keys of their own.
func TestCounterSharesState(t *testing.T) {
	t.Parallel()
	for _, shard := range []string{"", "shard_by: api_key\n"} {
		p := mustParse(t, shard+`domain: d
rules:
  - name: free
    match: {api_key: "*", plan: free}
    limits: [{algorithm: fixed_window, rate: 10000/month, counter: monthly}, {algorithm: gcra, rate: 10/s}]
  - name: pro
    match: {api_key: "*", plan: pro}
    limits: [{algorithm: gcra, rate: 100/s}, {algorithm: fixed_window, rate: 100000/month, counter: monthly}]
`)
		free := keysOf(p, map[string]string{"api_key": "k1", "plan": "free"})
		pro := keysOf(p, map[string]string{"api_key": "k1", "plan": "pro"})
		other := keysOf(p, map[string]string{"api_key": "k2", "plan": "pro"})
		if len(free) != 2 || len(pro) != 2 || free[0] != pro[1] {
			t.Fatalf("%skeys of k1 on free %q, on pro %q; want the monthly counter's key in both", shard, free, pro)
		}
		if free[1] == pro[0] || other[1] == pro[1] || !strings.Contains(free[0], "@monthly") {
			t.Errorf("%skeys of k1 on free %q, on pro %q, of k2 on pro %q; want one @monthly key per client and the gcra limits apart", shard, free, pro, other)
		}
		if shard != "" && !strings.HasPrefix(free[0], "tg:{k1}") {
			t.Errorf("%scounter key %s, want the hash tag {k1} of shard_by", shard, free[0])
		}
	}
}

// TestCounterValidation checks that limits sharing a counter must be able to:
// the same kind of state, rules keyed by the same attributes and never applying to
// one request together, one limit per rule, and no ring or lease.
func TestCounterValidation(t *testing.T) {
	t.Parallel()
	two := func(a, b string) string {
		return "domain: d\nrules:\n" +
			"  - {name: free, match: {api_key: \"*\", plan: free}, limits: [" + a + "]}\n" +
			"  - {name: pro, match: {api_key: \"*\", plan: [pro, team]}, limits: [" + b + "]}\n"
	}
	tests := []struct {
		name, in, want string
	}{
		{"another algorithm", two("{algorithm: fixed_window, rate: 10/min, counter: q}", "{algorithm: sliding_window, rate: 50/min, counter: q}"),
			`rules[1].limits[0].counter: "q" is shared with rules[0].limits[0] (fixed_window 10/min), and a counter keeps one state: use the same algorithm and period as there (only the count and burst may differ), or another counter name`},
		{"another period", two("{algorithm: fixed_window, rate: 10/month, counter: q}", "{algorithm: fixed_window, rate: 50/day, counter: q}"),
			`rules[1].limits[0].counter: "q" is shared with rules[0].limits[0] (fixed_window 10/month UTC), and a counter keeps one state: use the same algorithm and period as there (only the count and burst may differ), or another counter name`},
		{"a gcra's count", two("{algorithm: gcra, rate: 10/s, counter: q}", "{algorithm: gcra, rate: 50/s, counter: q}"),
			`rules[1].limits[0].counter: "q" is shared with rules[0].limits[0] (gcra 10/s), and a counter keeps one state: use the same algorithm, period and count (a gcra's state is counted in period/count) as there (only the count and burst may differ), or another counter name`},
		{"other attributes", "domain: d\nrules:\n  - {name: a, match: {api_key: \"*\", plan: free}, limits: [{algorithm: gcra, rate: 1/s, counter: q}]}\n  - {name: b, match: {user: \"*\", plan: pro}, limits: [{algorithm: gcra, rate: 1/s, counter: q}]}\n",
			`rules[1].limits[0].counter: "q" is shared with rules[0].limits[0], whose rule keeps a limit per value of [api_key], and this rule of [user]: match the same attributes with "*" or {each: …} in both rules, or use another counter name`},
		{"rules that overlap", "domain: d\nrules:\n  - {name: a, match: {api_key: \"*\"}, limits: [{algorithm: gcra, rate: 1/s, counter: q}]}\n  - {name: b, match: {api_key: \"*\", path: /x}, limits: [{algorithm: gcra, rate: 1/s, counter: q}]}\n",
			`rules[1].limits[0].counter: "q" is shared with rules[0].limits[0], whose rule may apply to the same requests as this one, which would charge one state twice: make the rules exclusive (match one attribute with different values in each, e.g. plan: free and plan: pro, or let one replace the other), or use another counter name`},
		{"one rule twice", "domain: d\nrules:\n  - {name: a, limits: [{algorithm: gcra, rate: 1/s, counter: q}, {algorithm: gcra, rate: 1/s, counter: q}]}\n",
			`rules[0].limits[1].counter: "q" is named by rules[0].limits[0] too; the limits of one rule cannot share a counter: give them different counters`},
		{"a ring", rule("{algorithm: bucket_ring, rate: 1/s, counter: q}"),
			`rules[0].limits[0].counter: a rule's bucket_ring limits share one key of their own; remove counter, or use another algorithm`},
		{"a lease", rule("{algorithm: gcra, rate: 100/s, lease: {units: 5, for: 10ms}, counter: q}"),
			`rules[0].limits[0].counter: a limit that shares a counter cannot lease (each rule would reserve from the one state under its own limit); remove lease or counter`},
		{"a bad name", rule("{algorithm: gcra, rate: 1/s, counter: Q!}"),
			`rules[0].limits[0].counter: "Q!": use 1 to 63 characters of a-z, 0-9, '_', '.' and '-', starting with a letter or digit`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := policy.Parse([]byte(tt.in))
			var ve *policy.ValidationError
			if !errors.As(err, &ve) || len(ve.Problems) != 1 || ve.Problems[0].Path+": "+ve.Problems[0].Msg != tt.want {
				t.Errorf("Parse() = %v, want %s", err, tt.want)
			}
		})
	}
	// Rules made exclusive by replaces may share a counter too.
	mustParse(t, "domain: d\nrules:\n  - {name: a, match: {api_key: \"*\"}, limits: [{algorithm: gcra, rate: 1/s, counter: q}]}\n  - {name: b, match: {api_key: \"*\", path: /x}, replaces: [a], limits: [{algorithm: gcra, rate: 1/s, burst: 5, counter: q}]}\n")
}
