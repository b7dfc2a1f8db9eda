package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

const (
	eventsDir  = "../../events"
	testPolicy = "testdata/policy.yaml"
	testAPIKey = "demo-key-4f9a2c"
	testToken  = "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJkZW1vLXVzZXIifQ.c2lnbmF0dXJl"
)

// syncBuffer is a bytes.Buffer safe for simultaneous writes and reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testApp is an authorizer built as main builds it, with its outputs captured.
type testApp struct {
	*app
	metrics *syncBuffer
	logs    *syncBuffer
}

// newTestApp builds the authorizer from env (plus the test policy unless env names
// another) the way main does, logging at DEBUG.
func newTestApp(t *testing.T, env map[string]string) *testApp {
	t.Helper()
	if env["TOLLGATE_POLICY"] == "" && env["TOLLGATE_POLICY_JSON"] == "" && env["TOLLGATE_POLICY_SSM"] == "" {
		env["TOLLGATE_POLICY"] = testPolicy
	}
	ta := &testApp{metrics: &syncBuffer{}, logs: &syncBuffer{}}
	a, err := start(context.Background(), func(k string) string { return env[k] }, ".", ta.metrics, newLogger(ta.logs, -4))
	if err != nil {
		t.Fatalf("start() error = %v", err)
	}
	t.Cleanup(a.close)
	ta.app = a
	return ta
}

// invoke runs payload through the handler as aws-lambda-go does and decodes the
// answer.
func (ta *testApp) invoke(t *testing.T, payload []byte) (map[string]any, error) {
	t.Helper()
	out, err := lambda.NewHandler(ta.handler).Invoke(context.Background(), payload)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(out, &m); err != nil {
		t.Fatalf("answer %s is not a JSON object: %v", out, err)
	}
	return m, nil
}

func readEvent(t *testing.T, name string) []byte {
	t.Helper()
	b, err := readEventFile(name)
	if err != nil {
		t.Fatalf("read event: %v", err)
	}
	return b
}

func readEventFile(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join(eventsDir, name))
}

// answer is what a test checks in an authorizer's answer, whatever its shape.
type answer struct {
	allowed   bool
	arn       string // REST: the policy's resource
	principal string // REST: principalId
	ctx       map[string]any
}

func readAnswer(t *testing.T, s shape, m map[string]any) answer {
	t.Helper()
	var a answer
	a.ctx, _ = m["context"].(map[string]any)
	if a.ctx == nil {
		t.Fatalf("answer %v has no context", m)
	}
	if s == httpV2 {
		a.allowed, _ = m["isAuthorized"].(bool)
		if _, ok := m["policyDocument"]; ok {
			t.Errorf("HTTP API answer %v has a policyDocument, want a simple response", m)
		}
		return a
	}
	a.principal, _ = m["principalId"].(string)
	doc, _ := m["policyDocument"].(map[string]any)
	stmts, _ := doc["Statement"].([]any)
	if doc["Version"] != "2012-10-17" || len(stmts) != 1 {
		t.Fatalf("policyDocument = %v, want one statement of version 2012-10-17", doc)
	}
	st := stmts[0].(map[string]any)
	res, _ := st["Resource"].([]any)
	act, _ := st["Action"].([]any)
	if len(res) != 1 || len(act) != 1 || act[0] != "execute-api:Invoke" {
		t.Fatalf("statement = %v, want execute-api:Invoke on one resource", st)
	}
	a.arn, _ = res[0].(string)
	switch st["Effect"] {
	case "Allow":
		a.allowed = true
	case "Deny":
	default:
		t.Fatalf("Effect = %v, want Allow or Deny", st["Effect"])
	}
	return a
}

func num(t *testing.T, c map[string]any, k string) int64 {
	t.Helper()
	f, ok := c[k].(float64)
	if !ok {
		t.Fatalf("context[%q] = %#v, want a number", k, c[k])
	}
	return int64(f)
}

// modelRetryAfter is the Retry-After the Go model of the test policy's per-key
// limit gives the request after three at the same instant: what the Lua on Redis
// must give too.
func modelRetryAfter(t *testing.T) int64 {
	t.Helper()
	p, err := policy.Load(testPolicy)
	if err != nil {
		t.Fatalf("policy.Load() error = %v", err)
	}
	m := p.Rules[0].Meters[0].Meter
	now := time.Now()
	var st algo.State
	var ds []algo.Decision
	for range 4 {
		st, ds = m.Step(st, now, 1)
	}
	if ds[0].Allowed {
		t.Fatalf("model admitted the 4th request of a 3/min limit")
	}
	return algo.RetryAfterSeconds(ds[0].RetryAfter)
}

