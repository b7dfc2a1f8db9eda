package policy

// Continuity: what keeps a limit's state in the store when a policy changes, and
// when a client moves between rules.
//
// A meter's key names its rule, the values the rule keys by, and algo.MeterID: the
// meter's algorithm, period, bucket and calendar (and for gcra and leaky_bucket its
// count), and its place among the rule's meters of the same kind. A new count or
// burst therefore keeps the key and the state; a new algorithm or period moves the
// limit to fresh keys. A limit may also name a counter (counter: NAME): the limits
// of every rule that names it keep one state per client, so that a key moving from
// a free rule to a pro one keeps its count. Fresh lists the limits a reload starts
// afresh.

import (
	"fmt"
	"slices"
	"strings"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// counterMark starts the rule part of a counter's keys: no rule name starts with it,
// so a counter's keys never meet a rule's.
const counterMark = "@"

// nameMeters fills the ID of each of the rule's meters. A meter's place in its name is its place among the rule's
// meters whose state means the same (the same algo.MeterID at place 0), so adding a
// limit of another kind to a rule keeps every other limit's key.
func (r *Rule) nameMeters() {
	seen := map[string]int{}
	for i := range r.Meters {
		m := &r.Meters[i]
		kind := algo.MeterID(0, m.Meter)
		m.ID = algo.MeterID(seen[kind], m.Meter)
		seen[kind]++
	}
}

// limitMeters returns, per limit of the rule, the index of its meter in Meters (as
// compile builds them: the ring limits share the first ring limit's meter).
func (r *Rule) limitMeters() []int {
	out := make([]int, len(r.Limits))
	ring, n := -1, 0
	for j, l := range r.Limits {
		if l.Algorithm == algo.BucketRing {
			if ring < 0 {
				ring, n = n, n+1
			}
			out[j] = ring
			continue
		}
		out[j], n = n, n+1
	}
	return out
}

// counterKey returns the key of the rule's meter i, which names a counter, for a
// request whose escaped key value of attribute a is value(a). The key holds the
// counter's name in place of the rule's and only the values of the attributes the
// rule keeps a limit per value of ("*", {each: …}), which every rule sharing the
// counter has alike (checkCounters); the values a rule matches as written (plan:
// pro) tell rules apart, not clients, and stay out. When the policy's shard_by is
// one of them, its value is the hash tag, as for the rule's other keys.
func (r *Rule) counterKey(p *Policy, i int, value func(a string) string) string {
	name := counterMark + r.Meters[i].Counter
	var tag string
	var ids []string
	for _, a := range r.attrs {
		if !r.Match[a].perValue() {
			continue
		}
		v := value(a)
		if a == p.ShardBy && tag == "" {
			tag = v
			continue
		}
		ids = append(ids, v)
	}
	identity := strings.Join(ids, ":")
	if tag == "" {
		tag, identity = name+":"+identity, ""
	}
	return algo.Key(p.Prefix, tag, name, identity, r.Meters[i].ID)
}

// perValue reports whether the matcher keeps a limit per distinct value.
func (m *Matcher) perValue() bool { return m.any || m.each }

// keyAttrs returns, sorted, the attributes the rule keeps a limit per value of.
func (r *Rule) keyAttrs() []string {
	var out []string
	for _, a := range r.attrs {
		if r.Match[a].perValue() {
			out = append(out, a)
		}
	}
	return out
}

// keyShapes returns the key of each of the rule's meters with every value a
// client's request fills in (the attributes the rule keys per value of) left as a
// placeholder: two meters with one shape read one state.
func (r *Rule) keyShapes(p *Policy) []string {
	const placeholder = "\x00" // no escaped value holds it
	value := func(a string) string {
		if r.Match[a].perValue() {
			return placeholder
		}
		return r.Match[a].keyValue("")
	}
	esc := make([]string, len(r.attrs))
	shard := -1
	for i, a := range r.attrs {
		esc[i] = value(a)
		if r.sharded && a == p.ShardBy {
			shard = i
		}
	}
	tag, identity := r.Name+":"+joinSkip(esc, -1), ""
	if shard >= 0 {
		tag, identity = esc[shard], joinSkip(esc, shard)
	}
	out := make([]string, len(r.Meters))
	for i := range r.Meters {
		if r.Meters[i].Counter != "" {
			out[i] = r.counterKey(p, i, value)
		} else {
			out[i] = algo.Key(p.Prefix, tag, r.Name, identity, r.Meters[i].ID)
		}
	}
	return out
}

// Fresh returns the path of every limit of next (rules[i].limits[j], as a Problem
// names it) whose state in the store does not carry over from prev: a limit whose
// keys next writes under names prev did not. That is a new rule's limits, and a
// limit whose algorithm, period, bucket or calendar changed (or, for gcra and
// leaky_bucket, whose count changed), whose rule was renamed or keys by other
// attributes, or that moved into or out of a counter; also every limit when the
// prefix changes, and a rule's limits when shard_by starts or stops naming one of
// its attributes. A limit whose count or burst alone changed carries its state
// over and is not listed. A bucket_ring's limits share one key: all or none of them
// are listed. Fresh returns nil when prev is nil (no policy to compare with).
//
// Fresh compares the keys as the policy writes them: a change of identity (the
// addresses of IPv6 clients under another ipv6_prefix) is not seen.
func Fresh(prev, next *Policy) []string {
	if prev == nil || next == nil {
		return nil
	}
	old := map[string]bool{}
	for _, r := range prev.Rules {
		for _, k := range r.keyShapes(prev) {
			old[k] = true
		}
	}
	var out []string
	for i, r := range next.Rules {
		if len(r.Meters) == 0 {
			continue
		}
		shapes := r.keyShapes(next)
		for j, m := range r.limitMeters() {
			if !old[shapes[m]] {
				out = append(out, fmt.Sprintf("rules[%d].limits[%d]", i, j))
			}
		}
	}
	return out
}

// A counterUse is one limit's counter field, kept for checkCounters.
type counterUse struct {
	name  string
	rule  *Rule
	limit int
	path  string // of the limit
	node  *yaml.Node
}

// counter decodes the counter field of limit j of rule r (at rulePath), whose
// fields are lf and which decoded as l, and returns its name, or "".
func (d *decoder) counter(lf *fields, l algo.Limit, r *Rule, rulePath string, j int) string {
	n := lf.get("counter")
	if n == nil {
		return ""
	}
	at := lf.at("counter")
	s, ok := d.str(n, at, "a counter name")
	if !ok {
		return ""
	}
	switch {
	case !ValidName(s):
		d.addf(n, at, "%s: %s", quote(s), nameRule)
	case l.Algorithm == algo.BucketRing:
		d.add(n, at, "a rule's bucket_ring limits share one key of their own; remove counter, or use another algorithm")
	case lf.get("lease") != nil:
		d.add(n, at, "a limit that shares a counter cannot lease (each rule would reserve from the one state under its own limit); remove lease or counter")
	default:
		d.counters = append(d.counters, counterUse{s, r, j, fmt.Sprintf("%s.limits[%d]", rulePath, j), n})
		return s
	}
	return ""
}

// checkCounters checks that the limits that share a counter can: one per rule, the
// same kind of state (algorithm, period, bucket and calendar; for gcra and
// leaky_bucket the count), rules that keep a limit per value of the same attributes,
// and rules that never apply to the same request (the request would charge one
// state twice). Each limit is checked against the first that names its counter.
func (d *decoder) checkCounters(p *Policy) {
	first := map[string]counterUse{}
	for _, u := range d.counters {
		if len(u.rule.Meters) == 0 || u.limit >= len(u.rule.Limits) {
			continue // the rule has problems of its own
		}
		f, ok := first[u.name]
		if !ok {
			first[u.name] = u
			continue
		}
		at := u.path + ".counter"
		l, fl := u.rule.Limits[u.limit].Limit, f.rule.Limits[f.limit].Limit
		fa, ua := f.rule.keyAttrs(), u.rule.keyAttrs()
		switch {
		case f.rule == u.rule:
			d.addf(u.node, at, "%s is named by %s too; the limits of one rule cannot share a counter: give them different counters", quote(u.name), f.path)
		case algo.MeterID(0, algo.Meter{Limits: []algo.Limit{l}}) != algo.MeterID(0, algo.Meter{Limits: []algo.Limit{fl}}):
			same := "the same algorithm and period"
			if fl.Algorithm == algo.GCRA || fl.Algorithm == algo.LeakyBucket {
				same = "the same algorithm, period and count (a " + string(fl.Algorithm) + "'s state is counted in period/count)"
			}
			d.addf(u.node, at, "%s is shared with %s (%v), and a counter keeps one state: use %s as there (only the count and burst may differ), or another counter name", quote(u.name), f.path, fl, same)
		case !slices.Equal(fa, ua):
			d.addf(u.node, at, "%s is shared with %s, whose rule keeps a limit per value of [%s], and this rule of [%s]: match the same attributes with \"*\" or {each: …} in both rules, or use another counter name", quote(u.name), f.path, strings.Join(fa, ", "), strings.Join(ua, ", "))
		case !exclusive(f.rule, u.rule):
			d.addf(u.node, at, "%s is shared with %s, whose rule may apply to the same requests as this one, which would charge one state twice: make the rules exclusive (match one attribute with different values in each, e.g. plan: free and plan: pro, or let one replace the other), or use another counter name", quote(u.name), f.path)
		}
	}
}

// exclusive reports whether rules a and b never both take part in one request: one
// replaces the other, or both match one attribute with exact values (or lists of
// them) that have none in common.
func exclusive(a, b *Rule) bool {
	if slices.Contains(a.Replaces, b.Name) || slices.Contains(b.Replaces, a.Name) {
		return true
	}
	for attr, ma := range a.Match {
		mb, ok := b.Match[attr]
		if !ok || !ma.exactOnly() || !mb.exactOnly() {
			continue
		}
		if !slices.ContainsFunc(ma.exact, func(v string) bool { return slices.Contains(mb.exact, v) }) {
			return true
		}
	}
	return false
}

// exactOnly reports whether the matcher matches exactly its values and nothing else.
func (m *Matcher) exactOnly() bool {
	return len(m.exact) > 0 && !m.any && !m.not && !m.each && len(m.prefixes) == 0 && len(m.segments) == 0 && m.re == nil
}
