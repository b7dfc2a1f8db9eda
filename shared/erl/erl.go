// Package erl reads envoyproxy/ratelimit (ERL) configuration files as they are and
// turns each into a tollgate policy document, which policy.Parse then validates like
// any other, so that tollgate's gRPC service (package rls) answers Envoy with the
// limits an ERL deployment already has.
//
// ERL matches a request's descriptor entry by entry down its tree of descriptors,
// taking at each level the node for the entry's exact value, else one whose wildcard
// value ("foo*") matches, else the node for the key alone; the limit is the one of the
// node the last entry reaches. tollgate keeps this:
//
//   - every node with a rate_limit becomes a rule matching the keys of its path,
//     each to its value (exact, a wildcard's pattern, or "*" for the key alone), plus the
//     descriptor.keys attribute (the descriptor's keys in order, joined by ","), which
//     the rls package sets, so that a rule applies only to descriptors of exactly its
//     keys, as ERL's walk does;
//   - a wildcard value ("foo*") keeps a count per value, {each: "foo*"}, or one
//     shared count with share_threshold;
//   - a node takes the place of the siblings ERL's walk would not reach past it (an
//     exact value's of the wildcards and the key alone, a wildcard's of the key alone
//     and of the wildcards after it): for each of their rules an unlimited rule under
//     it replaces it, so that a request that reaches the node gets its limits, or
//     none, never a sibling's.
//
// ERL takes any domain and key; tollgate's names are narrower (lower case, a few
// punctuation marks), so a domain or key they do not take is named in the policy by
// DomainName or AttrName, and package rls passes a descriptor entry under AttrName.
// A descriptor is an ordered list in which a key may repeat ("files" under "files"):
// an entry whose key an earlier entry of the descriptor has is passed, and matched,
// under EntryAttribute of its place instead.
//
// A wildcard is ERL's "*" at the end of a value ("foo*") or, beyond what ERL's
// current release reads, anywhere in it ("foo*bar": "*" stands for any run of
// characters); of several wildcard siblings the first in the file that matches
// wins, as in ERL. quota_mode limits are decided and reported like shadow_mode ones
// and never deny, as ERL's service answers them.
//
// Limits are fixed windows aligned to the epoch, as ERL's: unit second, minute, hour
// and day as they are, week 7 days, month 30 days, year 365 days. Fields of
// tollgate's own extend a rate_limit: unit_multiplier (a window of several units),
// algorithm, with burst (another of tollgate's algorithms), and settle (the limit of
// Envoy's response-phase call, whose cost is charged and never refused; under a
// descriptor with a rate_limit, it charges that descriptor's count). ERL's replaces acts
// across the descriptors of a request, so it is not in the policy but in
// Translation.Replaces, which package rls applies; so are the names of the unlimited
// rules and ERL's names of the limits (Translation.Unlimited, Names), which its
// answers carry. TranslateFiles loads a directory of files as ERL does, merging the
// files of one domain when asked (ERL's MERGE_DOMAIN_CONFIG).
package erl

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// KeysAttribute is the attribute that carries a descriptor's keys, in order, joined
// by ",".
const KeysAttribute = "descriptor.keys"

// reservedPrefix starts the attributes tollgate sets itself (KeysAttribute,
// EntryAttribute's): AttrName never names a key with it.
const reservedPrefix = "descriptor."

// EntryAttribute is the attribute under which package rls passes entry i (from 0) of
// a descriptor whose key an earlier entry of the same descriptor has, and under which
// a translated policy matches it.
func EntryAttribute(i int) string { return reservedPrefix + strconv.Itoa(i) }

// noneAttribute is an attribute no request carries: the rule of a domain without
// limits matches on it, so that it applies to nothing.
const noneAttribute = reservedPrefix + "none"