// eventCase is what the authorizer must answer to one file of events/.
type eventCase struct {
	shape  shape
	arn    string
	badErr string // non-empty: the event is not an authorizer's; the error says this
	header bool   // the event carries the X-Tenant header the policy names
	strip  func(map[string]any)
}

var eventCases = map[string]eventCase{
	"rest-request-authorizer.json": {
		shape: restRequest, arn: "arn:aws:execute-api:us-east-1:123456789012:abcdef123/test/GET/pets/42", header: true,
		strip: func(ev map[string]any) {
			delete(ev["headers"].(map[string]any), "X-Api-Key")
			delete(ev["multiValueHeaders"].(map[string]any), "X-Api-Key")
			ev["requestContext"].(map[string]any)["identity"].(map[string]any)["apiKey"] = ""
		},
	},
	"rest-token-authorizer.json": {
		shape: restToken, arn: "arn:aws:execute-api:us-east-1:123456789012:abcdef123/test/GET/pets/42",
		strip: func(ev map[string]any) { ev["authorizationToken"] = "" },
	},
	"http-api-v2-authorizer.json": {
		shape: httpV2, header: true,
		strip: func(ev map[string]any) { delete(ev["headers"].(map[string]any), "x-api-key") },
	},
	"function-url.json": {badErr: "Function URL"},
}

// TestEventFiles feeds every file of events/ through the handler, against a real
// redis-server: three requests are allowed with the context counting down, the
// fourth is denied with the Retry-After of the Go model, a request without its API
// key or token is Unauthorized, and with Redis killed the failure mode decides.
func TestEventFiles(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob(filepath.Join(eventsDir, "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no events in %s: %v", eventsDir, err)
	}
	wantRetry := modelRetryAfter(t)
	for _, f := range files {
		name := filepath.Base(f)
		tc, ok := eventCases[name]
		if !ok {
			t.Errorf("events/%s has no test case: add it to eventCases", name)
			continue
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartServer(t)
			ta := newTestApp(t, map[string]string{"REDIS_URL": srv.URL()})
			payload := readEvent(t, name)
			if tc.badErr != "" {
				_, err := ta.invoke(t, payload)
				if !errors.Is(err, ErrBadEvent) || !strings.Contains(err.Error(), tc.badErr) {
					t.Fatalf("Invoke(%s) error = %v, want a bad-event error naming %q", name, err, tc.badErr)
				}
				return
			}
			for i := 1; i <= 4; i++ {
				m, err := ta.invoke(t, payload)
				if err != nil {
					t.Fatalf("Invoke #%d error = %v", i, err)
				}
				a := readAnswer(t, tc.shape, m)
				if tc.arn != "" && a.arn != tc.arn {
					t.Errorf("Invoke #%d Resource = %q, want the method ARN %q", i, a.arn, tc.arn)
				}
				if want := i <= 3; a.allowed != want {
					t.Fatalf("Invoke #%d allowed = %v, want %v (answer %v)", i, a.allowed, want, m)
				}
				c := a.ctx
				if c["rule"] != "per-key" || num(t, c, "limit") != 3 {
					t.Errorf("Invoke #%d context = %v, want rule per-key, limit 3", i, c)
				}
				if want := int64(max(0, 3-i)); num(t, c, "remaining") != want {
					t.Errorf("Invoke #%d remaining = %d, want %d", i, num(t, c, "remaining"), want)
				}
				if reset := num(t, c, "reset"); reset < 20 || reset > 60 {
					t.Errorf("Invoke #%d reset = %d, want 20 to 60 s", i, reset)
				}
				if c["rateLimitPolicy"] != `"per-key";q=3;w=60` {
					t.Errorf("Invoke #%d rateLimitPolicy = %v, want \"per-key\";q=3;w=60", i, c["rateLimitPolicy"])
				}
				if rl, _ := c["rateLimit"].(string); !strings.HasPrefix(rl, `"per-key";r=`) {
					t.Errorf("Invoke #%d rateLimit = %v, want \"per-key\";r=…", i, c["rateLimit"])
				}
				wantRA := int64(0)
				if i == 4 {
					wantRA = wantRetry
				}
				if got := num(t, c, "retryAfter"); got != wantRA {
					t.Errorf("Invoke #%d retryAfter = %d, want %d", i, got, wantRA)
				}
			}
			if wantRetry != 20 {
				t.Errorf("model Retry-After = %d, want 20 (3/min: one every 20 s)", wantRetry)
			}

			// The header attribute reached the shadow rule's key.
			keys, err := srv.Client(t).Keys(context.Background(), "*per-tenant*").Result()
			if err != nil {
				t.Fatalf("KEYS error = %v", err)
			}
			if got := len(keys) > 0 && strings.Contains(keys[0], "acme"); got != tc.header {
				t.Errorf("per-tenant keys = %v, want a key for tenant acme: %v", keys, tc.header)
			}

			// Without the API key (or token) the request is Unauthorized.
			var ev map[string]any
			if err := json.Unmarshal(payload, &ev); err != nil {
				t.Fatalf("Unmarshal(%s) error = %v", name, err)
			}
			tc.strip(ev)
			stripped, _ := json.Marshal(ev)
			if _, err := ta.invoke(t, stripped); !errors.Is(err, ErrUnauthorized) || err.Error() != "Unauthorized" {
				t.Errorf("Invoke(no identity) error = %v, want exactly Unauthorized", err)
			}

			// With Redis gone the policy's failure mode (closed) denies. A new
			// execution environment, started while Redis is down, has no deny
			// cache to answer from.
			srv.Kill()
			ta = newTestApp(t, map[string]string{"REDIS_URL": srv.URL()})
			m, err := ta.invoke(t, payload)
			if err != nil {
				t.Fatalf("Invoke(Redis down) error = %v", err)
			}
			a := readAnswer(t, tc.shape, m)
			if a.allowed || num(t, a.ctx, "retryAfter") != 1 {
				t.Errorf("Invoke(Redis down, closed) = %v, want a denial with retryAfter 1", m)
			}
			last := lastMetric(t, ta.metrics.String())
			if last["FailureModeActivations"] != 1.0 || last["Result"] != "unavailable" {
				t.Errorf("last metric line = %v, want FailureModeActivations 1, Result unavailable", last)
			}
		})
	}
}

