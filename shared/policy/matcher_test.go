package policy

import (
	"strings"
	"testing"
)

func TestMatcher(t *testing.T) {
	t.Parallel()
	tests := []struct {
		pattern string
		yes, no []string
		perKey  bool // keyed by the value rather than the pattern
	}{
		{"*", []string{"", "anything", "{x}"}, nil, true},
		{"GET", []string{"GET"}, []string{"get", "GETS", ""}, false},
		{"/api/*", []string{"/api/", "/api/v1/items"}, []string{"/ap", "/v1/api/", ""}, false},
		{"/users/{id}/orders", []string{"/users/42/orders", "/users/x-y/orders"}, []string{"/users//orders", "/users/42/orders/7", "/users/42", "/users/4/2/orders", "/accounts/42/orders"}, false},
		{"/{tenant}/*", nil, []string{"/a/b"}, false}, // a template, whose segment "*" is literal
		{"!GET", []string{"POST", ""}, []string{"GET"}, false},
		{"!/admin/*", []string{"/api"}, []string{"/admin/users"}, false},
		{"~^Mozilla/[0-9]", []string{"Mozilla/5.0 (X11)"}, []string{"curl/8", "mozilla/5"}, false},
		{"!~^curl/", []string{"Mozilla/5.0"}, []string{"curl/8.1"}, false},
	}
	for _, tt := range tests {
		m, err := parseMatcher(tt.pattern)
		if err != nil {
			t.Fatalf("parseMatcher(%q) = %v", tt.pattern, err)
		}
		for _, v := range tt.yes {
			if !m.Matches(v) {
				t.Errorf("%q.Matches(%q) = false, want true", tt.pattern, v)
			}
		}
		for _, v := range tt.no {
			if m.Matches(v) {
				t.Errorf("%q.Matches(%q) = true, want false", tt.pattern, v)
			}
		}
		a, b := m.keyValue("/users/42/orders"), m.keyValue("/users/43/orders")
		if (a != b) != tt.perKey {
			t.Errorf("%q: keys for two values %q and %q; want them distinct: %v", tt.pattern, a, b, tt.perKey)
		}
	}
	each, err := eachMatcher("/api/*")
	if err != nil || !each.Matches("/api/x") || each.Matches("/other") || each.keyValue("/api/x") == each.keyValue("/api/y") {
		t.Errorf(`{each: "/api/*"}: %v; want /api/ values matched, each keyed apart`, err)
	}
	if _, err := eachMatcher("*"); err == nil {
		t.Error(`{each: "*"} accepted, want it refused as "*"`)
	}
	list, err := listMatcher([]string{"POST", "PUT", "/batch/*"})
	if err != nil {
		t.Fatal(err)
	}
	for v, want := range map[string]bool{"POST": true, "PUT": true, "/batch/x": true, "GET": false, "POSTS": false} {
		if list.Matches(v) != want {
			t.Errorf("[POST, PUT, /batch/*].Matches(%q) = %v, want %v", v, !want, want)
		}
	}
	if list.Text != "[POST, PUT, /batch/*]" || list.keyValue("POST") != list.keyValue("PUT") {
		t.Errorf("list text %q, keys %q and %q; want one shared key", list.Text, list.keyValue("POST"), list.keyValue("PUT"))
	}
	for _, bad := range []struct{ pattern, msg string }{
		{"", "the value is empty"},
		{"!*", "negate a value or a pattern"},
		{"!!x", "negate a value or a pattern"},
		{"~(", "not an RE2 regular expression"},
		{"/users/id{x}/orders", "a template's parameter is a whole segment"},
		{strings.Repeat("a", maxPattern+1), "at most 1024"},
	} {
		if _, err := parseMatcher(bad.pattern); err == nil || !strings.Contains(err.Error(), bad.msg) {
			t.Errorf("parseMatcher(%.20q) = %v, want an error with %q", bad.pattern, err, bad.msg)
		}
	}
	if _, err := listMatcher([]string{"GET", "~x"}); err == nil || !strings.Contains(err.Error(), "a list holds values and prefixes") {
		t.Errorf("listMatcher with an expression = %v, want it refused", err)
	}
}

// FuzzMatcher compiles any pattern and matches any value: never a panic, "*" matches
// everything, a negation matches exactly what its pattern does not, and every
// pattern but "*" keys all values alike.
func FuzzMatcher(f *testing.F) {
	for _, s := range []string{"*", "GET", "/api/*", "/users/{id}/orders", "!GET", "~^a+$", "{", "/{x}/{y}"} {
		f.Add(s, "/users/1/orders")
	}
	f.Fuzz(func(t *testing.T, pattern, value string) {
		m, err := parseMatcher(pattern)
		if err != nil {
			return
		}
		got := m.Matches(value)
		if m.any && !got {
			t.Fatalf("%q does not match %q", pattern, value)
		}
		if neg, err := parseMatcher("!" + pattern); err == nil && neg.Matches(value) == got {
			t.Fatalf("%q and its negation agree on %q", pattern, value)
		}
		if !m.any && m.keyValue(value) != m.keyValue(value+"x") {
			t.Fatalf("%q keys values apart", pattern)
		}
	})
}