type rateLimit struct {
	RequestsPerUnit uint32 `yaml:"requests_per_unit"`
	Unit            string `yaml:"unit"`
	Unlimited       bool   `yaml:"unlimited"`
	Name            string `yaml:"name"`
	Replaces        []struct {
		Name string `yaml:"name"`
	} `yaml:"replaces"`
	// tollgate's extensions, which ERL does not read: a window of several units
	// (envoyproxy/ratelimit#190), and another algorithm than ERL's fixed window.
	UnitMultiplier uint32 `yaml:"unit_multiplier"`
	Algorithm      string `yaml:"algorithm"`
	Burst          int64  `yaml:"burst"`
	// Settle marks a limit whose descriptor is sent by Envoy's response-phase call
	// (apply_on_stream_done): its hits_addend is a cost already spent, charged and
	// never refused (the policy's settle).
	Settle bool `yaml:"settle"`
}

type descriptor struct {
	Key            string       `yaml:"key"`
	Value          string       `yaml:"value"`
	RateLimit      *rateLimit   `yaml:"rate_limit"`
	Descriptors    []descriptor `yaml:"descriptors"`
	ShadowMode     bool         `yaml:"shadow_mode"`
	QuotaMode      bool         `yaml:"quota_mode"`
	DetailedMetric bool         `yaml:"detailed_metric"`
	ValueToMetric  bool         `yaml:"value_to_metric"`
	ShareThreshold bool         `yaml:"share_threshold"`
}

type root struct {
	Domain      string       `yaml:"domain"`
	Descriptors []descriptor `yaml:"descriptors"`
}

// units maps ERL's units to tollgate's periods, as ERL counts them.
var units = map[string]string{"second": "s", "minute": "min", "hour": "h", "day": "day", "week": "7day", "month": "30day", "year": "365day"}

// UnitPeriod returns the length of one of ERL's units (second … year, any case):
// week, month and year are 7, 30 and 365 days, as ERL counts them.
func UnitPeriod(unit string) (time.Duration, bool) {
	text, ok := units[strings.ToLower(unit)]
	if !ok {
		return 0, false
	}
	_, d, err := algo.ParseRate("1/" + text)
	return d, err == nil
}

// step is one level of a rule's path: a key and what its value must be.
type step struct {
	key, match string
	attr       string // the attribute the entry is matched under
	rank       int    // 2 exact, 1 wildcard, 0 the key alone: ERL's order of preference
}

type rule struct {
	name      string
	erlName   string // the rate_limit's name in the file, which replaces refers to
	path      []step
	limit     string // tollgate's limit, or "" for unlimited
	shadow    bool
	settle    bool
	counter   string   // the count it shares (a settling rule and its parent's), or ""
	replaces  []string // within a descriptor: the guards of a more specific node
	guardOnly bool
	// erlReplaces are the names (in the file) of the rate_limits this one replaces
	// across the descriptors of a request.
	erlReplaces []string
}

// A Translation is one ERL configuration file as tollgate serves it.
type Translation struct {
	// Domain is the file's domain.
	Domain string
	// Policy is the tollgate policy document of its descriptors.
	Policy []byte
	// Replaces maps a rule of Policy to the rules it replaces across the descriptors
	// of one request (ERL's replaces: when a descriptor's limit names another limit,
	// that limit is not applied to any descriptor of the request). Package rls
	// applies it.
	Replaces map[string][]string
	// Unlimited names the rules of Policy that are ERL's unlimited rate_limits:
	// package rls answers a descriptor that reaches one with ERL's remaining,
	// 4294967295.
	Unlimited []string
	// Names maps each rule of Policy with a limit to the name of its rate_limit in
	// the file ("" when it has none), which ERL answers as the limit's name.
	Names map[string]string
}

// Translate turns one ERL configuration file into a tollgate policy document for its
// domain. It refuses, naming the descriptor, what ERL refuses and what it cannot keep
// ERL's meaning of. A file of no descriptors, or of none with a rate_limit, is a
// domain without limits, as in ERL.
func Translate(data []byte) (Translation, error) {
	r, err := parse(data)
	if err != nil {
		return Translation{}, err
	}
	return translate(r.Domain, r.Descriptors)
}

// A File is one ERL configuration file: its name, for errors, and its content.
type File struct {
	Name string
	Data []byte
}