// lastMetric returns the last EMF line of out, decoded.
func lastMetric(t *testing.T, out string) map[string]any {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var m map[string]any
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &m); err != nil {
		t.Fatalf("metric line %q: %v", lines[len(lines)-1], err)
	}
	return m
}

// TestFailureModes kills Redis under each failure mode.
func TestFailureModes(t *testing.T) {
	t.Parallel()
	base, err := os.ReadFile(testPolicy)
	if err != nil {
		t.Fatalf("read policy: %v", err)
	}
	tests := []struct {
		mode    string
		allowed bool
	}{
		{"open", true},
		{"closed", false},
		{"local", true},
	}
	for _, tt := range tests {
		t.Run(tt.mode, func(t *testing.T) {
			t.Parallel()
			pol := strings.Replace(string(base), "mode: closed", "mode: "+tt.mode, 1)
			path := filepath.Join(t.TempDir(), "policy.yaml")
			if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
				t.Fatalf("write policy: %v", err)
			}
			srv := redistest.StartServer(t)
			ta := newTestApp(t, map[string]string{"REDIS_URL": srv.URL(), "TOLLGATE_POLICY": path})
			payload := readEvent(t, "rest-request-authorizer.json")
			if m, err := ta.invoke(t, payload); err != nil || !readAnswer(t, restRequest, m).allowed {
				t.Fatalf("Invoke(Redis up) = %v, %v; want Allow", m, err)
			}
			srv.Kill()
			for i := range 3 { // the first fails on Redis, the next on the open breaker
				m, err := ta.invoke(t, payload)
				if err != nil {
					t.Fatalf("Invoke(Redis down) #%d error = %v", i, err)
				}
				if got := readAnswer(t, restRequest, m).allowed; got != tt.allowed {
					t.Fatalf("Invoke(Redis down) #%d allowed = %v, want %v (%v)", i, got, tt.allowed, m)
				}
				if last := lastMetric(t, ta.metrics.String()); last["FailureModeActivations"] != 1.0 {
					t.Errorf("metric line = %v, want FailureModeActivations 1", last)
				}
			}
		})
	}
}

