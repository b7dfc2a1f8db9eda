package policy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
	// Calendar limits name IANA zones; the Lambda runtime has no zoneinfo of its own.
	_ "time/tzdata"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// The policy is decoded into a yaml.Node tree and walked by hand, rather than with
// yaml.v3's KnownFields, so that every unknown field and every wrong type is reported,
// not only the first, each with its path and line.

var (
	nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,62}$`)
	attrRE = regexp.MustCompile(`^[a-z0-9_.-]{1,64}$`)
	// sha256RE is a SHA-256 in hex, as sha256sum writes it.
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// plainKeyRE is the form of a field name written into a path without quotes.
	plainKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

const (
	nameRule = "use 1 to 63 characters of a-z, 0-9, '_', '.' and '-', starting with a letter or digit"
	attrRule = "use 1 to 64 characters of a-z, 0-9, '_', '.' and '-' (header attributes are named by their lower-case header name, e.g. x-tenant)"
)

// The fields each mapping may hold, in the order error messages list them.
var (
	topFields       = []string{"domain", "prefix", "shard_by", "failure", "identity", "deny_cache", "plans", "rules"}
	planFields      = []string{"attribute", "from", "default", "keys"}
	failureFields   = []string{"mode", "timeout", "expected_instances", "breaker"}
	breakerFields   = []string{"failures", "open_for"}
	identityFields  = []string{"trusted_proxies", "ipv6_prefix"}
	denyCacheFields = []string{"enabled", "max_entries"}
	ruleFields      = []string{"name", "match", "limits", "unlimited", "replaces", "shadow"}
	limitFields     = []string{"algorithm", "rate", "burst", "bucket", "record", "calendar", "lease", "replicas"}
	leaseFields     = []string{"units", "for"}     // lease: see Lease and decoder.lease
	replicasFields  = []string{"count", "timeout"} // replicas: see decoder.replicas
	calendarFields  = []string{"timezone"}
	eachFields      = []string{"each"}
)

const (
	// maxExpanded bounds the values of a document with every alias written out, so
	// that aliases cannot make a small document enormous ("billion laughs"). A
	// document of MaxSize bytes without aliases holds fewer.
	maxExpanded = 1000000
	// maxVisits bounds the nodes the walk visits, a second line behind maxExpanded.
	maxVisits = 4 * maxExpanded
	// maxMergeDepth bounds nested merge keys (<<), which may also form cycles.
	maxMergeDepth = 8
	// maxProblems bounds the problems reported; the rest are counted.
	maxProblems = 100
	// maxQuoted bounds a value quoted in a message.
	maxQuoted = 64
)

// decoder walks one document and collects its problems.
type decoder struct {
	problems []Problem
	cols     []int // the column of each problem, to sort those on one line
	total    int   // problems added, kept or not
	dropped  int   // problems beyond the 10*maxProblems kept while walking
	visits   int
	over     bool // maxVisits reached; the walk stops
}

func (d *decoder) add(n *yaml.Node, path, msg string) {
	line, col := 0, 0
	if n != nil {
		line, col = n.Line, n.Column
	}
	d.addAt(line, col, path, msg)
}

func (d *decoder) addLine(line int, path, msg string) {
	d.addAt(line, 0, path, msg)
}

func (d *decoder) addAt(line, col int, path, msg string) {
	d.total++
	if d.full() {
		d.dropped++
		return
	}
	d.problems = append(d.problems, Problem{Path: path, Msg: msg, Line: line})
	d.cols = append(d.cols, col)
}

func (d *decoder) addf(n *yaml.Node, path, format string, args ...any) {
	if d.full() {
		d.total++
		d.dropped++
		return
	}
	d.add(n, path, fmt.Sprintf(format, args...))
}

// full reports whether no more problems are kept, only counted.
func (d *decoder) full() bool { return len(d.problems) >= 10*maxProblems }

// result returns the problems in document order, at most maxProblems of them.
func (d *decoder) result() []Problem {
	idx := make([]int, len(d.problems))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		return cmp.Or(cmp.Compare(d.problems[a].Line, d.problems[b].Line), cmp.Compare(d.cols[a], d.cols[b]))
	})
	ps := make([]Problem, len(idx))
	for i, j := range idx {
		ps[i] = d.problems[j]
	}
	if more := len(ps) - maxProblems + d.dropped; more > 0 {
		ps = append(ps[:maxProblems:maxProblems], Problem{Msg: fmt.Sprintf("%d more problems not shown; fix these first", more)})
	}
	return ps
}

// node resolves aliases and counts the visit; it returns nil once the walk has
// visited too many nodes.
func (d *decoder) node(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	if d.over || n == nil || n.Kind == yaml.AliasNode {
		return nil
	}
	d.visits++
	if d.visits > maxVisits {
		d.over = true
		d.add(n, "", fmt.Sprintf("the policy needs more than %d steps to check; write it out with fewer aliases", maxVisits))
		return nil
	}
	return n
}

// parse decodes and validates the document. The returned policy is meaningful only
// when no problem was added.
func (d *decoder) parse(data []byte) *Policy {
	root := d.document(data)
	if root == nil {
		return nil
	}
	f := d.mapping(root, "", topFields, "a policy: a mapping with at least domain and rules")
	if f == nil {
		return nil
	}
	p := &Policy{
		Prefix: DefaultPrefix,
		Failure: Failure{
			Mode:              FailOpen,
			Timeout:           DefaultTimeout,
			ExpectedInstances: DefaultExpectedInstances,
			Breaker:           Breaker{Failures: DefaultBreakerFailures, OpenFor: DefaultBreakerOpenFor},
		},
		Identity:  Identity{IPv6Prefix: DefaultIPv6Prefix},
		DenyCache: DenyCache{Enabled: true, MaxEntries: DefaultDenyCacheEntries},
	}

	if n, ok := d.required(f, root, "", "domain", "name the policy, e.g. domain: public-api"); ok {
		if s, ok := d.str(n, "domain", "a domain name"); ok && !nameRE.MatchString(s) {
			d.addf(n, "domain", "%s: %s", quote(s), nameRule)
		}
		p.Domain = n.Value
	}
	if n := d.optional(f, "prefix"); n != nil {
		if s, ok := d.str(n, "prefix", "a key prefix"); ok {
			p.Prefix = s
			if msg := checkPrefix(s); msg != "" {
				d.addf(n, "prefix", "%s: %s", quote(s), msg)
			}
		}
	}
	var shardNode *yaml.Node
	if n := d.optional(f, "shard_by"); n != nil {
		if s, ok := d.str(n, "shard_by", "an attribute name"); ok {
			if attrRE.MatchString(s) {
				p.ShardBy, shardNode = s, n
			} else {
				d.addf(n, "shard_by", "%s: %s", quote(s), attrRule)
			}
		}
	}
	if n := d.optional(f, "failure"); n != nil {
		d.failure(n, "failure", &p.Failure)
	}
	if n := d.optional(f, "identity"); n != nil {
		d.identity(n, "identity", &p.Identity)
	}
	if n := d.optional(f, "deny_cache"); n != nil {
		d.denyCache(n, "deny_cache", &p.DenyCache)
	}
	if n := d.optional(f, "plans"); n != nil {
		p.Plans = d.plans(n, "plans")
	}
	if n, ok := d.required(f, root, "", "rules", "list the rules, each with a name, a match and limits"); ok {
		d.rules(n, "rules", p)
	}

	if shardNode != nil && len(p.Rules) > 0 {
		used := false
		for _, r := range p.Rules {
			if _, ok := r.Match[p.ShardBy]; ok {
				used = true
				break
			}
		}
		if !used {
			d.addf(shardNode, "shard_by", "%s: no rule matches on this attribute; match on it in a rule or remove shard_by", quote(p.ShardBy))
		}
	}
	p.attributes = attributes(p.Rules)
	if pl := p.Plans; pl != nil {
		// Front doors collect the key the table reads, never the plan it fills.
		p.attributes = slices.DeleteFunc(p.attributes, func(a string) bool { return a == pl.Attribute })
		if !slices.Contains(p.attributes, pl.From) {
			p.attributes = append(p.attributes, pl.From)
			slices.Sort(p.attributes)
		}
	}
	return p
}

// document parses data into a node tree and returns the top node, or nil after
// adding the problem.
func (d *decoder) document(data []byte) (root *yaml.Node) {
	defer func() {
		// yaml.v3 is not known to panic on any input since v3.0.0, but a policy
		// comes from outside and a panic would take the front door down with it.
		if r := recover(); r != nil {
			d.addf(nil, "", "invalid YAML: the parser failed: %v", r)
			root = nil
		}
	}()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			d.add(nil, "", "the policy is empty; write a mapping with at least domain and rules")
		} else {
			d.syntax(err, data)
		}
		return nil
	}
	var next yaml.Node
	if err := dec.Decode(&next); !errors.Is(err, io.EOF) {
		line := next.Line
		if err != nil {
			line = 0
		}
		d.addLine(line, "", "the policy must be one YAML document; remove the '---' separator and what follows it")
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		d.add(&doc, "", "the policy is empty; write a mapping with at least domain and rules")
		return nil
	}
	if !d.bounded(doc.Content[0]) {
		return nil
	}
	return doc.Content[0]
}

// bounded reports whether the document rooted at n, with its aliases written out,
// holds at most maxExpanded values and no alias cycle; else it adds the problem.
func (d *decoder) bounded(n *yaml.Node) bool {
	const busy = -1
	sizes := map[*yaml.Node]int{} // of anchored nodes: their expanded size, or busy
	var cycle *yaml.Node
	var size func(n *yaml.Node) int
	size = func(n *yaml.Node) int {
		if n == nil || cycle != nil {
			return 0
		}
		if n.Kind == yaml.AliasNode {
			t := n.Alias
			if t == nil {
				return 1
			}
			if s, ok := sizes[t]; ok {
				if s == busy {
					cycle = n
					return 0
				}
				return s
			}
			return size(t)
		}
		if n.Anchor != "" {
			if s, ok := sizes[n]; ok && s != busy {
				return s
			}
			sizes[n] = busy
		}
		s := 1
		for _, c := range n.Content {
			s = min(s+size(c), maxExpanded+1)
		}
		if n.Anchor != "" {
			sizes[n] = s
		}
		return s
	}
	total := size(n)
	switch {
	case cycle != nil:
		d.addf(cycle, "", "the alias *%s refers to a value that contains it; remove the cycle", cycle.Value)
		return false
	case total > maxExpanded:
		d.add(n, "", fmt.Sprintf("the policy expands to more than %d values through aliases; write it out with fewer aliases", maxExpanded))
		return false
	}
	return true
}

// syntax adds a YAML syntax error, with its line when yaml.v3 names one. yaml.v3 often
// names the line where the enclosing construct starts, so a document that looks like
// JSON is checked with encoding/json too, which points at the offending byte.
func (d *decoder) syntax(err error, data []byte) {
	if t := bytes.TrimLeft(data, " \t\r\n\ufeff"); len(t) > 0 && (t[0] == '{' || t[0] == '[') {
		var v any
		if jerr, ok := errors.AsType[*json.SyntaxError](json.Unmarshal(data, &v)); ok {
			off := min(max(jerr.Offset, 0), int64(len(data)))
			line := 1 + bytes.Count(data[:off], []byte("\n"))
			col := off - 1 - int64(bytes.LastIndexByte(data[:off], '\n'))
			d.addLine(line, "", fmt.Sprintf("invalid JSON at column %d: %v", col, jerr))
			return
		}
	}
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	if rest, ok := strings.CutPrefix(msg, "line "); ok {
		if num, tail, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				line, msg = n, tail
			}
		}
	}
	d.addLine(line, "", "invalid YAML: "+msg)
}

// A field is one key and its value in a mapping.
type field struct {
	key, val *yaml.Node
}

// mapping checks that n is a mapping, reports its unknown and repeated fields, and
// returns its known fields by name (merge keys applied). It returns nil after adding
// a problem if n is not a mapping. want describes the expected value for that message.
func (d *decoder) mapping(n *yaml.Node, path string, known []string, want string) map[string]field {
	if n = d.node(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.add(n, path, "want "+want+", got "+kindOf(n))
		return nil
	}
	fields := make(map[string]field, len(n.Content)/2)
	d.collect(n, path, known, fields, 0)
	return fields
}

// collect adds the fields of mapping n to fields; merged mappings (<<) come after the
// explicit fields and do not override them.
func (d *decoder) collect(n *yaml.Node, path string, known []string, fields map[string]field, depth int) {
	var merges []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.node(n.Content[i]), n.Content[i+1]
		if k == nil {
			return
		}
		if k.Kind != yaml.ScalarNode {
			d.add(k, path, "field names must be plain words, got "+kindOf(k))
			continue
		}
		if k.ShortTag() == "!!merge" {
			merges = append(merges, v)
			continue
		}
		fp := join(path, k.Value)
		if prev, ok := fields[k.Value]; ok {
			if depth == 0 {
				d.addf(k, fp, "appears twice (first on line %d); remove one", prev.key.Line)
			}
			continue
		}
		if !slices.Contains(known, k.Value) {
			if d.full() {
				d.addLine(0, "", "")
			} else {
				d.add(k, fp, "unknown field; known fields: "+strings.Join(known, ", ")+suggest(k.Value, known))
			}
			continue
		}
		fields[k.Value] = field{k, v}
	}
	for _, m := range merges {
		if depth >= maxMergeDepth {
			d.add(m, path, "merge keys (<<) are nested too deeply")
			return
		}
		m = d.node(m)
		if m == nil {
			return
		}
		list := []*yaml.Node{m}
		if m.Kind == yaml.SequenceNode {
			list = m.Content
		}
		for _, mm := range list {
			if mm = d.node(mm); mm == nil {
				return
			}
			if mm.Kind != yaml.MappingNode {
				d.add(mm, path+".<<", "want a mapping (or a list of mappings) to merge, got "+kindOf(mm))
				continue
			}
			d.collect(mm, path, known, fields, depth+1)
		}
	}
}

// optional returns the value of the named field, or nil if it is absent or null.
func (d *decoder) optional(f map[string]field, name string) *yaml.Node {
	fl, ok := f[name]
	if !ok {
		return nil
	}
	v := d.node(fl.val)
	if v == nil || isNull(v) {
		return nil
	}
	return v
}

// required returns the value of the field name of mapping parent (at path), or adds
// a problem saying how to fill it in if it is absent or null.
func (d *decoder) required(f map[string]field, parent *yaml.Node, path, name, hint string) (*yaml.Node, bool) {
	fl, ok := f[name]
	if !ok {
		d.add(parent, join(path, name), "missing; "+hint)
		return nil, false
	}
	v := d.node(fl.val)
	if v == nil {
		return nil, false
	}
	if isNull(v) {
		d.add(fl.key, join(path, name), "missing; "+hint)
		return nil, false
	}
	return v, true
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// str returns the text of scalar n; for anything else it adds a problem. Numbers and
// booleans are taken as written.
func (d *decoder) str(n *yaml.Node, path, want string) (string, bool) {
	if n.Kind != yaml.ScalarNode || isNull(n) {
		d.add(n, path, "want "+want+", got "+kindOf(n))
		return "", false
	}
	return n.Value, true
}

// integer returns the whole number in n, if it is one from lo to hi.
func (d *decoder) integer(n *yaml.Node, path string, lo, hi int64) (int64, bool) {
	var v int64
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int":
		if err := n.Decode(&v); err != nil {
			d.addf(n, path, "%s: want a whole number from %d to %d", n.Value, lo, hi)
			return 0, false
		}
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && isInt(n.Value):
		d.addf(n, path, "want a whole number, got the string %s; remove the quotes", quote(n.Value))
		return 0, false
	default:
		d.addf(n, path, "want a whole number from %d to %d, got %s", lo, hi, kindOf(n))
		return 0, false
	}
	if v < lo || v > hi {
		d.addf(n, path, "%d: must be from %d to %d", v, lo, hi)
		return 0, false
	}
	return v, true
}

func isInt(s string) bool {
	_, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	return err == nil
}

// boolean returns the true or false in n.
func (d *decoder) boolean(n *yaml.Node, path string) (bool, bool) {
	var v bool
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!bool" && n.Decode(&v) == nil {
		return v, true
	}
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str" && (n.Value == "true" || n.Value == "false") {
		d.addf(n, path, "want true or false, got the string %s; remove the quotes", quote(n.Value))
	} else {
		d.add(n, path, "want true or false, got "+kindOf(n))
	}
	return false, false
}

// duration returns the Go duration in n, if it is from lo to hi. example is a
// sensible value for the message.
func (d *decoder) duration(n *yaml.Node, path string, lo, hi time.Duration, example string) (time.Duration, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		if n.Kind == yaml.ScalarNode && (n.ShortTag() == "!!int" || n.ShortTag() == "!!float") {
			d.addf(n, path, "want a duration with a unit, such as %s, got the number %s", example, n.Value)
		} else {
			d.addf(n, path, "want a duration such as %s, got %s", example, kindOf(n))
		}
		return 0, false
	}
	v, err := time.ParseDuration(strings.TrimSpace(n.Value))
	if err != nil {
		d.addf(n, path, "%s: want a duration such as %s (units ms, s, m, h)", quote(n.Value), example)
		return 0, false
	}
	if v < lo || v > hi {
		d.addf(n, path, "%s: must be from %s to %s", quote(n.Value), short(lo), short(hi))
		return 0, false
	}
	return v, true
}

// short formats d without zero units: 1h rather than 1h0m0s.
func short(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "h"}, {time.Minute, "m"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}

func (d *decoder) failure(n *yaml.Node, path string, out *Failure) {
	f := d.mapping(n, path, failureFields, "a mapping with mode, timeout, expected_instances or breaker")
	if f == nil {
		return
	}
	if v := d.optional(f, "mode"); v != nil {
		if s, ok := d.str(v, path+".mode", "open, closed or local"); ok {
			switch m := FailureMode(s); m {
			case FailOpen, FailClosed, FailLocal:
				out.Mode = m
			default:
				d.addf(v, path+".mode", "%s: unknown failure mode; use open, closed or local", quote(s))
			}
		}
	}
	if v := d.optional(f, "timeout"); v != nil {
		if t, ok := d.duration(v, path+".timeout", MinTimeout, MaxTimeout, "50ms"); ok {
			out.Timeout = t
		}
	}
	if v := d.optional(f, "expected_instances"); v != nil {
		if i, ok := d.integer(v, path+".expected_instances", 1, MaxInstances); ok {
			out.ExpectedInstances = int(i)
		}
	}
	if v := d.optional(f, "breaker"); v != nil {
		bp := path + ".breaker"
		b := d.mapping(v, bp, breakerFields, "a mapping with failures or open_for")
		if b == nil {
			return
		}
		if v := d.optional(b, "failures"); v != nil {
			if i, ok := d.integer(v, bp+".failures", 1, MaxBreakerFailure); ok {
				out.Breaker.Failures = int(i)
			}
		}
		if v := d.optional(b, "open_for"); v != nil {
			if t, ok := d.duration(v, bp+".open_for", MinOpenFor, MaxOpenFor, "5s"); ok {
				out.Breaker.OpenFor = t
			}
		}
	}
}

func (d *decoder) identity(n *yaml.Node, path string, out *Identity) {
	f := d.mapping(n, path, identityFields, "a mapping with trusted_proxies or ipv6_prefix")
	if f == nil {
		return
	}
	if v := d.optional(f, "trusted_proxies"); v != nil {
		if i, ok := d.integer(v, path+".trusted_proxies", 0, MaxTrustedProxies); ok {
			out.TrustedProxies = int(i)
		}
	}
	if v := d.optional(f, "ipv6_prefix"); v != nil {
		if i, ok := d.integer(v, path+".ipv6_prefix", 1, 128); ok {
			out.IPv6Prefix = int(i)
		}
	}
}

func (d *decoder) denyCache(n *yaml.Node, path string, out *DenyCache) {
	f := d.mapping(n, path, denyCacheFields, "a mapping with enabled or max_entries")
	if f == nil {
		return
	}
	if v := d.optional(f, "enabled"); v != nil {
		if b, ok := d.boolean(v, path+".enabled"); ok {
			out.Enabled = b
		}
	}
	if v := d.optional(f, "max_entries"); v != nil {
		if i, ok := d.integer(v, path+".max_entries", 1, MaxDenyCache); ok {
			out.MaxEntries = int(i)
		}
	}
}

// plans decodes the table of API keys to plans.
func (d *decoder) plans(n *yaml.Node, path string) *Plans {
	f := d.mapping(n, path, planFields, "a mapping with keys (API key or sha256:HEX: plan), and optionally attribute, from and default")
	if f == nil {
		return nil
	}
	pl := &Plans{Attribute: DefaultPlanAttribute, From: APIKey, Keys: map[string]string{}}
	for _, field := range []struct {
		name string
		dst  *string
	}{{"attribute", &pl.Attribute}, {"from", &pl.From}} {
		if v := d.optional(f, field.name); v != nil {
			if s, ok := d.str(v, path+"."+field.name, "an attribute name"); ok {
				if attrRE.MatchString(s) {
					*field.dst = s
				} else {
					d.addf(v, path+"."+field.name, "%s: %s", quote(s), attrRule)
				}
			}
		}
	}
	if v := d.optional(f, "default"); v != nil {
		if s, ok := d.str(v, path+".default", "a plan name"); ok {
			pl.Default = s
		}
	}
	v, ok := d.required(f, n, path, "keys", "map keys to plans, e.g. keys: {\"sha256:9f86d081…\": pro}")
	if !ok {
		return pl
	}
	if v.Kind != yaml.MappingNode {
		d.add(v, path+".keys", "want a mapping of API keys (or sha256:HEX of them) to plans, got "+kindOf(v))
		return pl
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, pv := d.node(v.Content[i]), d.node(v.Content[i+1])
		if k == nil || pv == nil {
			return pl
		}
		kp := join(path+".keys", k.Value)
		key, kok := d.str(k, kp, "an API key or sha256:HEX")
		plan, pok := d.str(pv, kp, "a plan name")
		if !kok || !pok {
			continue
		}
		if hex, hashed := strings.CutPrefix(key, "sha256:"); hashed && !sha256RE.MatchString(hex) {
			d.addf(k, kp, "%s: want sha256: and 64 lower-case hex digits (sha256sum of the key)", quote(key))
			continue
		}
		if _, dup := pl.Keys[key]; dup {
			d.add(k, kp, "appears twice; give each key one plan")
			continue
		}
		pl.Keys[key] = plan
	}
	return pl
}

// rules decodes the rule list into p.Rules, and checks that names are unique.
func (d *decoder) rules(n *yaml.Node, path string, p *Policy) {
	if n.Kind != yaml.SequenceNode {
		d.add(n, path, "want a list of rules, got "+kindOf(n))
		return
	}
	if len(n.Content) == 0 {
		d.add(n, path, "the policy has no rules; add at least one")
		return
	}
	first := make(map[string]int, len(n.Content))
	replaces := map[*Rule][]*yaml.Node{}
	for i, rn := range n.Content {
		rp := fmt.Sprintf("%s[%d]", path, i)
		r, nameNode := d.rule(rn, rp, p.ShardBy, replaces)
		if r == nil {
			if d.over {
				return
			}
			continue
		}
		if r.Name != "" {
			if j, ok := first[r.Name]; ok {
				d.addf(nameNode, rp+".name", "%s is used by %s[%d]; rule names must be unique", quote(r.Name), path, j)
			} else {
				first[r.Name] = i
			}
		}
		p.Rules = append(p.Rules, r)
	}
	d.replacements(p.Rules, path, replaces)
}

// replacements checks that every rule a rule replaces exists and is not the rule
// itself, and that no rules replace each other in a cycle; then it links each rule
// to the rules that replace it (Rule.replacedBy).
func (d *decoder) replacements(rules []*Rule, path string, nodes map[*Rule][]*yaml.Node) {
	byName := map[string]int{}
	for i, r := range rules {
		if _, dup := byName[r.Name]; !dup && r.Name != "" {
			byName[r.Name] = i
		}
	}
	ok := true
	for i, r := range rules {
		for j, name := range r.Replaces {
			rp := fmt.Sprintf("%s[%d].replaces[%d]", path, i, j)
			k, found := byName[name]
			switch {
			case name == r.Name:
				d.add(nodes[r][j], rp, "a rule cannot replace itself; name another rule")
				ok = false
			case !found:
				d.addf(nodes[r][j], rp, "%s: no rule has this name%s", quote(name), suggest(name, slices.Collect(maps.Keys(byName))))
				ok = false
			default:
				rules[k].replacedBy = append(rules[k].replacedBy, r)
			}
		}
	}
	if !ok {
		return
	}
	// A cycle (a replaces b, b replaces a) would make each drop the other.
	state := make([]int8, len(rules)) // 0 unseen, 1 on the path, 2 done
	var visit func(i int) bool
	visit = func(i int) bool {
		state[i] = 1
		for _, name := range rules[i].Replaces {
			k := byName[name]
			if state[k] == 1 || state[k] == 0 && !visit(k) {
				return false
			}
		}
		state[i] = 2
		return true
	}
	for i, r := range rules {
		if state[i] == 0 && !visit(i) {
			d.addf(nodes[r][0], fmt.Sprintf("%s[%d].replaces", path, i), "rules replace each other in a cycle through %s; a rule may replace another only one way", quote(r.Name))
			for k := range rules {
				rules[k].replacedBy = nil
			}
			return
		}
	}
}

// rule decodes one rule. It returns nil only if n is not a mapping; a rule with
// problems is still returned, so that later checks see its name and match.
func (d *decoder) rule(n *yaml.Node, path, shardBy string, replaces map[*Rule][]*yaml.Node) (*Rule, *yaml.Node) {
	if n = d.node(n); n == nil {
		return nil, nil
	}
	f := d.mapping(n, path, ruleFields, "a rule: a mapping with name, match and limits")
	if f == nil {
		return nil, nil
	}
	r := &Rule{Match: map[string]*Matcher{}}
	var nameNode *yaml.Node
	if v, ok := d.required(f, n, path, "name", "give the rule a name, e.g. name: per-key"); ok {
		nameNode = v
		if s, ok := d.str(v, path+".name", "a rule name"); ok {
			if nameRE.MatchString(s) {
				r.Name = s
			} else {
				d.addf(v, path+".name", "%s: %s", quote(s), nameRule)
			}
		}
	}
	if v := d.optional(f, "match"); v != nil {
		d.match(v, path+".match", r)
	}
	if v := d.optional(f, "shadow"); v != nil {
		if b, ok := d.boolean(v, path+".shadow"); ok {
			r.Shadow = b
		}
	}
	if v := d.optional(f, "replaces"); v != nil {
		if v.Kind != yaml.SequenceNode {
			d.add(v, path+".replaces", "want a list of rule names, e.g. replaces: [per-key], got "+kindOf(v))
		} else {
			for j, e := range v.Content {
				if e = d.node(e); e == nil {
					break
				}
				if name, ok := d.str(e, fmt.Sprintf("%s.replaces[%d]", path, j), "a rule name"); ok {
					r.Replaces = append(r.Replaces, name)
					replaces[r] = append(replaces[r], e)
				}
			}
		}
	}
	unlimitedNode := d.optional(f, "unlimited")
	if unlimitedNode != nil {
		if b, ok := d.boolean(unlimitedNode, path+".unlimited"); ok {
			r.Unlimited = b
		}
	}
	if r.Unlimited {
		if v := d.optional(f, "limits"); v != nil {
			d.add(v, path+".limits", "an unlimited rule has no limits; remove limits, or unlimited")
		}
		if r.Shadow {
			d.add(unlimitedNode, path+".unlimited", "an unlimited rule limits nothing to shadow; remove shadow, or unlimited")
		}
		r.compile(shardBy)
		return r, nameNode
	}
	ok := true
	var limitNodes []*yaml.Node
	if v, present := d.required(f, n, path, "limits", "list at least one limit, e.g. limits: [{algorithm: gcra, rate: 100/s}]"); !present {
		ok = false
	} else if v.Kind != yaml.SequenceNode {
		d.add(v, path+".limits", "want a list of limits, got "+kindOf(v))
		ok = false
	} else if len(v.Content) == 0 {
		d.add(v, path+".limits", "the rule has no limits; add at least one")
		ok = false
	} else {
		for j, ln := range v.Content {
			lp := fmt.Sprintf("%s.limits[%d]", path, j)
			l, rec, lok := d.limit(ln, lp)
			ok = ok && lok
			r.Limits = append(r.Limits, l)
			r.Records = append(r.Records, rec)
			r.addLease(j, d.lease(ln, lp, l, rec, r.Shadow)) // lease: see decoder.lease
			r.Replicas = addPer(r.Replicas, j, d.replicas(ln, lp))
			limitNodes = append(limitNodes, d.node(ln))
			if d.over {
				return r, nameNode
			}
		}
	}
	if ok {
		ok = d.ring(r, path, limitNodes)
	}
	if ok {
		r.compile(shardBy)
		for i, m := range r.Meters {
			if err := m.Validate(); err != nil {
				d.addf(n, fmt.Sprintf("%s.meters[%d]", path, i), "%v", err)
			}
		}
	}
	return r, nameNode
}

// errSkip marks a problem already reported.
var errSkip = errors.New("reported")

// match decodes a rule's match mapping into r.Match.
func (d *decoder) match(n *yaml.Node, path string, r *Rule) {
	if n.Kind != yaml.MappingNode {
		d.add(n, path, `want a mapping of attribute names to values (or "*" for any value), got `+kindOf(n))
		return
	}
	lines := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := d.node(n.Content[i]), d.node(n.Content[i+1])
		if k == nil || v == nil {
			return
		}
		if k.Kind != yaml.ScalarNode || k.ShortTag() == "!!merge" {
			d.add(k, path, "attribute names must be plain words, got "+kindOf(k))
			continue
		}
		ap := join(path, k.Value)
		if !attrRE.MatchString(k.Value) {
			d.addf(k, ap, "%s: %s", quote(k.Value), attrRule)
			continue
		}
		if line, ok := lines[k.Value]; ok {
			d.addf(k, ap, "appears twice (first on line %d); remove one", line)
			continue
		}
		lines[k.Value] = k.Line
		var m Matcher
		var err error
		switch {
		case v.Kind == yaml.SequenceNode:
			values := make([]string, 0, len(v.Content))
			for _, e := range v.Content {
				if e = d.node(e); e == nil {
					return
				}
				if e.Kind != yaml.ScalarNode || isNull(e) {
					d.add(e, ap, "want a list of values, got an element that is "+kindOf(e))
					err = errSkip
					break
				}
				values = append(values, e.Value)
			}
			if err == nil {
				m, err = listMatcher(values)
			}
		case v.Kind == yaml.MappingNode:
			f := d.mapping(v, ap, eachFields, `{each: PATTERN}: a pattern that keeps a limit per distinct value, e.g. {each: "/api/*"}`)
			if f == nil {
				continue
			}
			pv, ok := d.required(f, v, ap, "each", `name the pattern, e.g. {each: "/api/*"}`)
			if !ok {
				continue
			}
			if s, ok := d.str(pv, ap+".each", "a pattern"); ok {
				m, err = eachMatcher(s)
			} else {
				err = errSkip
			}
		case v.Kind != yaml.ScalarNode || isNull(v):
			d.add(v, ap, `want a value to match, "*" for any value, or a list of values, got `+kindOf(v))
			continue
		default:
			m, err = parseMatcher(v.Value)
		}
		if err != nil {
			if err != errSkip {
				d.add(v, ap, err.Error())
			}
			continue
		}
		r.Match[k.Value] = &m
	}
}

// limit decodes one limit and the attribute it records. ok is false if it has a
// problem.
func (d *decoder) limit(n *yaml.Node, path string) (l algo.Limit, record string, ok bool) {
	if n = d.node(n); n == nil {
		return l, "", false
	}
	f := d.mapping(n, path, limitFields, "a limit: a mapping with algorithm and rate")
	if f == nil {
		return l, "", false
	}
	before := d.total
	algoMissing, rateBad := true, true
	if v, present := d.required(f, n, path, "algorithm", "use one of "+algoList()); present {
		if s, ok := d.str(v, path+".algorithm", "an algorithm name"); ok {
			l.Algorithm = algo.Algorithm(s)
			algoMissing = false
		}
	}
	var zone *time.Location
	calendarNode := d.optional(f, "calendar")
	if calendarNode != nil {
		zone = d.calendar(calendarNode, path+".calendar")
	}
	if v, present := d.required(f, n, path, "rate", `write COUNT/PERIOD, e.g. rate: 100/s`); present {
		if s, ok := d.str(v, path+".rate", `a rate such as "100/s"`); ok {
			if calendarNode != nil {
				c, unit, err := calendarRate(s)
				if err != nil {
					d.addf(v, path+".rate", "%s: %v", quote(s), err)
				} else {
					// The algorithm as written, so that Validate names any but fixed_window.
					a := l.Algorithm
					l, rateBad = algo.NewCalendarLimit(c, unit, zone), false
					l.Algorithm = a
				}
			} else if c, p, err := algo.ParseRate(s); err != nil {
				d.fieldErrors(v, path, err)
			} else {
				l.Count, l.Period, rateBad = c, p, false
			}
		}
	}
	if v := d.optional(f, "burst"); v != nil {
		if b, ok := d.integer(v, path+".burst", 1, algo.MaxCount); ok {
			l.Burst = b
		}
	}
	if v := d.optional(f, "bucket"); v != nil {
		if b, ok := d.duration(v, path+".bucket", algo.MinPeriod, algo.MaxPeriod, "100ms"); ok {
			l.Bucket = b
		}
	}
	if v := d.optional(f, "record"); v != nil {
		if s, ok := d.str(v, path+".record", "an attribute name"); ok {
			switch {
			case !attrRE.MatchString(s):
				d.addf(v, path+".record", "%s: %s", quote(s), attrRule)
			case l.Algorithm.Valid() && !l.Algorithm.CanRecord():
				d.addf(v, path+".record", "%s cannot keep recorded values; remove record or use sliding_log or fixed_window", l.Algorithm)
			default:
				record = s
			}
		}
	}
	if !algoMissing {
		if rateBad {
			// Let Validate judge the other fields without repeating the rate's problem.
			l.Count, l.Period = 1, time.Second
		}
		if err := l.Validate(); err != nil {
			var fes []error
			for _, e := range flatten(err) {
				if fe, ok := errors.AsType[*algo.FieldError](e); ok && fe.Field == "rate" && rateBad {
					continue
				}
				fes = append(fes, e)
			}
			node := func(field string) *yaml.Node {
				if fl, ok := f[field]; ok {
					return fl.val
				}
				return n
			}
			for _, e := range fes {
				fe, ok := errors.AsType[*algo.FieldError](e)
				if !ok {
					d.add(n, path, e.Error())
					continue
				}
				d.fieldErrors(node(fe.Field), path, fe)
			}
		}
		if rateBad {
			l.Count, l.Period = 0, 0
		}
	}
	return l, record, d.total == before
}

// calendar decodes a limit's calendar mapping and returns its time zone (UTC when it
// names none).
func (d *decoder) calendar(n *yaml.Node, path string) *time.Location {
	f := d.mapping(n, path, calendarFields, "a mapping with timezone, e.g. calendar: {timezone: Europe/Berlin}")
	if f == nil {
		return nil
	}
	v := d.optional(f, "timezone")
	if v == nil {
		return time.UTC
	}
	name, ok := d.str(v, path+".timezone", "an IANA time zone name such as Europe/Berlin")
	if !ok {
		return nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "" || name == "Local" {
		d.addf(v, path+".timezone", "%s: not an IANA time zone; use a name such as Europe/Berlin, America/New_York or UTC", quote(name))
		return nil
	}
	return loc
}

// calendarRate parses the rate of a calendar limit: COUNT/day, COUNT/week or
// COUNT/month.
func calendarRate(s string) (int64, algo.CalendarUnit, error) {
	c, u, ok := strings.Cut(strings.TrimSpace(s), "/")
	n, err := strconv.ParseInt(strings.TrimSpace(c), 10, 64)
	if !ok || err != nil || n < 1 {
		return 0, "", errors.New("want COUNT/day, COUNT/week or COUNT/month, e.g. 10000/month")
	}
	switch unit := algo.CalendarUnit(strings.TrimSpace(u)); unit {
	case algo.CalendarDay, algo.CalendarWeek, algo.CalendarMonth:
		return n, unit, nil
	}
	return 0, "", errors.New("a calendar window is a day, a week or a month: write COUNT/day, COUNT/week or COUNT/month")
}

// fieldErrors adds each *algo.FieldError in err with its field under path; other
// errors are added at path.
func (d *decoder) fieldErrors(n *yaml.Node, path string, err error) {
	for _, e := range flatten(err) {
		fe, ok := errors.AsType[*algo.FieldError](e)
		if !ok {
			d.add(n, path, e.Error())
			continue
		}
		msg := fe.Msg
		if fe.Value != "" {
			msg = quote(fe.Value) + ": " + msg
		}
		d.add(n, join(path, fe.Field), msg)
	}
}

// flatten returns the errors joined in err.
func flatten(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return []error{err}
}

// ring checks that a rule's bucket_ring limits can share one key: one bucket width,
// which divides every period into at most algo.MaxRingBuckets buckets.
func (d *decoder) ring(r *Rule, path string, nodes []*yaml.Node) bool {
	ok := true
	var m algo.Meter
	first := -1
	for j, l := range r.Limits {
		if l.Algorithm != algo.BucketRing {
			continue
		}
		if l.Bucket != 0 {
			if first >= 0 && r.Limits[first].Bucket != l.Bucket {
				d.addf(nodes[j], fmt.Sprintf("%s.limits[%d].bucket", path, j),
					"%s: the bucket_ring limits of a rule share one key and one bucket width; use %s as in %s.limits[%d], or leave bucket out",
					quote(l.Bucket.String()), r.Limits[first].Bucket, path, first)
				ok = false
			} else if first < 0 {
				first = j
			}
		}
		m.Limits = append(m.Limits, l)
	}
	if !ok || len(m.Limits) == 0 {
		return ok
	}
	w := m.RingBucket()
	how := "the bucket set on the ring"
	if first < 0 {
		how = "the greatest common divisor of the ring's periods"
	}
	for j, l := range r.Limits {
		if l.Algorithm != algo.BucketRing {
			continue
		}
		rp := fmt.Sprintf("%s.limits[%d].rate", path, j)
		switch {
		case l.Period%w != 0:
			d.addf(nodes[j], rp, "the period %s is not a multiple of the ring's bucket width %s (%s); set a bucket that divides every period of the ring", short(l.Period), short(w), how)
			ok = false
		case l.Period/w > algo.MaxRingBuckets:
			d.addf(nodes[j], rp, "the period %s spans more than %d buckets of %s (%s); set a wider bucket that divides every period of the ring", short(l.Period), algo.MaxRingBuckets, short(w), how)
			ok = false
		}
	}
	return ok
}

// checkPrefix returns what is wrong with a key prefix, or "".
func checkPrefix(s string) string {
	if len(s) > MaxPrefixLen {
		return fmt.Sprintf("the prefix is %d bytes; use at most %d", len(s), MaxPrefixLen)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' || c == '{' || c == '}' {
			return "use printable ASCII without spaces, '{' or '}' (braces would move the cluster hash tag)"
		}
	}
	return ""
}

// attributes returns the sorted names of every attribute the rules match or record.
func attributes(rules []*Rule) []string {
	var names []string
	for _, r := range rules {
		for a := range r.Match {
			names = append(names, a)
		}
		for _, a := range r.Records {
			if a != "" {
				names = append(names, a)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// join appends a field name to a path, quoting names that are not plain words.
func join(path, key string) string {
	if !plainKeyRE.MatchString(key) {
		key = quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// quote quotes s for a message, shortened if it is long.
func quote(s string) string {
	if len(s) > maxQuoted {
		return strconv.Quote(strings.ToValidUTF8(s[:maxQuoted], "")) + "…"
	}
	return strconv.Quote(s)
}

// kindOf describes a node for a message: "a mapping", "the number 5".
func kindOf(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "nothing (null)"
		case "!!bool":
			return n.Value
		case "!!int", "!!float":
			return "the number " + n.Value
		case "!!str":
			return "the string " + quote(n.Value)
		}
		return quote(n.Value)
	}
	return "nothing"
}

func algoList() string {
	names := make([]string, len(algo.Algorithms))
	for i, a := range algo.Algorithms {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// suggest returns `; did you mean "x"?` for the known name closest to s, if one is
// close enough to be a likely typo.
func suggest(s string, known []string) string {
	if len(s) > 64 {
		return ""
	}
	best, bestD := "", 3
	for _, k := range known {
		if strings.EqualFold(s, k) || len(s) >= 3 && strings.HasPrefix(k, strings.ToLower(s)) {
			return fmt.Sprintf("; did you mean %q?", k)
		}
		if dist := distance(strings.ToLower(s), k); dist < bestD && dist < len(k)/2+1 {
			best, bestD = k, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf("; did you mean %q?", best)
}

// distance is the Levenshtein distance between a and b, in bytes.
func distance(a, b string) int {
	row := make([]int, len(b)+1)
	for j := range row {
		row[j] = j
	}
	for i := 1; i <= len(a); i++ {
		prev := row[0]
		row[0] = i
		for j := 1; j <= len(b); j++ {
			cur := row[j]
			c := 1
			if a[i-1] == b[j-1] {
				c = 0
			}
			row[j] = min(row[j]+1, row[j-1]+1, prev+c)
			prev = cur
		}
	}
	return row[len(b)]
}

// lease: the decoding of a limit's lease field (see Lease).

// lease decodes the lease field of the limit mapping n at path, for the limit l as
// decoded (recording record, in a rule that is shadow or not), and returns it, or
// the zero Lease when there is none. Its problems are Lease.Problems, each at the
// field it names.
func (d *decoder) lease(n *yaml.Node, path string, l algo.Limit, record string, shadow bool) Lease {
	var quiet decoder // the limit's own problems are decoder.limit's to report
	v := d.optional(quiet.mapping(n, path, limitFields, ""), "lease")
	if v == nil {
		return Lease{}
	}
	path += ".lease"
	f := d.mapping(v, path, leaseFields, "a lease: a mapping with units and for, e.g. lease: {units: 50, for: 100ms}")
	if f == nil {
		return Lease{}
	}
	var ls Lease
	nodes := map[string]*yaml.Node{"": v}
	ok := map[string]bool{"": true}
	if u, present := d.required(f, v, path, "units", "say how many units to reserve at a time, e.g. units: 50"); present {
		nodes["units"] = u
		ls.Units, ok["units"] = d.integer(u, path+".units", 1, algo.MaxCount)
	}
	if t, present := d.required(f, v, path, "for", "say how long a reservation may be spent from, e.g. for: 100ms"); present {
		nodes["for"] = t
		ls.For, ok["for"] = d.duration(t, path+".for", MinLeaseFor, MaxLeaseFor, "100ms")
	}
	for _, pr := range ls.Problems(l, record, shadow) {
		if ok[pr[0]] { // a field that did not decode has had its problem
			d.add(nodes[pr[0]], strings.TrimSuffix(path+"."+pr[0], "."), pr[1])
		}
	}
	return ls
}

// replicas decodes the replicas field of the limit mapping n at path (see
// algo.Replicas), or returns the zero value when there is none.
func (d *decoder) replicas(n *yaml.Node, path string) algo.Replicas {
	var quiet decoder // the limit's own problems are decoder.limit's to report
	v := d.optional(quiet.mapping(n, path, limitFields, ""), "replicas")
	if v == nil {
		return algo.Replicas{}
	}
	path += ".replicas"
	f := d.mapping(v, path, replicasFields, "a mapping with count and timeout, e.g. replicas: {count: 1, timeout: 5ms}")
	if f == nil {
		return algo.Replicas{}
	}
	var rp algo.Replicas
	if c, present := d.required(f, v, path, "count", "say how many replicas must acknowledge each charge, e.g. count: 1"); present {
		n, _ := d.integer(c, path+".count", 1, MaxReplicas)
		rp.Count = int(n)
	}
	if t, present := d.required(f, v, path, "timeout", "say how long the master may wait for them, e.g. timeout: 5ms"); present {
		rp.Timeout, _ = d.duration(t, path+".timeout", MinReplicasTimeout, MaxReplicasTimeout, "5ms")
		if rp.Timeout%time.Millisecond != 0 {
			d.add(t, path+".timeout", "Redis waits in whole milliseconds; round it, e.g. timeout: 5ms")
		}
	}
	if rp.Count == 0 || rp.Timeout == 0 {
		return algo.Replicas{}
	}
	return rp
}
