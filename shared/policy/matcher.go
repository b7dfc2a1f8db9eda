package policy

import (
	"fmt"
	"regexp"
	"strings"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// A Matcher is what a rule wants of one attribute, compiled once when the policy
// loads. As written in a policy:
//
//	"*"                   any value; one limit per distinct value
//	GET                   exactly this value
//	[POST, PUT]           any of these values (each exact or a prefix)
//	/api/*                any value starting with /api/
//	/users/{id}/orders    a path of these segments, {…} standing for any one segment
//	"!GET", "!/admin/*"   any value the rest does not match
//	"~^Mozilla/"          any value the RE2 regular expression matches
//	{each: "/api/*"}      what the pattern matches, with a limit per distinct value
//
// Every form but "*" and {each: …} keys its limit by the form as written, not by the
// value: all the values a prefix, list, template, negation or expression matches share
// one limit, so the number of keys stays bounded however many values clients send.
type Matcher struct {
	// Text is the matcher as written (a list as "[a, b]").
	Text string

	any      bool
	not      bool
	exact    []string // values, when the matcher is exact or a list
	prefixes []string // prefixes ("/api/" of "/api/*"), alone or in a list
	segments []string // a template's segments
	params   []bool   // per segment, whether it is a {…} parameter
	re       *regexp.Regexp
	key      string // the escaped text the key holds (every form but "*")
	each     bool   // the key holds the value, as for "*"
}

// maxPattern bounds a pattern, as attribute values are bounded.
const maxPattern = 1024

// parseMatcher compiles one scalar pattern.
func parseMatcher(s string) (Matcher, error) {
	m := Matcher{Text: s, key: algo.Escape(s)}
	switch {
	case s == "":
		return m, fmt.Errorf(`the value is empty; write the value to match, or "*" for any value`)
	case len(s) > maxPattern:
		return m, fmt.Errorf("the pattern is %d bytes; at most %d", len(s), maxPattern)
	case s == "*":
		m.any = true
		return m, nil
	case strings.HasPrefix(s, "!"):
		inner, err := parseMatcher(s[1:])
		if err != nil {
			return m, err
		}
		if inner.any || inner.not {
			return m, fmt.Errorf(`%q: negate a value or a pattern, not "*" or another negation`, s)
		}
		inner.Text, inner.key, inner.not = s, m.key, true
		return inner, nil
	case strings.HasPrefix(s, "~"):
		re, err := regexp.Compile(s[1:])
		if err != nil {
			return m, fmt.Errorf("%q: not an RE2 regular expression: %v", s, err)
		}
		m.re = re
		return m, nil
	case strings.Contains(s, "{"):
		for _, seg := range strings.Split(s, "/") {
			switch {
			case strings.HasPrefix(seg, "{") && strings.HasSuffix(seg, "}") && len(seg) > 2 && !strings.ContainsAny(seg[1:len(seg)-1], "{}"):
				m.segments, m.params = append(m.segments, seg), append(m.params, true)
				continue
			case strings.ContainsAny(seg, "{}"):
				return m, fmt.Errorf("%q: a template's parameter is a whole segment, e.g. /users/{id}/orders", s)
			}
			m.segments, m.params = append(m.segments, seg), append(m.params, false)
		}
		return m, nil
	case strings.HasSuffix(s, "*"):
		m.prefixes = []string{strings.TrimSuffix(s, "*")}
		return m, nil
	}
	m.exact = []string{s}
	return m, nil
}

// eachMatcher compiles {each: pattern}: the pattern's values, each with a limit of
// its own.
func eachMatcher(pattern string) (Matcher, error) {
	m, err := parseMatcher(pattern)
	if err != nil {
		return m, err
	}
	if m.any {
		return m, fmt.Errorf(`{each: "*"} is "*"; write "*"`)
	}
	m.Text, m.each = "{each: "+pattern+"}", true
	return m, nil
}

// listMatcher compiles a list of values, each exact or a prefix.
func listMatcher(values []string) (Matcher, error) {
	text := "[" + strings.Join(values, ", ") + "]"
	m := Matcher{Text: text, key: algo.Escape(text)}
	if len(values) == 0 {
		return m, fmt.Errorf("the list is empty; list the values to match")
	}
	for _, v := range values {
		e, err := parseMatcher(v)
		switch {
		case err != nil:
			return m, err
		case len(e.exact) == 1:
			m.exact = append(m.exact, e.exact[0])
		case len(e.prefixes) == 1 && !e.not:
			m.prefixes = append(m.prefixes, e.prefixes[0])
		default:
			return m, fmt.Errorf("%q: a list holds values and prefixes (/api/*); write other patterns as rules of their own", v)
		}
	}
	return m, nil
}

// Matches reports whether v satisfies the matcher.
func (m *Matcher) Matches(v string) bool {
	if m.any {
		return true
	}
	return m.matches(v) != m.not
}

func (m *Matcher) matches(v string) bool {
	for _, e := range m.exact {
		if v == e {
			return true
		}
	}
	for _, p := range m.prefixes {
		if strings.HasPrefix(v, p) {
			return true
		}
	}
	if m.re != nil {
		return m.re.MatchString(v)
	}
	if m.segments != nil {
		for i, want := range m.segments {
			seg, rest, more := strings.Cut(v, "/")
			if m.params[i] && seg == "" || !m.params[i] && seg != want || more != (i < len(m.segments)-1) {
				return false
			}
			v = rest
		}
		return true
	}
	return false
}

// keyValue returns what a key holds for a value v the matcher matched: v escaped
// for "*" and {each: …}, the matcher's own text escaped for every other form.
func (m *Matcher) keyValue(v string) string {
	if m.any || m.each {
		return algo.Escape(v)
	}
	return m.key
}

// MatchText returns what the rule wants of each attribute, as written.
func (r *Rule) MatchText() map[string]string {
	out := make(map[string]string, len(r.Match))
	for a, m := range r.Match {
		out[a] = m.Text
	}
	return out
}