// TestTokenNeverLeaks checks that the raw token reaches neither Redis, nor the logs,
// nor the metrics, nor the principalId.
func TestTokenNeverLeaks(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	ta := newTestApp(t, map[string]string{"REDIS_URL": srv.URL()})
	payload := readEvent(t, "rest-token-authorizer.json")
	var principal string
	for range 5 {
		m, err := ta.invoke(t, payload)
		if err != nil {
			t.Fatalf("Invoke() error = %v", err)
		}
		principal, _ = m["principalId"].(string)
	}
	if want := algo.HashValue(testToken); principal != want {
		t.Errorf("principalId = %q, want the token's hash %q", principal, want)
	}
	keys, err := srv.Client(t).Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatalf("KEYS error = %v", err)
	}
	secret := "eyJhbGciOiJIUzI1NiJ9" // a part of the token
	for _, k := range keys {
		if strings.Contains(k, secret) {
			t.Errorf("Redis key %q holds the raw token", k)
		}
	}
	if len(keys) == 0 {
		t.Errorf("no keys in Redis, want the hashed token's")
	}
	for what, out := range map[string]string{"logs": ta.logs.String(), "metrics": ta.metrics.String()} {
		if strings.Contains(out, secret) {
			t.Errorf("the %s hold the raw token:\n%s", what, out)
		}
	}
}

func TestUsageIdentifierKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		env, event, want string
	}{
		{"true", "rest-request-authorizer.json", testAPIKey},
		{"true", "rest-token-authorizer.json", testToken},
		{"", "rest-request-authorizer.json", ""},
	}
	for _, tt := range tests {
		ta := newTestApp(t, map[string]string{"TOLLGATE_USAGE_IDENTIFIER_KEY": tt.env})
		m, err := ta.invoke(t, readEvent(t, tt.event))
		if err != nil {
			t.Fatalf("Invoke(%s) error = %v", tt.event, err)
		}
		got, _ := m["usageIdentifierKey"].(string)
		if got != tt.want {
			t.Errorf("usageIdentifierKey (env %q, %s) = %q, want %q", tt.env, tt.event, got, tt.want)
		}
	}
}

// TestMetricsLines checks the EMF line of a decision.
func TestMetricsLines(t *testing.T) {
	t.Parallel()
	ta := newTestApp(t, map[string]string{"AWS_LAMBDA_FUNCTION_NAME": "tg-auth", "AWS_LAMBDA_LOG_LEVEL": "WARN"})
	if _, err := ta.invoke(t, readEvent(t, "http-api-v2-authorizer.json")); err != nil {
		t.Fatalf("Invoke() error = %v", err)
	}
	m := lastMetric(t, ta.metrics.String())
	aws, _ := m["_aws"].(map[string]any)
	cw, _ := aws["CloudWatchMetrics"].([]any)
	if len(cw) != 2 || m["level"] != "WARN" {
		t.Fatalf("metric line = %v, want two directives at level WARN", m)
	}
	for k, want := range map[string]any{
		"Function": "tg-auth", "Rule": "per-key", "Result": "allowed", "Decisions": 1.0, "FailureModeActivations": 0.0,
	} {
		if m[k] != want {
			t.Errorf("metric %s = %v, want %v", k, m[k], want)
		}
	}
	if d := cw[0].(map[string]any); d["Namespace"] != "Tollgate" {
		t.Errorf("Namespace = %v, want Tollgate", d["Namespace"])
	}
	if lat, ok := m["DecisionLatency"].(float64); !ok || lat < 0 || lat > 1000 {
		t.Errorf("DecisionLatency = %v, want milliseconds", m["DecisionLatency"])
	}
	ta2 := newTestApp(t, map[string]string{"TOLLGATE_METRICS": "false"})
	if _, err := ta2.invoke(t, readEvent(t, "http-api-v2-authorizer.json")); err != nil {
		t.Fatalf("Invoke() error = %v", err)
	}
	if out := ta2.metrics.String(); out != "" {
		t.Errorf("TOLLGATE_METRICS=false wrote %q, want nothing", out)
	}
}

// TestClusterMode decides on a three-master Redis Cluster.
func TestClusterMode(t *testing.T) {
	t.Parallel()
	c := redistest.StartCluster(t)
	ta := newTestApp(t, map[string]string{"REDIS_URL": c.URL(), "REDIS_CLUSTER": "true"})
	payload := readEvent(t, "rest-request-authorizer.json")
	for i := 1; i <= 4; i++ {
		m, err := ta.invoke(t, payload)
		if err != nil {
			t.Fatalf("Invoke #%d error = %v", i, err)
		}
		if got, want := readAnswer(t, restRequest, m).allowed, i <= 3; got != want {
			t.Fatalf("Invoke #%d allowed = %v, want %v (%v)", i, got, want, m)
		}
	}
}

