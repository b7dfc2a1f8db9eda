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

// The policy is decoded into a yaml.Node tree and walked, rather than decoded into
// typed structs, so that every problem names its path as well as its line: yaml.v3's
// typed decoding collects unknown fields and type errors with a line but no path
// (rules[2].limits[0] and rules[3].limits[0] may share a line in flow style), and
// stops at the first bad merge key or alias cycle. The mappings of known fields are
// read through fields; match and plans.keys, whose keys are the user's, are walked
// directly.

var (
	// sha256RE is a SHA-256 in hex, as sha256sum writes it.
	sha256RE = regexp.MustCompile(`^[0-9a-f]{64}$`)
	// plainKeyRE is the form of a field name written into a path without quotes.
	plainKeyRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)
)

// ValidName reports whether s is a name the policy accepts for its domain and its
// rules.
func ValidName(s string) bool {
	return len(s) <= 63 && s != "" && s[0] != '_' && s[0] != '.' && s[0] != '-' && nameChars(s)
}

// ValidAttribute reports whether s is a name the policy accepts for an attribute.
func ValidAttribute(s string) bool { return len(s) <= 64 && s != "" && nameChars(s) }

// nameChars reports whether s is made of a-z, 0-9, '_', '.' and '-' only (a loop
// rather than a regular expression: package rls checks every descriptor entry's key
// with it, and the regular expression was a percent of BenchmarkShouldRateLimit).
func nameChars(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9', c == '_', c == '.', c == '-':
		default:
			return false
		}
	}
	return true
}

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
	ruleFields      = []string{"name", "match", "limits", "unlimited", "replaces", "shadow", "settle", "rlqs"}
	limitFields     = []string{"algorithm", "rate", "burst", "bucket", "record", "calendar", "lease", "replicas", "counter"}
	leaseFields     = []string{"units", "for"}     // lease: see Lease and decoder.lease
	replicasFields  = []string{"count", "timeout"} // replicas: see decoder.replicas
	calendarFields  = []string{"timezone"}
	eachFields      = []string{"each"}
	rlqsFields      = []string{"reporting_interval"} // rlqs: see RLQS and decoder.rlqs
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

	counters []counterUse // every limit's counter field, for checkCounters (continuity.go)
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
	f := d.fields(root, "", topFields, "a policy: a mapping with at least domain and rules")
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
	if n := f.need("domain", "name the policy, e.g. domain: public-api"); n != nil {
		if s, ok := d.str(n, "domain", "a domain name"); ok && !ValidName(s) {
			d.addf(n, "domain", "%s: %s", quote(s), nameRule)
		}
		p.Domain = n.Value
	}
	if n := f.get("prefix"); n != nil {
		if s, ok := d.str(n, "prefix", "a key prefix"); ok {
			p.Prefix = s
			if msg := checkPrefix(s); msg != "" {
				d.addf(n, "prefix", "%s: %s", quote(s), msg)
			}
		}
	}
	shardNode := f.attr("shard_by", &p.ShardBy)
	d.failure(f.get("failure"), &p.Failure)
	id := f.sub("identity", identityFields, "a mapping with trusted_proxies or ipv6_prefix")
	setInt(id, "trusted_proxies", &p.Identity.TrustedProxies, 0, MaxTrustedProxies)
	setInt(id, "ipv6_prefix", &p.Identity.IPv6Prefix, 1, 128)
	dc := f.sub("deny_cache", denyCacheFields, "a mapping with enabled or max_entries")
	dc.setBool("enabled", &p.DenyCache.Enabled)
	setInt(dc, "max_entries", &p.DenyCache.MaxEntries, 1, MaxDenyCache)
	p.Plans = d.plans(f.get("plans"))
	if n := f.need("rules", "list the rules, each with a name, a match and limits"); n != nil {
		d.rules(n, "rules", p)
		d.checkCounters(p)
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
	d.addLine(line, "", "invalid YAML: "+msg+aliasHint(msg))
}

// aliasHint explains the YAML errors an unquoted * or & at the start of a value
// causes (match: {api_key: *} reads as an alias): YAML takes them for an alias or
// an anchor, so "*", one limit per distinct value, must be quoted.
func aliasHint(msg string) string {
	if strings.Contains(msg, "did not find expected alphabetic or numeric character") || strings.Contains(msg, "unknown anchor") {
		return `; "*" must be quoted: YAML reads a value starting with * or & as an alias or anchor (write api_key: "*")`
	}
	return ""
}