// TranslateFiles translates ERL configuration files as ERL loads a directory of
// them: a domain in two files is refused unless merge (ERL's MERGE_DOMAIN_CONFIG)
// is set, in which case the files' descriptors are joined, in the order of files,
// into one domain; a descriptor two of them define is refused. An error names the
// file (or, for a domain's translation, the domain and its files). The translations are
// in the order their domains first appear.
func TranslateFiles(files []File, merge bool) ([]Translation, error) {
	type domain struct {
		descriptors []descriptor
		seen        map[string]string // key and value of a top descriptor -> its file
		files       []string
	}
	var order []string
	domains := map[string]*domain{}
	for _, f := range files {
		r, err := parse(f.Data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		d, ok := domains[r.Domain]
		switch {
		case ok && !merge:
			return nil, fmt.Errorf("%s: erl: domain %q is in another file too; give each file its own domain, or merge them (ERL's MERGE_DOMAIN_CONFIG)", f.Name, r.Domain)
		case !ok:
			d = &domain{seen: map[string]string{}}
			domains[r.Domain] = d
			order = append(order, r.Domain)
		}
		for i, ds := range r.Descriptors {
			id := ds.Key + "\x00" + ds.Value
			if other, dup := d.seen[id]; dup {
				return nil, fmt.Errorf("%s: erl: descriptors[%d]: key %q value %q is in %s too; keep it in one file", f.Name, i, ds.Key, ds.Value, other)
			}
		}
		for _, ds := range r.Descriptors {
			d.seen[ds.Key+"\x00"+ds.Value] = f.Name
		}
		d.descriptors = append(d.descriptors, r.Descriptors...)
		d.files = append(d.files, f.Name)
	}
	out := make([]Translation, 0, len(order))
	for _, name := range order {
		tr, err := translate(name, domains[name].descriptors)
		if err != nil {
			return nil, fmt.Errorf("domain %q (%s): %w", name, strings.Join(domains[name].files, " + "), err)
		}
		out = append(out, tr)
	}
	return out, nil
}

// parse reads one file, refusing what ERL refuses of its form: YAML it cannot read, a
// field it does not know, an empty domain.
func parse(data []byte) (root, error) {
	var r root
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil && !errors.Is(err, io.EOF) {
		return root{}, fmt.Errorf("erl: %w", err)
	}
	if r.Domain == "" {
		return root{}, errors.New("erl: domain is empty; name the domain Envoy's filter sends")
	}
	return r, nil
}

func translate(domain string, descriptors []descriptor) (Translation, error) {
	var t translator
	if err := t.walk(nil, nil, "descriptors", descriptors); err != nil {
		return Translation{}, err
	}
	replaces, err := t.crossReplaces()
	if err != nil {
		return Translation{}, err
	}
	tr := Translation{Domain: domain, Policy: t.document(domain), Replaces: replaces, Names: map[string]string{}}
	for _, r := range t.rules {
		switch {
		case r.guardOnly:
		case r.limit == "":
			tr.Unlimited = append(tr.Unlimited, r.name)
		default:
			tr.Names[r.name] = r.erlName
		}
	}
	return tr, nil
}

// crossReplaces resolves each rate_limit's replaces, which name other rate_limits by
// their names in the file, to the names of their rules.
func (t *translator) crossReplaces() (map[string][]string, error) {
	byName := map[string][]string{} // ERL applies a replacement to every limit of the name
	for _, r := range t.rules {
		if r.erlName != "" {
			byName[r.erlName] = append(byName[r.erlName], r.name)
		}
	}
	var out map[string][]string
	for _, r := range t.rules {
		for _, n := range r.erlReplaces {
			targets, ok := byName[n]
			if !ok {
				return nil, fmt.Errorf("erl: rate_limit %s replaces %q, which no rate_limit of the file is named; name it, or remove the replacement", r.name, n)
			}
			if out == nil {
				out = map[string][]string{}
			}
			out[r.name] = append(out[r.name], targets...)
		}
	}
	return out, nil
}

type translator struct {
	rules []*rule
	names map[string]bool
	attrs map[string]string // AttrName -> the key that has it, so no two keys share one
}

// key checks the key of the descriptor at at and returns the attribute its entry is
// matched under, at its place on the path parent: AttrName's, or, when an enclosing
// descriptor has the same key (a descriptor is an ordered list, a key may repeat),
// EntryAttribute's. No two keys of the file may have the same AttrName.
func (t *translator) key(at string, parent []step, key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("erl: %s: key is empty; name the descriptor's key", at)
	}
	attr := AttrName(key)
	if t.attrs == nil {
		t.attrs = map[string]string{}
	}
	if other, ok := t.attrs[attr]; ok && other != key {
		return "", fmt.Errorf("erl: %s: keys %q and %q both become attribute %q; rename one of them", at, other, key, attr)
	}
	t.attrs[attr] = key
	for _, s := range parent {
		if s.key == key {
			return EntryAttribute(len(parent)), nil
		}
	}
	return attr, nil
}