func TestLoadConfig(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		check   func(config) bool
		wantErr []string
	}{
		{"defaults", map[string]string{}, func(c config) bool {
			return c.PolicyPath == filepath.Join("/var/task", "policy.yaml") && c.PoolSize == 2 &&
				c.ConnMaxLifetime == time.Hour && c.Metrics && c.Function == DefaultFunction
		}, nil},
		{"inline policy", map[string]string{"TOLLGATE_POLICY_JSON": `{"domain":"d"}`}, func(c config) bool {
			return c.PolicyPath == "" && c.PolicyJSON != ""
		}, nil},
		{"everything wrong at once", map[string]string{
			"TOLLGATE_POLICY": "a", "TOLLGATE_POLICY_JSON": "{}", "REDIS_CLUSTER": "maybe",
			"REDIS_POOL_SIZE": "0", "REDIS_CONN_MAX_LIFETIME": "13h", "REDIS_IAM_USER": "u",
		}, nil, []string{"both set", "REDIS_CLUSTER", "REDIS_POOL_SIZE", "REDIS_CONN_MAX_LIFETIME", "REDIS_CACHE_NAME"}},
		{"auth without URL", map[string]string{"REDIS_AUTH_SECRET_ARN": "arn"}, nil, []string{"REDIS_URL is empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := loadConfig(func(k string) string { return tt.env[k] }, "/var/task")
			if len(tt.wantErr) > 0 {
				if err == nil {
					t.Fatalf("loadConfig() error = nil, want %v", tt.wantErr)
				}
				for _, w := range tt.wantErr {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("loadConfig() error = %v, want it to mention %q", err, w)
					}
				}
				return
			}
			if err != nil || !tt.check(c) {
				t.Fatalf("loadConfig() = %+v, %v", c, err)
			}
		})
	}
}

// TestBadPolicyFailsStart checks that a bad policy stops the start with an error
// that names the problem.
func TestBadPolicyFailsStart(t *testing.T) {
	t.Parallel()
	env := map[string]string{"TOLLGATE_POLICY_JSON": `{"domain": "d", "rules": [{"name": "BAD NAME", "limits": []}]}`}
	_, err := start(context.Background(), func(k string) string { return env[k] }, ".", &bytes.Buffer{}, newLogger(&bytes.Buffer{}, 0))
	if err == nil || !strings.Contains(err.Error(), "TOLLGATE_POLICY_JSON") || !strings.Contains(err.Error(), "rules[0]") {
		t.Fatalf("start(bad policy) error = %v, want one naming TOLLGATE_POLICY_JSON and rules[0]", err)
	}
	env = map[string]string{"TOLLGATE_POLICY": "testdata/missing.yaml"}
	_, err = start(context.Background(), func(k string) string { return env[k] }, ".", &bytes.Buffer{}, newLogger(&bytes.Buffer{}, 0))
	if err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Fatalf("start(missing policy) error = %v, want one naming the file", err)
	}
}

// shippedPolicy is the policy the authorizer is packaged with.
const shippedPolicy = "../policy.yaml"

// testARN is the method ARN (REST) or route ARN (HTTP API) of method and path.
func testARN(stage, method, path string) string {
	return "arn:aws:execute-api:us-east-1:123456789012:abcdef123/" + stage + "/" + method + path
}

// testRequest is one request as the tests send it: an empty ip, key or token is left
// out of the event.
type testRequest struct {
	shape            shape
	method, path, ip string
	key              string // REST REQUEST, HTTP API: the x-api-key header
	token            string // TOKEN
	tenant           string // the X-Tenant header
}

// event is the authorizer event of r.
func (r testRequest) event(t *testing.T) []byte {
	t.Helper()
	headers := map[string]any{"Accept": "application/json"}
	if r.key != "" {
		headers["x-api-key"] = r.key
	}
	if r.tenant != "" {
		headers["X-Tenant"] = r.tenant
	}
	var ev map[string]any
	switch r.shape {
	case restRequest:
		ev = map[string]any{
			"type": "REQUEST", "methodArn": testARN("test", r.method, r.path),
			"resource": r.path, "path": r.path, "httpMethod": r.method, "headers": headers,
			"requestContext": map[string]any{
				"stage": "test", "resourcePath": r.path, "httpMethod": r.method,
				"identity": map[string]any{"sourceIp": r.ip},
			},
		}
	case restToken:
		ev = map[string]any{"type": "TOKEN", "authorizationToken": r.token, "methodArn": testARN("test", r.method, r.path)}
	case httpV2:
		route := r.method + " " + r.path
		ev = map[string]any{
			"version": "2.0", "type": "REQUEST", "routeArn": testARN("$default", r.method, r.path),
			"routeKey": route, "rawPath": r.path, "headers": headers,
			"requestContext": map[string]any{
				"stage": "$default", "routeKey": route,
				"http": map[string]any{"method": r.method, "path": r.path, "sourceIp": r.ip},
			},
		}
	default:
		t.Fatalf("testRequest.event: shape %v", r.shape)
	}
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatalf("Marshal(event) error = %v", err)
	}
	return b
}

