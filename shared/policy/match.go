package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// A Match is one rule that applies to a request, with the meters the request must
// pass under it.
type Match struct {
	Rule *Rule
	// Meters holds one entry per meter of the rule, in the order of Rule.Meters.
	Meters []MatchedMeter
	// Identity is the escaped values of every attribute the rule matches on, sorted by
	// attribute name and joined with ':' — who the keys belong to, for logs. It is
	// empty for a rule that matches every request.
	Identity string
}

// A MatchedMeter is one meter a request must pass under a matched rule.
type MatchedMeter struct {
	// Key is the meter's store key (see Policy.Match).
	Key string
	// Meter is the rule's meter with Record filled from the request. Its Limits are
	// the rule's and must not be modified (Scale returns a copy).
	Meter algo.Meter
	// Lease is the meter's lease (RuleMeter.Lease); the zero Lease for none.
	Lease Lease
}

// compile fills the rule's derived fields: the sorted match attributes, whether it is
// sharded, and its meters.
func (r *Rule) compile(shardBy string) {
	r.attrs = make([]string, 0, len(r.Match))
	for a := range r.Match {
		r.attrs = append(r.attrs, a)
	}
	slices.Sort(r.attrs)
	_, r.sharded = r.Match[shardBy]
	r.sharded = r.sharded && shardBy != ""

	ring := -1
	for _, l := range r.Limits {
		if l.Algorithm == algo.BucketRing {
			// A ring neither leases nor records: its meter keeps the zero Lease and "".
			if ring < 0 {
				ring = len(r.Meters)
				r.Meters = append(r.Meters, RuleMeter{Meter: algo.Meter{Shadow: r.Shadow}})
			}
			m := &r.Meters[ring].Meter
			m.Limits = append(m.Limits, l.Limit)
			m.Replicas.Count = max(m.Replicas.Count, l.Replicas.Count)
			m.Replicas.Timeout = max(m.Replicas.Timeout, l.Replicas.Timeout)
			continue
		}
		r.Meters = append(r.Meters, RuleMeter{
			Meter:   algo.Meter{Limits: []algo.Limit{l.Limit}, Shadow: r.Shadow, Replicas: l.Replicas},
			Lease:   l.Lease,
			Record:  l.Record,
			Counter: l.Counter,
		})
	}
	r.nameMeters()
}

// applies reports whether every attribute the rule names is present in attrs with
// the value the rule wants ("*": any value). An attribute named skip is taken as
// present with the value the rule wants.
func (r *Rule) applies(attrs map[string]string, skip string) bool {
	return r.mismatch(attrs, skip) == ""
}

// mismatch returns the first attribute (in name order) that keeps the rule from
// applying to attrs, or "" when it applies; skip is as for applies.
func (r *Rule) mismatch(attrs map[string]string, skip string) string {
	for _, a := range r.attrs {
		if a == skip {
			continue
		}
		v, ok := attrs[a]
		if !ok {
			return a
		}
		if !r.Match[a].Matches(v) {
			return a
		}
	}
	return ""
}

// ReplacedBy returns the name of a rule that applies to attrs and replaces this
// one, or "".
func (r *Rule) ReplacedBy(attrs map[string]string) string {
	for _, by := range r.replacedBy {
		if by.applies(attrs, "") {
			return by.Name
		}
	}
	return ""
}

// WhyNot says why the rule does not apply to a request with attrs ("" when it
// does): the first attribute it names that the request lacks or has another value of.
func (r *Rule) WhyNot(attrs map[string]string) string {
	a := r.mismatch(attrs, "")
	if a == "" {
		return ""
	}
	want := strconv.Quote(r.Match[a].Text)
	if r.Match[a].any {
		want = "any value"
	}
	if v, ok := attrs[a]; ok {
		return fmt.Sprintf("%s is %q; the rule wants %s", a, v, want)
	}
	return fmt.Sprintf("no %s; the rule wants %s", a, want)
}

// in reports whether the rule takes part in deciding a request with attrs: it
// applies, and no rule that replaces it applies.
func (r *Rule) in(attrs map[string]string) bool {
	if !r.applies(attrs, "") {
		return false
	}
	for _, by := range r.replacedBy {
		if by.applies(attrs, "") {
			return false
		}
	}
	return true
}

// Match returns, in rule order, every rule that applies to a request with the given
// attributes, with the meters to decide and their keys. A rule applies when each attribute
// it names is present in attrs and its Matcher matches the value, and no rule that
// replaces it applies.
//
// Keys follow algo.Key. For a rule that matches on the policy's ShardBy attribute, the
// hash tag is that attribute's escaped value and the identity the escaped values of the
// rule's other attributes, sorted by name and joined with ':'; all such keys of one
// client share one Redis Cluster slot. For any other rule the hash tag is the rule's
// name, ':' and the escaped values of all its attributes, and the identity is empty.
// A value is the request's own for "*", and the matcher's text for every other
// matcher (Matcher.keyValue).
//
// Match returns nil if no rule applies.
func (p *Policy) Match(attrs map[string]string) []Match { return p.AppendMatch(nil, attrs) }