// valueStep is how a descriptor's value is matched: the key alone (no value), a
// wildcard (a value with "*": its values each with a count of their own, or one
// count with share), or the value exactly.
func valueStep(key, attr, value string, share bool) step {
	s := step{key: key, attr: attr, match: "*"}
	switch {
	case value == "":
	case strings.Contains(value, "*"):
		s.match, s.rank = wildcard(value), 1
		if !share {
			s.match = "{each: " + yamlString(s.match) + "}"
		}
	default:
		s.match, s.rank = exact(value), 2
	}
	return s
}

// wildcard writes an ERL wildcard value as tollgate's pattern: a prefix ("foo*") as it
// is when tollgate reads it as one, any other as an anchored expression in which
// each "*" stands for any run of characters.
func wildcard(v string) string {
	if strings.Count(v, "*") == 1 && strings.HasSuffix(v, "*") && exact(strings.TrimSuffix(v, "*")+"x") == strings.TrimSuffix(v, "*")+"x" {
		return v
	}
	parts := strings.Split(v, "*")
	for i, p := range parts {
		parts[i] = regexp.QuoteMeta(p)
	}
	return "~^" + strings.Join(parts, ".*") + "$"
}

// walk translates the descriptors under the path parent (whose rate_limit's rule is
// up, or nil), then adds the guards that
// let a node take the place of the siblings ERL's walk would not reach: an exact
// value's of a wildcard's and of the key alone's, a wildcard's of the key alone's
// and of a later wildcard's.
func (t *translator) walk(up *rule, parent []step, where string, ds []descriptor) error {
	var below [][]*rule // per descriptor, the rules of its subtree
	var steps []step
	seen := map[string]bool{}
	for i, d := range ds {
		at := fmt.Sprintf("%s[%d]", where, i)
		attr, err := t.key(at, parent, d.Key)
		if err != nil {
			return err
		}
		if seen[d.Key+"\x00"+d.Value] {
			return fmt.Errorf("erl: %s: key %q value %q appears twice at this level; remove one", at, d.Key, d.Value)
		}
		seen[d.Key+"\x00"+d.Value] = true
		if d.ShareThreshold && !strings.Contains(d.Value, "*") {
			return fmt.Errorf("erl: %s: share_threshold shares the count of a wildcard value's values, and value %q has no \"*\"; write a wildcard (such as \"files/*\"), or remove share_threshold", at, d.Value)
		}
		s := valueStep(d.Key, attr, d.Value, d.ShareThreshold)
		path := append(append([]step(nil), parent...), s)
		first := len(t.rules)
		var own *rule
		if rl := d.RateLimit; rl != nil {
			if err := t.rateLimit(at, path, rl, d.ShadowMode || d.QuotaMode); err != nil {
				return err
			}
			if own = t.rules[first]; own.settle {
				if err := share(at, up, own); err != nil {
					return err
				}
			}
		}
		if err := t.walk(own, path, at+".descriptors", d.Descriptors); err != nil {
			return err
		}
		below = append(below, t.rules[first:])
		steps = append(steps, s)
	}
	for i, si := range steps {
		for j, sj := range steps {
			if si.key != sj.key || si.rank < sj.rank || si.rank == sj.rank && (si.rank != 1 || i >= j) {
				continue
			}
			if si.rank == 1 && sj.rank == 1 && !overlap(ds[i].Value, ds[j].Value) {
				continue // no value reaches both: no guard needed
			}
			for _, generic := range below[j] {
				if generic.guardOnly {
					continue
				}
				guard := &rule{path: append([]step(nil), generic.path...), replaces: []string{generic.name}, guardOnly: true}
				guard.path[len(parent)] = si
				guard.name = t.name("", append(guard.path, step{key: "over", match: generic.name}))
				t.rules = append(t.rules, guard)
			}
		}
	}
	return nil
}