// TestMissingIdentity checks when a request without an API key (or token) is
// Unauthorized: only when the policy requires the key, because no non-shadow rule
// limits the request without one and a rule keyed on api_key would with one. A
// request some non-shadow rule limits without a key is decided.
func TestMissingIdentity(t *testing.T) {
	t.Parallel()
	const (
		anyRule = "*" // decided: allowed, whatever the deciding rule
		noRule  = ""  // decided: allowed, no rule applies
		unauth  = "Unauthorized"
	)
	// Policies written inline: none limits by api_key; a shadow rule keys on it; a
	// rule keys on it for one path only.
	noKeyRules := `{"domain": "d", "rules": [{"name": "per-ip", "match": {"remote_address": "*", "path": "/login"}, "limits": [{"algorithm": "gcra", "rate": "5/min"}]}]}`
	shadowKeyRule := `{"domain": "d", "rules": [{"name": "per-key", "match": {"api_key": "*"}, "shadow": true, "limits": [{"algorithm": "gcra", "rate": "5/min"}]}]}`
	uploadsOnly := `{"domain": "d", "rules": [{"name": "uploads", "match": {"api_key": "*", "path": "/upload"}, "limits": [{"algorithm": "gcra", "rate": "5/min"}]}]}`

	const ip = "198.51.100.7"
	type step struct {
		req  testRequest
		want string // unauth, or the rule of the Allow (anyRule: any, noRule: none)
	}
	tests := []struct {
		name  string
		env   map[string]string
		steps []step
	}{
		{"shipped policy", map[string]string{"TOLLGATE_POLICY": shippedPolicy}, []step{
			{testRequest{shape: restRequest, method: "POST", path: "/login", ip: ip}, anyRule},
			{testRequest{shape: httpV2, method: "POST", path: "/login", ip: ip}, anyRule},
			{testRequest{shape: restRequest, method: "GET", path: "/search", ip: ip}, anyRule},
			{testRequest{shape: httpV2, method: "GET", path: "/search", ip: ip}, anyRule},
			{testRequest{shape: restRequest, method: "GET", path: "/search"}, "search-global"},
			// Only the shadow ip-tiers rule applies without a key.
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip}, unauth},
			{testRequest{shape: httpV2, method: "GET", path: "/items", ip: ip}, unauth},
			{testRequest{shape: restRequest, method: "POST", path: "/upload", ip: ip}, unauth},
			// login-per-ip needs the client address.
			{testRequest{shape: restRequest, method: "POST", path: "/login"}, unauth},
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip, key: testAPIKey}, anyRule},
			{testRequest{shape: httpV2, method: "GET", path: "/items", ip: ip, key: testAPIKey}, anyRule},
			// A TOKEN authorizer always requires its token.
			{testRequest{shape: restToken, method: "POST", path: "/login"}, unauth},
			{testRequest{shape: restToken, method: "GET", path: "/search"}, unauth},
			{testRequest{shape: restToken, method: "GET", path: "/items", token: testToken}, "per-key"},
		}},
		{"test policy", map[string]string{"TOLLGATE_POLICY": testPolicy}, []step{
			{testRequest{shape: restRequest, method: "POST", path: "/login", ip: ip}, unauth},
			// The shadow per-tenant rule applies, and does not decide.
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip, tenant: "acme"}, unauth},
			{testRequest{shape: httpV2, method: "GET", path: "/items", ip: ip, tenant: "acme"}, unauth},
			{testRequest{shape: restToken, method: "GET", path: "/items"}, unauth},
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip, key: testAPIKey}, "per-key"},
			{testRequest{shape: restToken, method: "GET", path: "/items", token: testToken}, "per-key"},
		}},
		{"no rule on api_key", map[string]string{"TOLLGATE_POLICY_JSON": noKeyRules}, []step{
			{testRequest{shape: restRequest, method: "POST", path: "/login", ip: ip}, "per-ip"},
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip}, noRule},
			{testRequest{shape: httpV2, method: "GET", path: "/items"}, noRule},
			{testRequest{shape: restToken, method: "GET", path: "/items"}, unauth},
		}},
		{"shadow rule on api_key", map[string]string{"TOLLGATE_POLICY_JSON": shadowKeyRule}, []step{
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip}, noRule},
			{testRequest{shape: httpV2, method: "GET", path: "/items", ip: ip}, noRule},
		}},
		{"api_key rule on one path", map[string]string{"TOLLGATE_POLICY_JSON": uploadsOnly}, []step{
			{testRequest{shape: restRequest, method: "GET", path: "/items", ip: ip}, noRule},
			{testRequest{shape: restRequest, method: "POST", path: "/upload", ip: ip}, unauth},
			{testRequest{shape: httpV2, method: "POST", path: "/upload", ip: ip}, unauth},
			{testRequest{shape: httpV2, method: "POST", path: "/upload", ip: ip, key: testAPIKey}, "uploads"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ta := newTestApp(t, tt.env)
			for _, st := range tt.steps {
				r := st.req
				m, err := ta.invoke(t, r.event(t))
				if st.want == unauth {
					if !errors.Is(err, ErrUnauthorized) || err.Error() != "Unauthorized" {
						t.Errorf("Invoke(%+v) = %v, %v; want exactly Unauthorized", r, m, err)
					} else if last := lastMetric(t, ta.metrics.String()); last["Result"] != "unauthorized" {
						t.Errorf("Invoke(%+v) metric line = %v, want Result unauthorized", r, last)
					}
					continue
				}
				if err != nil {
					t.Errorf("Invoke(%+v) error = %v, want a decision", r, err)
					continue
				}
				a := readAnswer(t, r.shape, m)
				if !a.allowed {
					t.Errorf("Invoke(%+v) = %v, want Allow", r, m)
				}
				if st.want != anyRule && a.ctx["rule"] != st.want {
					t.Errorf("Invoke(%+v) rule = %v, want %q", r, a.ctx["rule"], st.want)
				}
			}
		})
	}
}

