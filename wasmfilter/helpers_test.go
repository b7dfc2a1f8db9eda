package main

import (
	"encoding/json"
	"testing"
	"time"
)

func TestCheckBody(t *testing.T) {
	t.Parallel()
	got := string(checkBody("public-api", []value{{"api_key", "k1"}, {"path", "/search"}}, 1))
	want := `{"domain":"public-api","attributes":{"api_key":"k1","path":"/search"},"cost":1}`
	if got != want {
		t.Errorf("checkBody = %s, want %s", got, want)
	}
	if got := string(checkBody("d", nil, 0)); got != `{"domain":"d","attributes":{},"cost":0}` {
		t.Errorf("checkBody(no attributes) = %s", got)
	}
	// A query string keeps its & as it is (shorter, and as a reader of the callout in
	// a log sees it); quotes, control characters and invalid UTF-8 are escaped, and
	// the body decodes to the values.
	attrs := []value{{"path_with_query", "/search?q=a&page=2<b>"}, {"user_agent", "x\"y\\z\n\x00\xff"}}
	body := checkBody("d", attrs, 1)
	want = `{"domain":"d","attributes":{"path_with_query":"/search?q=a&page=2<b>","user_agent":"x\"y\\z\n\u0000\ufffd"},"cost":1}`
	if string(body) != want {
		t.Errorf("checkBody = %s, want %s", body, want)
	}
	var back struct{ Attributes map[string]string }
	if err := json.Unmarshal(body, &back); err != nil || back.Attributes["path_with_query"] != attrs[0].value {
		t.Errorf("checkBody = %s: decodes to %+v, %v", body, back, err)
	}
}

func TestHostOnly(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"192.0.2.7:41234":     "192.0.2.7",
		"192.0.2.7":           "192.0.2.7",
		"[2001:db8::1]:443":   "2001:db8::1",
		"2001:db8::1":         "2001:db8::1",
		"[2001:db8::1":        "[2001:db8::1",
		"envoy://internal:80": "envoy://internal:80",
		"":                    "",
	} {
		if got := hostOnly(in); got != want {
			t.Errorf("hostOnly(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTruncateUTF8(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"abcdef", 3, "abc"},
		{"ab", 3, "ab"},
		{"aé", 2, "a"},
		{"a😀", 4, "a"},
		{"a😀", 5, "a😀"},
		{"\x80\x80\x80\x80\x80\x80", 5, "\x80\x80"}, // not UTF-8: cut at most 3 bytes early
	} {
		if got := truncateUTF8(tc.in, tc.n); got != tc.want {
			t.Errorf("truncateUTF8(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

func TestAgeLimitHeader(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in      string
		elapsed int64
		want    string
	}{
		{`"per-key";r=0;t=17`, 5, `"per-key";r=0;t=12`},
		{`"per-key";r=0;t=17`, 30, `"per-key";r=0;t=0`},
		{`"a";r=0;t=17, "b";r=3;t=2`, 4, `"a";r=0;t=13, "b";r=3;t=0`},
		{`"a";r=0;t=17`, 0, `"a";r=0;t=17`},
		{`"a";r=0;t=`, 3, `"a";r=0;t=`},
	} {
		if got := ageLimitHeader(tc.in, tc.elapsed); got != tc.want {
			t.Errorf("ageLimitHeader(%q, %d) = %q, want %q", tc.in, tc.elapsed, got, tc.want)
		}
	}
}

func TestDenyEntryRoundTrip(t *testing.T) {
	t.Parallel()
	e := denyEntry{identity: "{\"api_key\":\"k\n1\"}", until: 1700000017000, stored: 1700000000500, rule: "per-key",
		policy: `"per-key";q=5;w=60`, limit: `"per-key";r=0;t=60`, xLimit: "5", xReset: "60"}
	got, ok := decodeDenyEntry(e.encode())
	want := e
	want.identity = `{"api_key":"k 1"}`
	if !ok || got != want {
		t.Errorf("decodeDenyEntry(encode(%+v)) = %+v, %v; want %+v", e, got, ok, want)
	}
	for _, bad := range []string{"", "tg1", "tg2\n1\n2\n\n\n\n\n\n", "tg1\nx\n2\n\n\n\n\n\n"} {
		if _, ok := decodeDenyEntry([]byte(bad)); ok {
			t.Errorf("decodeDenyEntry(%q) accepted", bad)
		}
	}

	now := time.UnixMilli(1700000005000)
	hs := e.headers(now)
	for name, want := range map[string]string{"retry-after": "12", "ratelimit": `"per-key";r=0;t=56`, "x-ratelimit-reset": "56", "x-ratelimit-remaining": "0"} {
		if got, _ := headerValue(hs, name); got != want {
			t.Errorf("headers at +4.5s: %s = %q, want %q", name, got, want)
		}
	}
}