// overlap reports whether two wildcard values might both match one value: always,
// unless their fixed starts or ends differ.
func overlap(a, b string) bool {
	pa, pb := a[:strings.Index(a, "*")], b[:strings.Index(b, "*")]
	sa, sb := a[strings.LastIndex(a, "*")+1:], b[strings.LastIndex(b, "*")+1:]
	return (strings.HasPrefix(pa, pb) || strings.HasPrefix(pb, pa)) && (strings.HasSuffix(sa, sb) || strings.HasSuffix(sb, sa))
}

// rateLimit adds the rule of the rate_limit rl at path, refusing what ERL refuses:
// a unit beside unlimited, a replaces entry without a name or with the limit's own.
func (t *translator) rateLimit(at string, path []step, rl *rateLimit, shadow bool) error {
	r := &rule{name: t.name(rl.Name, path), erlName: rl.Name, path: path, shadow: shadow}
	for k, rp := range rl.Replaces {
		switch {
		case rp.Name == "":
			return fmt.Errorf("erl: %s: rate_limit.replaces[%d] has no name; name the rate_limit it replaces, or remove the entry", at, k)
		case rp.Name == rl.Name:
			return fmt.Errorf("erl: %s: rate_limit %q replaces itself; a limit replaces others, so remove %q from its replaces", at, rl.Name, rp.Name)
		}
		r.erlReplaces = append(r.erlReplaces, rp.Name)
	}
	r.settle = rl.Settle
	if rl.Unlimited {
		if rl.Settle {
			return fmt.Errorf("erl: %s: rate_limit is unlimited and settles; an unlimited rate_limit has nothing to charge: remove settle, or unlimited", at)
		}
		if _, ok := UnitPeriod(rl.Unit); ok {
			return fmt.Errorf("erl: %s: rate_limit is unlimited and has unit %q; an unlimited rate_limit has no unit: remove unit (and requests_per_unit), or unlimited", at, rl.Unit)
		}
	} else {
		lim, err := limitOf(rl)
		if err != nil {
			return fmt.Errorf("erl: %s: %w", at, err)
		}
		r.limit = lim
	}
	t.rules = append(t.rules, r)
	return nil
}

// share makes the settling rule child, of the descriptor at at, charge the count of
// parent, the rule of the enclosing descriptor's rate_limit (nil for none): the
// response-phase call's descriptor is the request phase's plus the entry that marks
// it, and its cost belongs to the same count, as ERL's one descriptor for both phases
// counts it. A settling child must state the same limit as its parent.
func share(at string, parent, child *rule) error {
	if parent == nil || parent.limit == "" || parent.settle {
		return nil // nothing to share: the child counts on its own
	}
	if last := child.path[len(child.path)-1]; last.rank == 0 || strings.HasPrefix(last.match, "{each") {
		return fmt.Errorf("erl: %s: rate_limit settles into the count of its parent descriptor's rate_limit, one count per parent's value, and key %q keeps a count per value; give the descriptor a value (such as value: response), or share_threshold for a wildcard", at, last.key)
	}
	if child.limit != parent.limit {
		return fmt.Errorf("erl: %s: rate_limit settles into the count of its parent descriptor's rate_limit %s, and states %s; give it the parent's unit, requests_per_unit and extensions, or move it from under that descriptor to count on its own", at, parent.limit, child.limit)
	}
	parent.counter, child.counter = parent.name, parent.name
	return nil
}