// TestAnonymousLogin checks that the shipped policy's login-per-ip rule limits
// anonymous logins: five a minute from one client address, on the in-process store
// and on a real redis-server.
func TestAnonymousLogin(t *testing.T) {
	t.Parallel()
	// The shipped policy with a timeout a loaded test machine meets: at 50ms a slow
	// reply would be decided by the failure mode (open), not by the limit.
	base, err := os.ReadFile(shippedPolicy)
	if err != nil {
		t.Fatalf("read policy: %v", err)
	}
	pol := strings.Replace(string(base), "timeout: 50ms", "timeout: 2s", 1)
	if pol == string(base) {
		t.Fatalf("%s has no \"timeout: 50ms\" to replace", shippedPolicy)
	}
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(pol), 0o644); err != nil {
		t.Fatalf("write policy: %v", err)
	}
	for _, backend := range []string{"in process", "redis"} {
		for _, s := range []shape{restRequest, httpV2} {
			t.Run(backend+"/"+s.String(), func(t *testing.T) {
				t.Parallel()
				env := map[string]string{"TOLLGATE_POLICY": path}
				if backend == "redis" {
					env["REDIS_URL"] = redistest.StartServer(t).URL()
				}
				ta := newTestApp(t, env)
				login := testRequest{shape: s, method: "POST", path: "/login", ip: "198.51.100.7"}
				for i := 1; i <= 6; i++ {
					m, err := ta.invoke(t, login.event(t))
					if err != nil {
						t.Fatalf("Invoke(POST /login) #%d error = %v, want a decision", i, err)
					}
					a := readAnswer(t, s, m)
					if want := i <= 5; a.allowed != want {
						t.Fatalf("Invoke(POST /login) #%d allowed = %v, want %v (answer %v)", i, a.allowed, want, m)
					}
					if i == 6 {
						c := a.ctx
						if c["rule"] != "login-per-ip" || num(t, c, "limit") != 5 || num(t, c, "retryAfter") < 1 {
							t.Errorf("Invoke(POST /login) #6 context = %v, want rule login-per-ip, limit 5, retryAfter ≥ 1", c)
						}
						if last := lastMetric(t, ta.metrics.String()); last["Result"] != "denied" || last["Rule"] != "login-per-ip" {
							t.Errorf("metric line = %v, want Result denied, Rule login-per-ip", last)
						}
					}
				}
				// Another client address has logins of its own.
				other := login
				other.ip = "198.51.100.8"
				m, err := ta.invoke(t, other.event(t))
				if err != nil || !readAnswer(t, s, m).allowed {
					t.Errorf("Invoke(POST /login from another address) = %v, %v; want Allow", m, err)
				}
			})
		}
	}
}

