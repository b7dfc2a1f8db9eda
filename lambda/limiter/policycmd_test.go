package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/reload"
)

const shippedPolicy = "../policy.yaml"

func runPolicy(t *testing.T, args ...string) (int, string) {
	t.Helper()
	var out bytes.Buffer
	code := policyCommand(context.Background(), args, &out)
	return code, out.String()
}

// TestPolicyCheck runs `policy check` on the shipped policy and on a broken one.
func TestPolicyCheck(t *testing.T) {
	t.Parallel()
	if code, out := runPolicy(t, "check", shippedPolicy); code != 0 || !strings.Contains(out, `ok: domain "public-api", 7 rules`) {
		t.Errorf("check %s = %d, %q; want 0 and a summary", shippedPolicy, code, out)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("domain: d\nrules:\n  - name: a\n    limits: [{algorithm: gcra, rate: 10/x}]\n  - name: a\n    limits: [{algorithm: gcra, rate: 1/s, colour: red}]\n"), 0o600)
	code, out := runPolicy(t, "check", shippedPolicy, bad)
	for _, want := range []string{`rules[0].limits[0].rate: "10/x"`, "(line 4)", `rules[1].name: "a" is used by rules[0]`, "rules[1].limits[0].colour: unknown field"} {
		if !strings.Contains(out, want) {
			t.Errorf("check of a broken policy: output %q lacks %q", out, want)
		}
	}
	if code != 1 {
		t.Errorf("check with a broken policy = %d, want 1", code)
	}
	if code, _ := runPolicy(t, "check"); code != 2 {
		t.Errorf("check without a file = %d, want 2", code)
	}
	if code, out := runPolicy(t, "explain", shippedPolicy, "path"); code != 2 || !strings.Contains(out, "ATTRIBUTE=VALUE") {
		t.Errorf("explain with a bare word = %d, %q; want 2 and the form", code, out)
	}
}

// TestPolicyExplain explains requests against the shipped policy on a real
// redis-server after a few charges: the matching rules, why the others do not apply,
// every key with its slot, and each limit's state, which explaining does not charge.
func TestPolicyExplain(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	p, err := policy.Load(shippedPolicy)
	if err != nil {
		t.Fatal(err)
	}
	// A loaded machine must not turn these charges into the failure mode's (the
	// explanation checks what they left).
	p.Failure.Timeout = 5 * time.Second
	st, err := redisstore.Open(redisstore.Config{URL: "redis://" + srv.Addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	login := map[string]string{"path": "/login", "remote_address": "[2001:db8:1:2::7]:443", "user": "bob"}
	for range 3 {
		if _, err := eng.Check(context.Background(), engine.Request{Domain: p.Domain, Attributes: login, Cost: 1}); err != nil {
			t.Fatal(err)
		}
	}
	args := []string{"explain", "--redis", "redis://" + srv.Addr, shippedPolicy, "path=/login", "remote_address=[2001:db8:1:2::7]:443", "user=bob"}
	for round := range 2 { // the second run sees the same counts: explaining charges nothing
		code, out := runPolicy(t, args...)
		for _, want := range []string{
			"client address: 2001:db8:1:2::/64",
			"rule login-per-ip: applies",
			"sliding_log 5/min: 2 of 5 left",
			`rule per-key: does not apply: no api_key; the rule wants any value`,
			"(slot ",
			"an API key is required",
		} {
			if want == "an API key is required" {
				if strings.Contains(out, want) {
					t.Errorf("round %d: a request limited by address must not need a key: %q", round, out)
				}
				continue
			}
			if !strings.Contains(out, want) {
				t.Errorf("round %d: explain output lacks %q:\n%s", round, want, out)
			}
		}
		if code != 0 {
			t.Errorf("explain = %d, want 0", code)
		}
	}
	code, out := runPolicy(t, "explain", shippedPolicy, "path=/items")
	if code != 0 || !strings.Contains(out, "an API key is required") {
		t.Errorf("explain of an anonymous /items = %d:\n%s\nwant the key requirement", code, out)
	}
}

// TestPolicyExplainOverride explains a request whose customer limit replaces the
// default, and one an unlimited rule admits.
func TestPolicyExplainOverride(t *testing.T) {
	t.Parallel()
	f := filepath.Join(t.TempDir(), "p.yaml")
	os.WriteFile(f, []byte(`domain: d
rules:
  - {name: per-key, match: {api_key: "*"}, limits: [{algorithm: gcra, rate: 10/s}]}
  - {name: acme, match: {api_key: k-acme}, replaces: [per-key], limits: [{algorithm: gcra, rate: 100/s}]}
  - {name: internal, match: {api_key: k-internal}, unlimited: true, replaces: [per-key]}
`), 0o600)
	_, out := runPolicy(t, "explain", f, "api_key=k-acme")
	for _, want := range []string{"rule per-key: applies, but acme replaces it", "rule acme: applies", "gcra 100/s"} {
		if !strings.Contains(out, want) {
			t.Errorf("explain k-acme: output lacks %q:\n%s", want, out)
		}
	}
	_, out = runPolicy(t, "explain", f, "api_key=k-internal")
	if !strings.Contains(out, "rule internal: applies (unlimited: admits without a limit)") || !strings.Contains(out, "rule per-key: applies, but internal replaces it") {
		t.Errorf("explain k-internal:\n%s\nwant internal unlimited and per-key replaced", out)
	}
}

// TestERLConfigServed starts the service as main does with envoyproxy/ratelimit's
// integration configurations and asks POST /json for a domain of each: the ERL
// domains and the policy's are all served.
func TestERLConfigServed(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"TOLLGATE_POLICY": "../policy.yaml", "TOLLGATE_ERL_CONFIG": t.TempDir()}), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newService(context.Background(), c, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "no configuration file") {
		t.Errorf("newService with an empty ERL directory = %v, want an error naming the missing files", err)
	}
	dir := t.TempDir()
	for _, f := range []string{"basic.yaml", "another.yaml"} {
		b, err := os.ReadFile(filepath.Join("..", "..", "shared", "erl", "testdata", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(dir, f), b, 0o600)
	}
	c.ERLConfig = dir
	s, err := newService(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for domain, entry := range map[string]string{"basic": "key1", "another": "key2", "public-api": "api_key"} {
		rec := httptest.NewRecorder()
		body := `{"domain": "` + domain + `", "descriptors": [{"entries": [{"key": "` + entry + `", "value": "v"}]}]}`
		s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"OK"`) {
			t.Errorf("POST /json for domain %s = %d %s, want 200 OK", domain, rec.Code, rec.Body)
		}
		if strings.Contains(rec.Body.String(), "RateLimit-Limit") {
			t.Errorf("POST /json for domain %s = %s, want no RateLimit-Limit without LIMIT_RESPONSE_HEADERS_ENABLED", domain, rec.Body)
		}
	}

	// ERL's switch for its response headers reaches the service's answers.
	c, err = loadConfig(env(map[string]string{"TOLLGATE_POLICY": "../policy.yaml", "TOLLGATE_ERL_CONFIG": dir, "LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "X-Reset"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := newService(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	rec := httptest.NewRecorder()
	s2.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain": "basic", "descriptors": [{"entries": [{"key": "key1", "value": "v"}]}]}`)))
	if body := rec.Body.String(); rec.Code != http.StatusOK || !strings.Contains(body, `"RateLimit-Limit"`) || !strings.Contains(body, `"X-Reset"`) {
		t.Errorf("POST /json with LIMIT_RESPONSE_HEADERS_ENABLED = %d %s, want RateLimit-Limit and X-Reset among the headers", rec.Code, body)
	}
}