// A field is one key and its value in a mapping.
type field struct {
	key, val *yaml.Node
}

// fields is a mapping's known fields by name (merge keys applied), at path. A nil
// *fields stands for a mapping that is absent or had its problem reported: its
// methods return nil and report nothing.
type fields struct {
	d    *decoder
	n    *yaml.Node // the mapping
	path string
	m    map[string]field
}

// fields checks that n is a mapping, reports its unknown and repeated fields, and
// returns its known fields. It returns nil if n is nil or the walk has stopped, and
// nil after adding a problem if n is not a mapping; want describes the expected
// value for that message.
func (d *decoder) fields(n *yaml.Node, path string, known []string, want string) *fields {
	if n = d.node(n); n == nil {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		d.add(n, path, "want "+want+", got "+kindOf(n))
		return nil
	}
	f := &fields{d: d, n: n, path: path, m: make(map[string]field, len(n.Content)/2)}
	d.collect(n, path, known, f.m, 0)
	return f
}

// collect adds the fields of mapping n to into; merged mappings (<<) come after the
// explicit fields and do not override them.
func (d *decoder) collect(n *yaml.Node, path string, known []string, into map[string]field, depth int) {
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
		if prev, ok := into[k.Value]; ok {
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
		into[k.Value] = field{k, v}
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
			d.collect(mm, path, known, into, depth+1)
		}
	}
}

// at returns the path of the named field.
func (f *fields) at(name string) string {
	if f == nil {
		return ""
	}
	return join(f.path, name)
}

// lookup returns the named field and its value with aliases resolved (nil once the
// walk has stopped); ok is false if the field is absent.
func (f *fields) lookup(name string) (fl field, v *yaml.Node, ok bool) {
	if f == nil {
		return fl, nil, false
	}
	if fl, ok = f.m[name]; ok {
		v = f.d.node(fl.val)
	}
	return fl, v, ok
}

// get returns the value of the named field, or nil if it is absent or null.
func (f *fields) get(name string) *yaml.Node {
	if _, v, _ := f.lookup(name); v != nil && !isNull(v) {
		return v
	}
	return nil
}

// need returns the value of the named field, or nil after adding a problem that
// says how to fill it in if it is absent or null.
func (f *fields) need(name, hint string) *yaml.Node {
	fl, v, ok := f.lookup(name)
	switch {
	case f != nil && !ok:
		f.d.add(f.n, f.at(name), "missing; "+hint)
	case v != nil && isNull(v):
		f.d.add(fl.key, f.at(name), "missing; "+hint)
	default:
		return v
	}
	return nil
}

// sub returns the fields of the mapping in the named field, as decoder.fields does.
func (f *fields) sub(name string, known []string, want string) *fields {
	if f == nil {
		return nil
	}
	return f.d.fields(f.get(name), f.at(name), known, want)
}

// setInt sets *dst to the whole number in the named field of f, if it is there and
// from lo to hi.
func setInt[T int | int64](f *fields, name string, dst *T, lo, hi int64) {
	if n := f.get(name); n != nil {
		if v, ok := f.d.integer(n, f.at(name), lo, hi); ok {
			*dst = T(v)
		}
	}
}

// setBool sets *dst to the true or false in the named field, if it is there.
func (f *fields) setBool(name string, dst *bool) {
	if n := f.get(name); n != nil {
		if v, ok := f.d.boolean(n, f.at(name)); ok {
			*dst = v
		}
	}
}

// setDuration sets *dst to the duration in the named field, if it is there and
// from lo to hi; example is a sensible value for the message.
func (f *fields) setDuration(name string, dst *time.Duration, lo, hi time.Duration, example string) {
	if n := f.get(name); n != nil {
		if v, ok := f.d.duration(n, f.at(name), lo, hi, example); ok {
			*dst = v
		}
	}
}