// TestBlankForwardedFor sends ten clients through one trusted proxy that writes a
// blank last X-Forwarded-For entry ("203.0.113.5, "). Each must be limited by its own
// source IP — one request allowed, the second denied — and every such request must
// count one IdentityFallbacks; a well-formed header counts none.
func TestBlankForwardedFor(t *testing.T) {
	t.Parallel()
	perIP := `{"domain": "d", "identity": {"trusted_proxies": 1}, "rules": [{"name": "per-ip", "match": {"remote_address": "*"}, "limits": [{"algorithm": "fixed_window", "rate": "1/min"}]}]}`
	ta := newTestApp(t, map[string]string{"TOLLGATE_POLICY_JSON": perIP})
	send := func(s shape, ip, xff string) (answer, float64) {
		t.Helper()
		var ev map[string]any
		if err := json.Unmarshal(testRequest{shape: s, method: "GET", path: "/items", ip: ip}.event(t), &ev); err != nil {
			t.Fatal(err)
		}
		ev["headers"].(map[string]any)["X-Forwarded-For"] = xff
		raw, _ := json.Marshal(ev)
		m, err := ta.invoke(t, raw)
		if err != nil {
			t.Fatalf("Invoke(%s from %s, X-Forwarded-For %q) error = %v", s, ip, xff, err)
		}
		fallbacks, _ := lastMetric(t, ta.metrics.String())["IdentityFallbacks"].(float64)
		return readAnswer(t, s, m), fallbacks
	}
	for _, s := range []shape{restRequest, httpV2} {
		for i := range 10 {
			ip := fmt.Sprintf("192.0.2.%d", 10*int(s)+i)
			first, fb := send(s, ip, "203.0.113.5, ")
			second, _ := send(s, ip, "203.0.113.5, ")
			if !first.allowed || second.allowed {
				t.Errorf("%s client %s: Check() twice = allowed %v, %v, want true, false (its own limit of 1/min)", s, ip, first.allowed, second.allowed)
			}
			if fb != 1 {
				t.Errorf("%s client %s: IdentityFallbacks = %v, want 1", s, ip, fb)
			}
		}
	}
	if a, fb := send(restRequest, "10.0.0.1", "198.51.100.77"); !a.allowed || fb != 0 {
		t.Errorf("well-formed X-Forwarded-For: allowed %v, IdentityFallbacks %v, want true, 0", a.allowed, fb)
	}
}

// TestPlanInContext gives the authorizer a policy whose plan table holds the SHA-256
// of the test's API key and token: the context carries the plan for both (the token
// found by the hash the authorizer made of it), and a client that sends the table's
// hash as its API key gets the default plan.
func TestPlanInContext(t *testing.T) {
	t.Parallel()
	key, tok := sha256.Sum256([]byte(testAPIKey)), sha256.Sum256([]byte(testToken))
	doc := fmt.Sprintf(`{"domain": "public-api", "plans": {"default": "free", "keys": {"sha256:%x": "pro", "sha256:%x": "pro"}},
  "rules": [{"name": "pro", "match": {"api_key": "*", "plan": "pro"}, "limits": [{"algorithm": "gcra", "rate": "100/s"}]},
            {"name": "free", "match": {"api_key": "*", "plan": "free"}, "limits": [{"algorithm": "gcra", "rate": "10/s"}]}]}`, key, tok)
	ta := newTestApp(t, map[string]string{"TOLLGATE_POLICY_JSON": doc})
	request := readEvent(t, "rest-request-authorizer.json")
	spoof := bytes.ReplaceAll(request, []byte(testAPIKey), []byte(algo.HashValue(testAPIKey)))
	for _, c := range []struct {
		what    string
		payload []byte
		want    string
	}{
		{"an API key in the table", request, "pro"},
		{"a token in the table", readEvent(t, "rest-token-authorizer.json"), "pro"},
		{"the table's hash sent as an API key", spoof, "free"},
	} {
		m, err := ta.invoke(t, c.payload)
		if err != nil {
			t.Fatalf("%s: Invoke() error = %v", c.what, err)
		}
		ctx, _ := m["context"].(map[string]any)
		if ctx["plan"] != c.want || ctx["rule"] != c.want {
			t.Errorf("%s: context plan %v, rule %v; want %s for both", c.what, ctx["plan"], ctx["rule"], c.want)
		}
	}
}