// TestERLConfigReload changes an envoyproxy/ratelimit file under a running service: a
// valid change applies at the next reload, an invalid one (or a renamed domain) is
// refused with its reason and the running version keeps deciding.
func TestERLConfigReload(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "reloaded.yaml")
	write := func(doc string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(erlDoc("reloaded", 2))
	s := erlService(t, dir)
	const one = `{"domain": "reloaded", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]}`
	askWith := func(body string) string {
		t.Helper()
		rec := httptest.NewRecorder()
		s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		if rec.Code != http.StatusOK && rec.Code != http.StatusTooManyRequests {
			t.Fatalf("POST /json = %d %s", rec.Code, rec.Body)
		}
		return rec.Body.String()
	}
	ask := func() string { t.Helper(); return askWith(one) }
	for i := range 2 {
		if got := ask(); !strings.Contains(got, `"OK"`) {
			t.Fatalf("request %d under 2 a minute = %s, want OK", i+1, got)
		}
	}
	if got := ask(); !strings.Contains(got, `"OVER_LIMIT"`) {
		t.Fatalf("third request under 2 a minute = %s, want OVER_LIMIT", got)
	}

	write(erlDoc("reloaded", 5))
	if result, err := s.erlDir.Reload(context.Background()); result != reload.Applied {
		t.Fatalf("Reload after raising the limit = %s, %v; want %s", result, err, reload.Applied)
	}
	for i := range 3 {
		if got := ask(); !strings.Contains(got, `"OK"`) || !strings.Contains(got, `"requestsPerUnit":5`) {
			t.Fatalf("request %d after the reload to 5 a minute = %s, want OK under 5", i+1, got)
		}
	}

	for _, bad := range []struct{ doc, want string }{
		{"domain: reloaded\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n", "fortnight"},
		{"domain: reloaded\ndescriptors: [", "reloaded.yaml"},
	} {
		write(bad.doc)
		result, err := s.erlDir.Reload(context.Background())
		if result != reload.Invalid || err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Reload of %q = %s, %v; want %s naming %q", bad.doc, result, err, reload.Invalid, bad.want)
		}
		if got := ask(); !strings.Contains(got, `"requestsPerUnit":5`) {
			t.Errorf("after the refused reload of %q: %s, want the running limit of 5 a minute", bad.doc, got)
		}
	}

	// A reload that adds a replacement applies it too (the domain's replaces).
	write(`domain: reloaded
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5, name: per-k}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 50, name: gold, replaces: [{name: per-k}]}
`)
	if result, err := s.erlDir.Reload(context.Background()); result != reload.Applied {
		t.Fatalf("Reload adding a replacement = %s, %v; want %s", result, err, reload.Applied)
	}
	const gold = `{"domain": "reloaded", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}, {"entries": [{"key": "plan", "value": "gold"}]}]}`
	for i := range 6 {
		if got := askWith(gold); !strings.Contains(got, `"overallCode":"OK"`) {
			t.Fatalf("gold request %d after the reload = %s, want OK: gold's 50 a minute replaces per-k's 5", i+1, got)
		}
	}
}

// erlDoc is an envoyproxy/ratelimit file of domain with one descriptor, k, limited to
// n a minute.
func erlDoc(domain string, n int) string {
	return fmt.Sprintf("domain: %s\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: %d}\n", domain, n)
}

// erlService starts the decision service on the shipped policy and the
// envoyproxy/ratelimit files in dir, with the embedded Redis.
func erlService(t *testing.T, dir string) *service {
	t.Helper()
	c, err := loadConfig(env(map[string]string{"TOLLGATE_POLICY": "../policy.yaml", "TOLLGATE_ERL_CONFIG": dir}), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newService(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}