// AppendMatch appends what Match returns to dst and returns the extended slice. It
// counts before it allocates, and builds short identities without a builder, for the
// allocation bounds TestMatchAllocations keeps (BenchmarkMatch, run by make test's
// bench-core, shows the cost).
func (p *Policy) AppendMatch(dst []Match, attrs map[string]string) []Match {
	// in marks which of the first 64 rules take part, so that the second loop asks
	// only the rules after them again.
	n, nmeters, in := 0, 0, uint64(0)
	for ri, r := range p.Rules {
		if r.in(attrs) {
			n++
			nmeters += len(r.Meters)
			in |= 1 << ri // 0 from the 65th rule on
		}
	}
	if n == 0 {
		return dst
	}
	out := dst
	if cap(out)-len(out) < n {
		out = make([]Match, len(dst), len(dst)+n)
		copy(out, dst)
	}
	meters := make([]MatchedMeter, nmeters)
	var buf [8]string
	for ri, r := range p.Rules {
		if ri < 64 && in&(1<<ri) == 0 || ri >= 64 && !r.in(attrs) {
			continue
		}
		esc := buf[:0]
		shard := -1
		for i, a := range r.attrs {
			esc = append(esc, r.Match[a].keyValue(attrs[a]))
			if r.sharded && a == p.ShardBy {
				shard = i
			}
		}
		m := Match{Rule: r, Identity: joinSkip(esc, -1)}
		tag, identity := r.Name+":"+m.Identity, ""
		if shard >= 0 {
			tag, identity = esc[shard], joinSkip(esc, shard)
		}
		k := len(r.Meters)
		m.Meters, meters = meters[:k:k], meters[k:]
		for i, rm := range r.Meters {
			mm := &m.Meters[i]
			if rm.Counter != "" {
				mm.Key = r.counterKey(p, i, func(a string) string { return r.Match[a].keyValue(attrs[a]) })
			} else {
				mm.Key = algo.Key(p.Prefix, tag, r.Name, identity, rm.ID)
			}
			mm.Meter, mm.Lease = rm.Meter, rm.Lease
			if rm.Record != "" {
				mm.Meter.Record = attrs[rm.Record]
			}
		}
		out = append(out, m)
	}
	return out
}

// QuotaName names limit l of the rule in the RateLimit headers: the rule's name, and
// for a rule of several limits ".1", ".2", … by the limit's place in the rule.
func (r *Rule) QuotaName(l algo.Limit) string {
	if len(r.Limits) < 2 {
		return r.Name
	}
	i := slices.IndexFunc(r.Limits, func(rl RuleLimit) bool { return rl.Limit == l })
	return r.Name + "." + strconv.Itoa(i+1)
}

// APIKey is the attribute that carries a request's API key (or its token's hash):
// the identity a front door may require of a request (KeyRequired).
const APIKey = "api_key"

// KeyRequired reports whether a request with attrs, which matched matches, needs an
// API key to be limited: no non-shadow rule limits it as it is, and some non-shadow
// rule that matches on APIKey would if it carried a key the rule accepts. A request
// that a non-shadow rule limits without a key (POST /login by client address) does
// not need one, nor does one that no rule could limit, key or not. Shadow rules never
// deny, so they neither limit a request nor require its identity.
func (p *Policy) KeyRequired(attrs map[string]string, matches []Match) bool {
	if _, ok := attrs[APIKey]; ok {
		return false
	}
	for _, m := range matches {
		if !m.Rule.Shadow {
			return false
		}
	}
	for _, r := range p.Rules {
		if _, keyed := r.Match[APIKey]; keyed && !r.Shadow && r.applies(attrs, APIKey) {
			return true
		}
	}
	return false
}

// joinSkip joins the values of vs, except the one at index skip, with ':'.
func joinSkip(vs []string, skip int) string {
	switch {
	case len(vs) == 0, len(vs) == 1 && skip == 0:
		return ""
	case len(vs) == 1:
		return vs[0]
	case len(vs) == 2 && skip >= 0:
		return vs[1-skip]
	}
	var b strings.Builder
	for i, v := range vs {
		if i == skip {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(':')
		}
		b.WriteString(v)
	}
	return b.String()
}

// Scale returns m with the count and burst of each limit divided by n, rounded down
// and at least 1: the share of one of n instances that decide in process (failure
// mode local). The limits of the result are a copy; m is not modified. An n below 2
// returns m as it is.
func Scale(m algo.Meter, n int) algo.Meter {
	if n < 2 {
		return m
	}
	limits := make([]algo.Limit, len(m.Limits))
	for i, l := range m.Limits {
		l.Count = max(1, l.Count/int64(n))
		if l.Burst > 0 {
			l.Burst = max(1, l.Burst/int64(n))
		}
		limits[i] = l
	}
	m.Limits = limits
	return m
}
