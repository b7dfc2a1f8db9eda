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
//     each to its value (exact, prefix, or "*" for the key alone), plus the
//     descriptor.keys attribute (the descriptor's keys in order, joined by ","), which
//     the rls package sets, so that a rule applies only to descriptors of exactly its
//     keys, as ERL's walk does;
//   - a wildcard value ("foo*") keeps a count per value, {each: "foo*"}, or one
//     shared count with share_threshold;
//   - a more specific node takes the place of its less specific siblings: for each of
//     the latter's rules an unlimited rule under the former replaces it, so that a
//     request that reaches the specific node gets its limits, or none, never the
//     generic one's.
//
// ERL takes any domain and key; tollgate's names are narrower (lower case, a few
// punctuation marks), so a domain or key they do not take is named in the policy by
// DomainName or AttrName, and package rls passes a descriptor entry under AttrName.
//
// Limits are fixed windows aligned to the epoch, as ERL's: unit second, minute, hour
// and day as they are, week 7 days, month 30 days, year 365 days. Two fields of
// tollgate's own extend a rate_limit: unit_multiplier (a window of several units) and
// algorithm, with burst (another of tollgate's algorithms). ERL's replaces acts
// across the descriptors of a request, so it is not in the policy but in
// Translation.Replaces, which package rls applies.
package erl

import (
	"cmp"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
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
	rank       int // 2 exact, 1 wildcard, 0 the key alone: ERL's order of preference
}

type rule struct {
	name      string
	erlName   string // the rate_limit's name in the file, which replaces refers to
	path      []step
	limit     string // tollgate's limit, or "" for unlimited
	shadow    bool
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
}

// Translate turns one ERL configuration file into a tollgate policy document for its
// domain. It refuses, naming the descriptor, what it cannot keep ERL's meaning of.
func Translate(data []byte) (Translation, error) {
	var r root
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
	dec.KnownFields(true)
	if err := dec.Decode(&r); err != nil {
		return Translation{}, fmt.Errorf("erl: %w", err)
	}
	if r.Domain == "" {
		return Translation{}, errors.New("erl: domain is empty")
	}
	var t translator
	if err := t.walk(nil, "descriptors", r.Descriptors); err != nil {
		return Translation{}, err
	}
	if len(t.rules) == 0 {
		return Translation{}, fmt.Errorf("erl: domain %s: no descriptor has a rate_limit", r.Domain)
	}
	replaces, err := t.crossReplaces()
	if err != nil {
		return Translation{}, err
	}
	return Translation{Domain: r.Domain, Policy: t.document(r.Domain), Replaces: replaces}, nil
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

// key checks the key of the descriptor at at, under the path parent: tollgate matches
// a descriptor's entries by their keys' attributes, so a key may appear once on a
// path, none may be the attribute the rls package reserves, and no two keys of the
// file may have the same AttrName.
func (t *translator) key(at string, parent []step, key string) error {
	if key == "" {
		return fmt.Errorf("erl: %s: key is empty", at)
	}
	attr := AttrName(key)
	if attr == KeysAttribute {
		return fmt.Errorf("erl: %s: key %q is reserved (tollgate passes a descriptor's keys under it); rename the key", at, key)
	}
	for _, s := range parent {
		if s.key == key {
			return fmt.Errorf("erl: %s: key %q is already a key of an enclosing descriptor; tollgate matches a descriptor's entries by key, so a key can appear once on a path: rename one of them", at, key)
		}
	}
	if t.attrs == nil {
		t.attrs = map[string]string{}
	}
	if other, ok := t.attrs[attr]; ok && other != key {
		return fmt.Errorf("erl: %s: keys %q and %q both become attribute %q; rename one of them", at, other, key, attr)
	}
	t.attrs[attr] = key
	return nil
}

// walk translates the descriptors under the path parent, then adds the guards that
// let a specific node take the place of its generic siblings.
func (t *translator) walk(parent []step, where string, ds []descriptor) error {
	var below [][]*rule // per descriptor, the rules of its subtree
	var steps []step
	seen := map[string]bool{}
	for i, d := range ds {
		at := fmt.Sprintf("%s[%d]", where, i)
		if err := t.key(at, parent, d.Key); err != nil {
			return err
		}
		s := step{key: d.Key, match: "*"}
		switch {
		case d.Value == "":
		case strings.HasSuffix(d.Value, "*"):
			// ERL counts each value apart unless share_threshold shares one count.
			s.match, s.rank = d.Value, 1
			if !d.ShareThreshold {
				s.match = "{each: " + yamlString(d.Value) + "}"
			}
		default:
			s.match, s.rank = exact(d.Value), 2
		}
		if seen[d.Key+"\x00"+d.Value] {
			return fmt.Errorf("erl: %s: key %q value %q appears twice", at, d.Key, d.Value)
		}
		seen[d.Key+"\x00"+d.Value] = true
		path := append(append([]step(nil), parent...), s)
		first := len(t.rules)
		if rl := d.RateLimit; rl != nil {
			r := &rule{name: t.name(rl.Name, path), erlName: rl.Name, path: path, shadow: d.ShadowMode}
			for _, rp := range rl.Replaces {
				if rl.Unlimited {
					return fmt.Errorf("erl: %s: an unlimited rate_limit with replaces is not supported yet; give it a limit, or replace from a limited rate_limit", at)
				}
				r.erlReplaces = append(r.erlReplaces, rp.Name)
			}
			if !rl.Unlimited {
				lim, err := limitOf(rl)
				if err != nil {
					return fmt.Errorf("erl: %s: %w", at, err)
				}
				r.limit = lim
			}
			t.rules = append(t.rules, r)
		}
		if err := t.walk(path, at+".descriptors", d.Descriptors); err != nil {
			return err
		}
		below = append(below, t.rules[first:])
		steps = append(steps, s)
	}
	// A node takes the place of its siblings of the same key and a lower rank.
	for i, si := range steps {
		for j, sj := range steps {
			if si.key != sj.key || si.rank <= sj.rank {
				continue
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
			_ = i
		}
	}
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
func AttrName(key string) string { return fitName(key, policy.ValidAttribute, 64) }

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
	for _, r := range t.rules {
		fmt.Fprintf(&b, "  - name: %s\n    match: {%s: %s", r.name, KeysAttribute, yamlString(keysOf(r.path)))
		for _, s := range r.path {
			value := yamlString(s.match)
			if strings.HasPrefix(s.match, "{each: ") {
				value = s.match // a mapping, already quoted inside
			}
			fmt.Fprintf(&b, ", %s: %s", yamlString(AttrName(s.key)), value)
		}
		b.WriteString("}\n")
		switch {
		case r.limit == "":
			b.WriteString("    unlimited: true\n")
		default:
			fmt.Fprintf(&b, "    limits: [%s]\n", r.limit)
		}
		if r.shadow {
			b.WriteString("    shadow: true\n")
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