// limitOf writes rl's limit as tollgate's: ERL's fixed window, or the algorithm of
// tollgate's extension field, over unit_multiplier units.
func limitOf(rl *rateLimit) (string, error) {
	u, ok := UnitPeriod(rl.Unit)
	if !ok || rl.RequestsPerUnit == 0 {
		return "", fmt.Errorf("rate_limit wants requests_per_unit above 0 and a unit of second, minute, hour, day, week, month or year (got %d per %q)", rl.RequestsPerUnit, rl.Unit)
	}
	rate := fmt.Sprintf("%d/%s", rl.RequestsPerUnit, units[strings.ToLower(rl.Unit)])
	if m := int64(rl.UnitMultiplier); m > 1 {
		if m > int64(algo.MaxPeriod/u) {
			return "", fmt.Errorf("rate_limit: %d × %s is longer than %v; lower unit_multiplier", m, rl.Unit, algo.MaxPeriod)
		}
		rate = algo.FormatRate(int64(rl.RequestsPerUnit), time.Duration(m)*u)
	}
	algorithm := cmp.Or(rl.Algorithm, "fixed_window")
	lim := fmt.Sprintf("{algorithm: %s, rate: %s", yamlString(algorithm), rate)
	if rl.Burst != 0 {
		lim += fmt.Sprintf(", burst: %d", rl.Burst)
	}
	return lim + "}", nil
}

// exact writes value so that tollgate matches it exactly: as it is, or, when it would
// read as one of tollgate's patterns, as an anchored expression.
func exact(v string) string {
	if v == "*" || strings.HasPrefix(v, "!") || strings.HasPrefix(v, "~") || strings.HasSuffix(v, "*") || strings.Contains(v, "{") {
		return "~^" + regexp.QuoteMeta(v) + "$"
	}
	return v
}

var unnamed = regexp.MustCompile(`[^a-z0-9_.-]+`)

// sanitize writes s in lower case with each run of characters that tollgate's names
// do not take as "-", trimmed of "-", "." and "_".
func sanitize(s string) string {
	return strings.Trim(unnamed.ReplaceAllString(strings.ToLower(s), "-"), "-._")
}

// AttrName is the attribute under which a translated policy matches a descriptor
// entry's key, and under which package rls passes the entry's value: the key itself
// when tollgate's attribute names take it (a-z, 0-9, '_', '.', '-'), else a name
// made of it (see fitName), so that ERL's keys in upper case or with other
// characters ("USER_ID", "path:prefix") keep working.
// The attributes tollgate sets itself (KeysAttribute, EntryAttribute's) start with
// "descriptor."; a key that does is named like a key tollgate's names do not take.
func AttrName(key string) string {
	valid := func(s string) bool { return policy.ValidAttribute(s) && !strings.HasPrefix(s, reservedPrefix) }
	if n := fitName(key, valid, 64); !strings.HasPrefix(n, reservedPrefix) {
		return n
	}
	return "k-" + fitName(key, valid, 62) // "descriptor.x" sanitized keeps its start
}

// DomainName is the domain of the policy a configuration file of domain becomes: the
// domain itself when tollgate's names take it, else a name made of it (fitName).
// Package rls finds a file's engine by the domain as Envoy sends it.
func DomainName(domain string) string { return fitName(domain, policy.ValidName, 63) }

// fitName returns s when valid accepts it, else s sanitized, cut to leave room for a
// hash, then "-" and 8 hex digits of s's SHA-256, so that two keys that differ only in
// case or in the characters sanitize replaces ("User", "user", "us:er") keep apart.
func fitName(s string, valid func(string) bool, maxLen int) string {
	if valid(s) {
		return s
	}
	sum := sha256.Sum256([]byte(s))
	n := sanitize(s)
	n = strings.TrimRight(n[:min(len(n), maxLen-9)], "-._")
	if n == "" {
		return hex.EncodeToString(sum[:4])
	}
	return n + "-" + hex.EncodeToString(sum[:4])
}