// attr sets *dst to the attribute name in the named field and returns its node, if
// it is there and valid.
func (f *fields) attr(name string, dst *string) *yaml.Node {
	n := f.get(name)
	if n == nil {
		return nil
	}
	s, ok := f.d.str(n, f.at(name), "an attribute name")
	if ok && !ValidAttribute(s) {
		f.d.addf(n, f.at(name), "%s: %s", quote(s), attrRule)
		ok = false
	}
	if !ok {
		return nil
	}
	*dst = s
	return n
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

// failure decodes the failure mapping n into out.
func (d *decoder) failure(n *yaml.Node, out *Failure) {
	f := d.fields(n, "failure", failureFields, "a mapping with mode, timeout, expected_instances or breaker")
	if v := f.get("mode"); v != nil {
		if s, ok := d.str(v, f.at("mode"), "open, closed or local"); ok {
			switch m := FailureMode(s); m {
			case FailOpen, FailClosed, FailLocal:
				out.Mode = m
			default:
				d.addf(v, f.at("mode"), "%s: unknown failure mode; use open, closed or local", quote(s))
			}
		}
	}
	f.setDuration("timeout", &out.Timeout, MinTimeout, MaxTimeout, "50ms")
	setInt(f, "expected_instances", &out.ExpectedInstances, 1, MaxInstances)
	b := f.sub("breaker", breakerFields, "a mapping with failures or open_for")
	setInt(b, "failures", &out.Breaker.Failures, 1, MaxBreakerFailure)
	b.setDuration("open_for", &out.Breaker.OpenFor, MinOpenFor, MaxOpenFor, "5s")
}

// plans decodes the table of API keys to plans, or returns nil if n is nil.
func (d *decoder) plans(n *yaml.Node) *Plans {
	const path = "plans"
	f := d.fields(n, path, planFields, "a mapping with keys (API key or sha256:HEX: plan), and optionally attribute, from and default")
	if f == nil {
		return nil
	}
	pl := &Plans{Attribute: DefaultPlanAttribute, From: APIKey, Keys: map[string]string{}}
	f.attr("attribute", &pl.Attribute)
	f.attr("from", &pl.From)
	if v := f.get("default"); v != nil {
		if s, ok := d.str(v, f.at("default"), "a plan name"); ok {
			pl.Default = s
		}
	}
	v := f.need("keys", "map keys to plans, e.g. keys: {\"sha256:9f86d081…\": pro}")
	if v == nil {
		return pl
	}
	if v.Kind != yaml.MappingNode {
		d.add(v, f.at("keys"), "want a mapping of API keys (or sha256:HEX of them) to plans, got "+kindOf(v))
		return pl
	}
	for i := 0; i+1 < len(v.Content); i += 2 {
		k, pv := d.node(v.Content[i]), d.node(v.Content[i+1])
		if k == nil || pv == nil {
			return pl
		}
		kp := join(f.at("keys"), k.Value)
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
	at := map[*Rule]int{} // each rule's index in n.Content
	for i, rn := range n.Content {
		rp := fmt.Sprintf("%s[%d]", path, i)
		r, nameNode := d.rule(rn, rp, p.ShardBy, replaces)
		if r == nil {
			if d.over {
				return
			}
			continue
		}
		at[r] = i
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
	d.rlqsMeetings(p.Rules, path, n, at)
}

// rlqsMeetings checks the limits of every two rlqs rules that can match one bucket
// as the limits of one rule are checked (periodConflict): the service shares such a
// bucket's limits together. Two rules can match one bucket unless they are exclusive
// (a conservative test: prefixes, patterns and negations are taken to meet).
func (d *decoder) rlqsMeetings(rules []*Rule, path string, n *yaml.Node, at map[*Rule]int) {
	for j, b := range rules {
		if b.RLQS == nil {
			continue
		}
		for _, a := range rules[:j] {
			if a.RLQS == nil || exclusive(a, b) {
				continue
			}
			for k, lb := range b.Limits {
				for _, la := range a.Limits {
					if why := periodConflict(la.Limit, lb.Limit); why != "" {
						d.addf(n.Content[at[b]], fmt.Sprintf("%s[%d].limits[%d].rate", path, at[b], k),
							"rules %s and %s can both match one bucket: %s; or make their matches exclusive (one attribute matched with exact values that differ)", quote(a.Name), quote(b.Name), why)
					}
				}
			}
		}
	}
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
				d.addf(nodes[r][j], rp, "%s: no rule has this name%s", quote(name), suggest(name, slices.Sorted(maps.Keys(byName))))
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
	f := d.fields(n, path, ruleFields, "a rule: a mapping with name, match and limits")
	if f == nil {
		return nil, nil
	}
	r := &Rule{Match: map[string]*Matcher{}}
	nameNode := f.need("name", "give the rule a name, e.g. name: per-key")
	if nameNode != nil {
		if s, ok := d.str(nameNode, f.at("name"), "a rule name"); ok {
			if ValidName(s) {
				r.Name = s
			} else {
				d.addf(nameNode, f.at("name"), "%s: %s", quote(s), nameRule)
			}
		}
	}
	if v := f.get("match"); v != nil {
		d.match(v, f.at("match"), r)
	}
	f.setBool("shadow", &r.Shadow)
	if v := f.get("replaces"); v != nil {
		if v.Kind != yaml.SequenceNode {
			d.add(v, f.at("replaces"), "want a list of rule names, e.g. replaces: [per-key], got "+kindOf(v))
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
	f.setBool("unlimited", &r.Unlimited)
	f.setBool("settle", &r.Settle)
	if r.Settle && r.Unlimited {
		_, u, _ := f.lookup("settle")
		d.add(u, f.at("settle"), "an unlimited rule has nothing to charge; remove settle, or unlimited")
	}
	if r.Unlimited {
		if v := f.get("limits"); v != nil {
			d.add(v, f.at("limits"), "an unlimited rule has no limits; remove limits, or unlimited")
		}
		if r.Shadow {
			_, u, _ := f.lookup("unlimited")
			d.add(u, f.at("unlimited"), "an unlimited rule limits nothing to shadow; remove shadow, or unlimited")
		}
		r.RLQS = d.rlqs(f, r, path)
		r.compile(shardBy)
		return r, nameNode
	}
	v := f.need("limits", "list at least one limit, e.g. limits: [{algorithm: gcra, rate: 100/s}]")
	ok := v != nil
	var limitNodes []*yaml.Node
	switch {
	case v == nil:
	case v.Kind != yaml.SequenceNode:
		d.add(v, f.at("limits"), "want a list of limits, got "+kindOf(v))
		ok = false
	case len(v.Content) == 0:
		d.add(v, f.at("limits"), "the rule has no limits; add at least one")
		ok = false
	default:
		for j, ln := range v.Content {
			l, rec, lf, lok := d.limit(ln, fmt.Sprintf("%s.limits[%d]", path, j))
			ok = ok && lok
			r.Limits = append(r.Limits, RuleLimit{
				Limit:    l,
				Lease:    d.lease(lf, l, rec, r.Shadow), // lease: see decoder.lease
				Record:   rec,
				Replicas: d.replicas(lf),
				Counter:  d.counter(lf, l, r, path, j), // counter: see continuity.go
			})
			limitNodes = append(limitNodes, d.node(ln))
			if r.Settle {
				d.settling(ln, fmt.Sprintf("%s.limits[%d]", path, j), r.Limits[j])
			}
			if d.over {
				return r, nameNode
			}
		}
	}
	if ok {
		ok = d.ring(r, path, limitNodes)
	}
	r.RLQS = d.rlqs(f, r, path)
	if ok {
		r.compile(shardBy)
		for i, m := range r.Meters {
			if err := m.Meter.Validate(); err != nil {
				d.addf(f.n, fmt.Sprintf("%s.meters[%d]", path, i), "%v", err)
			}
		}
	}
	return r, nameNode
}

// settling reports a limit of a settling rule that cannot settle: a sliding_log
// (a debt would grow its log without bound) or a leased limit (a settlement is
// charged in Redis at once, never from a lease).
func (d *decoder) settling(n *yaml.Node, path string, l RuleLimit) {
	if l.Algorithm == algo.SlidingLog {
		d.add(n, path+".algorithm", "a settling rule charges costs already spent, past the limit if need be, and sliding_log cannot hold such a debt; use sliding_window, fixed_window, token_bucket or gcra")
	}
	if l.Lease.Units > 0 {
		d.add(n, path+".lease", "a settling rule is charged in Redis at once, never from a lease; remove lease")
	}
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
		if !ValidAttribute(k.Value) {
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
			f := d.fields(v, ap, eachFields, `{each: PATTERN}: a pattern that keeps a limit per distinct value, e.g. {each: "/api/*"}`)
			pv := f.need("each", `name the pattern, e.g. {each: "/api/*"}`)
			if pv == nil {
				continue
			}
			if s, ok := d.str(pv, f.at("each"), "a pattern"); ok {
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

// limit decodes one limit and the attribute it records, and returns its fields for
// the lease and replicas. ok is false if it has a problem.
func (d *decoder) limit(n *yaml.Node, path string) (l algo.Limit, record string, f *fields, ok bool) {
	f = d.fields(n, path, limitFields, "a limit: a mapping with algorithm and rate")
	if f == nil {
		return l, "", nil, false
	}
	before := d.total
	algoMissing, rateBad := true, true
	if v := f.need("algorithm", "use one of "+algoList()); v != nil {
		if s, ok := d.str(v, f.at("algorithm"), "an algorithm name"); ok {
			l.Algorithm = algo.Algorithm(s)
			algoMissing = false
		}
	}
	var zone *time.Location
	calendarNode := f.get("calendar")
	if calendarNode != nil {
		zone = d.calendar(calendarNode, f.at("calendar"))
	}
	if v := f.need("rate", `write COUNT/PERIOD, e.g. rate: 100/s`); v != nil {
		if s, ok := d.str(v, f.at("rate"), `a rate such as "100/s"`); ok {
			if calendarNode != nil {
				c, unit, err := calendarRate(s)
				if err != nil {
					d.addf(v, f.at("rate"), "%s: %v", quote(s), err)
				} else {
					// The algorithm as written, so that Validate names any but fixed_window.
					a := l.Algorithm
					l, rateBad = algo.NewCalendarLimit(c, unit, zone), false
					l.Algorithm = a
				}
			} else if c, p, unit, err := algo.ParseQuota(s); err != nil {
				d.fieldErrors(v, path, err)
			} else if p == 0 {
				// COUNT/week and COUNT/month without calendar: the calendar's windows in UTC.
				if l.Algorithm.Valid() && l.Algorithm != algo.FixedWindow {
					days := map[algo.CalendarUnit]string{algo.CalendarWeek: "7day", algo.CalendarMonth: "30day"}[unit]
					d.addf(v, f.at("rate"), "%s: a %s is a window of the calendar, which only fixed_window counts; use algorithm: fixed_window, or a period in days such as %d/%s", quote(s), unit, c, days)
				} else {
					a := l.Algorithm
					l, rateBad = algo.NewCalendarLimit(c, unit, time.UTC), false
					l.Algorithm = a
				}
			} else {
				l.Count, l.Period, rateBad = c, p, false
			}
		}
	}
	setInt(f, "burst", &l.Burst, 1, algo.MaxCount)
	f.setDuration("bucket", &l.Bucket, algo.MinPeriod, algo.MaxPeriod, "100ms")
	if v := f.attr("record", &record); v != nil && l.Algorithm.Valid() && !l.Algorithm.CanRecord() {
		d.addf(v, f.at("record"), "%s cannot keep recorded values; remove record or use sliding_log or fixed_window", l.Algorithm)
		record = ""
	}
	if algoMissing {
		return l, record, f, d.total == before
	}
	if rateBad {
		// Let Validate judge the other fields without repeating the rate's problem.
		l.Count, l.Period = 1, time.Second
	}
	for _, e := range flatten(l.Validate()) {
		fe, isField := errors.AsType[*algo.FieldError](e)
		if e == nil || isField && fe.Field == "rate" && rateBad {
			continue
		}
		n := f.n // the field's value if it is written, else the limit
		if isField && f.m[fe.Field].val != nil {
			n = f.m[fe.Field].val
		}
		d.fieldErrors(n, path, e)
	}
	if rateBad {
		l.Count, l.Period = 0, 0
	}
	return l, record, f, d.total == before
}

// calendar decodes a limit's calendar mapping and returns its time zone (UTC when it
// names none).
func (d *decoder) calendar(n *yaml.Node, path string) *time.Location {
	f := d.fields(n, path, calendarFields, "a mapping with timezone, e.g. calendar: {timezone: Europe/Berlin}")
	if f == nil {
		return nil
	}
	v := f.get("timezone")
	if v == nil {
		return time.UTC
	}
	name, ok := d.str(v, f.at("timezone"), "an IANA time zone name such as Europe/Berlin")
	if !ok {
		return nil
	}
	loc, err := time.LoadLocation(name)
	if err != nil || name == "" || name == "Local" {
		d.addf(v, f.at("timezone"), "%s: not an IANA time zone; use a name such as Europe/Berlin, America/New_York or UTC", quote(name))
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
	if _, _, unit, err := algo.ParseQuota(s); err == nil && unit != "" && strings.TrimSpace(u) != "" {
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
		m.Limits = append(m.Limits, l.Limit)
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
		for _, l := range r.Limits {
			if l.Record != "" {
				names = append(names, l.Record)
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

// lease decodes the lease field of the limit whose fields are lf, for the limit l as
// decoded (recording record, in a rule that is shadow or not), and returns it, or the
// zero Lease when there is none. Its problems are Lease.Problems, each at the field
// it names.
func (d *decoder) lease(lf *fields, l algo.Limit, record string, shadow bool) Lease {
	f := lf.sub("lease", leaseFields, "a lease: a mapping with units and for, e.g. lease: {units: 50, for: 100ms}")
	if f == nil {
		return Lease{}
	}
	var ls Lease
	nodes := map[string]*yaml.Node{"": f.n}
	ok := map[string]bool{"": true}
	if u := f.need("units", "say how many units to reserve at a time, e.g. units: 50"); u != nil {
		nodes["units"] = u
		ls.Units, ok["units"] = d.integer(u, f.at("units"), 1, algo.MaxCount)
	}
	if t := f.need("for", "say how long a reservation may be spent from, e.g. for: 100ms"); t != nil {
		nodes["for"] = t
		ls.For, ok["for"] = d.duration(t, f.at("for"), MinLeaseFor, MaxLeaseFor, "100ms")
	}
	for _, pr := range ls.Problems(l, record, shadow) {
		if ok[pr[0]] { // a field that did not decode has had its problem
			d.add(nodes[pr[0]], strings.TrimSuffix(f.path+"."+pr[0], "."), pr[1])
		}
	}
	return ls
}

// replicas decodes the replicas field of the limit whose fields are lf (see
// algo.Replicas), or returns the zero value when there is none.
func (d *decoder) replicas(lf *fields) algo.Replicas {
	f := lf.sub("replicas", replicasFields, "a mapping with count and timeout, e.g. replicas: {count: 1, timeout: 5ms}")
	if f == nil {
		return algo.Replicas{}
	}
	var rp algo.Replicas
	if c := f.need("count", "say how many replicas must acknowledge each charge, e.g. count: 1"); c != nil {
		n, _ := d.integer(c, f.at("count"), 1, MaxReplicas)
		rp.Count = int(n)
	}
	if t := f.need("timeout", "say how long the master may wait for them, e.g. timeout: 5ms"); t != nil {
		rp.Timeout, _ = d.duration(t, f.at("timeout"), MinReplicasTimeout, MaxReplicasTimeout, "5ms")
		if rp.Timeout%time.Millisecond != 0 {
			d.add(t, f.at("timeout"), "Redis waits in whole milliseconds; round it, e.g. timeout: 5ms")
		}
	}
	if rp.Count == 0 || rp.Timeout == 0 {
		return algo.Replicas{}
	}
	return rp
}

// rlqs: the decoding of a rule's rlqs field (see RLQS).

// rlqs decodes the rlqs field of rule r (whose fields are f), or returns nil when
// there is none. Its problems name the field and the limit they are about.
func (d *decoder) rlqs(f *fields, r *Rule, path string) *RLQS {
	fl, v, present := f.lookup("rlqs")
	if !present || v == nil {
		return nil
	}
	if isNull(v) {
		d.add(fl.key, f.at("rlqs"), "want a mapping; write rlqs: {} to serve the rule to Envoy's rate limit quota filter with the defaults")
		return nil
	}
	rf := f.sub("rlqs", rlqsFields, "a mapping, e.g. rlqs: {} or rlqs: {reporting_interval: 5s}")
	if rf == nil {
		return nil
	}
	q := &RLQS{ReportingInterval: DefaultRLQSReportingInterval}
	if n := rf.get("reporting_interval"); n != nil {
		if iv, ok := d.duration(n, rf.at("reporting_interval"), MinRLQSReportingInterval, MaxRLQSReportingInterval, "5s"); ok {
			if iv%time.Second != 0 {
				d.add(n, rf.at("reporting_interval"), "Envoy reports in whole seconds; round it, e.g. reporting_interval: 5s")
			} else {
				q.ReportingInterval = iv
			}
		}
	}
	for _, pr := range q.Problems(r) {
		d.add(rf.n, path+"."+pr[0], pr[1])
	}
	return q
}