// name returns a unique rule name: ERL's name, or one made of the path.
func (t *translator) name(given string, path []step) string {
	if t.names == nil {
		t.names = map[string]bool{}
	}
	base := given
	if base == "" {
		parts := make([]string, len(path))
		for i, s := range path {
			parts[i] = s.key
			if s.match != "*" {
				parts[i] += "_" + s.match
			}
		}
		base = strings.Join(parts, ".")
	}
	n := sanitize(base)
	if n == "" || len(n) > 50 {
		sum := sha256.Sum256([]byte(base))
		n = strings.TrimRight(n[:min(len(n), 40)], "-._") + "-" + hex.EncodeToString(sum[:4])
		n = strings.TrimLeft(n, "-._")
	}
	for i := 2; t.names[n]; i++ {
		n = fmt.Sprintf("%s-%d", strings.TrimSuffix(n, fmt.Sprintf("-%d", i-1)), i)
	}
	t.names[n] = true
	return n
}

// document writes the rules as a tollgate policy.
func (t *translator) document(domain string) []byte {
	var b strings.Builder
	// The domain is any text (a line break in it would end the comment): quoted, in ASCII.
	fmt.Fprintf(&b, "# Translated from envoyproxy/ratelimit's configuration of domain %s.\n", strconv.QuoteToASCII(domain))
	// Each domain keeps its counts under its own prefix, as ERL keys them by domain;
	// and a Redis failure is an error, as in ERL, so that Envoy's failure_mode_deny
	// decides what it means. ERL waits for Redis as long as Envoy waits for it (the
	// filter's timeout, 20ms by default); a second bounds a decision here.
	fmt.Fprintf(&b, "domain: %s\nprefix: %s\nfailure: {mode: closed, timeout: 1s}\nrules:\n", yamlString(DomainName(domain)), yamlString(prefixOf(domain)))
	if len(t.rules) == 0 {
		// A domain without limits (ERL loads it, and answers OK with no limit): a
		// policy has a rule, so one that applies to nothing.
		fmt.Fprintf(&b, "  - {name: no-limits, match: {%s: \"*\"}, unlimited: true}\n", noneAttribute)
	}
	for _, r := range t.rules {
		fmt.Fprintf(&b, "  - name: %s\n    match: {%s: %s", r.name, KeysAttribute, yamlString(keysOf(r.path)))
		for _, s := range r.path {
			value := yamlString(s.match)
			if strings.HasPrefix(s.match, "{each: ") {
				value = s.match // a mapping, already quoted inside
			}
			fmt.Fprintf(&b, ", %s: %s", yamlString(s.attr), value)
		}
		b.WriteString("}\n")
		switch {
		case r.limit == "":
			b.WriteString("    unlimited: true\n")
		case r.counter != "":
			fmt.Fprintf(&b, "    limits: [%s, counter: %s}]\n", strings.TrimSuffix(r.limit, "}"), yamlString(r.counter))
		default:
			fmt.Fprintf(&b, "    limits: [%s]\n", r.limit)
		}
		if r.shadow {
			b.WriteString("    shadow: true\n")
		}
		if r.settle {
			b.WriteString("    settle: true\n")
		}
		if len(r.replaces) > 0 {
			fmt.Fprintf(&b, "    replaces: [%s]\n", strings.Join(r.replaces, ", "))
		}
	}
	return []byte(b.String())
}

var safeDomain = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,56}$`)

// prefixOf is the key prefix of a domain's counts: "tg:", the domain (or a hash of
// it, when it would not fit or not read well in a key) and ":".
func prefixOf(domain string) string {
	if safeDomain.MatchString(domain) {
		return "tg:" + domain + ":"
	}
	sum := sha256.Sum256([]byte(domain))
	return "tg:" + hex.EncodeToString(sum[:8]) + ":"
}

func keysOf(path []step) string {
	keys := make([]string, len(path))
	for i, s := range path {
		keys[i] = s.key
	}
	return strings.Join(keys, ",")
}

// yamlString quotes s for YAML, flow collections included: a JSON string is a YAML
// double-quoted scalar.
func yamlString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
