package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// withHeader returns the REST REQUEST event with one more header.
func withHeader(t *testing.T, name, value string) []byte {
	t.Helper()
	var ev map[string]any
	if err := json.Unmarshal(readEvent(t, "rest-request-authorizer.json"), &ev); err != nil {
		t.Fatalf("Unmarshal() error = %v", err)
	}
	ev["headers"].(map[string]any)[name] = value
	b, err := json.Marshal(ev)
	if err != nil {
		t.Fatalf("Marshal() error = %v", err)
	}
	return b
}

// TestBadEvents checks that events the authorizer cannot read give a clear error,
// naming the field, and never a panic.
func TestBadEvents(t *testing.T) {
	t.Parallel()
	ta := newTestApp(t, map[string]string{}) // in process: no Redis needed
	tests := []struct {
		name    string
		payload string
		want    string
	}{
		{"empty", "", "not a JSON object"},
		{"null", "null", "not a JSON object"},
		{"array", "[1,2]", "not a JSON object"},
		{"string", `"TOKEN"`, "not a JSON object"},
		{"garbage", "\x00\xffGET / HTTP/1.1", "not a JSON object"},
		{"truncated", `{"type":"TOKEN","methodArn":"arn`, "not valid JSON"},
		{"no type", `{}`, `no "type"`},
		{"type a number", `{"type":5}`, "field type: got a JSON number, want string"},
		{"unknown type", `{"type":"COOKIE","methodArn":"arn"}`, `type "COOKIE"`},
		{"token without ARN", `{"type":"TOKEN","authorizationToken":"t"}`, "methodArn is empty"},
		{"token a number", `{"type":"TOKEN","authorizationToken":7,"methodArn":"arn"}`, "field authorizationToken"},
		{"request without ARN", `{"type":"REQUEST","headers":{}}`, "methodArn is empty"},
		{"headers a number", `{"type":"REQUEST","methodArn":"arn","headers":5}`, "field headers"},
		{"header value an object", `{"type":"REQUEST","methodArn":"arn","headers":{"X-Api-Key":{}}}`, "field headers"},
		{"requestContext a string", `{"type":"REQUEST","methodArn":"arn","requestContext":"x"}`, "field requestContext"},
		{"sourceIp a number", `{"version":"2.0","type":"REQUEST","routeArn":"a","requestContext":{"http":{"sourceIp":7}}}`, "field requestContext.http.sourceIp"},
		{"v2 without routeArn", `{"version":"2.0","type":"REQUEST","headers":{"x-api-key":"k"}}`, "routeArn is empty"},
		{"identitySource a string", `{"version":"2.0","type":"REQUEST","routeArn":"a","identitySource":"k"}`, "field identitySource"},
		{"function URL", `{"version":"2.0","rawPath":"/v1/check","requestContext":{"http":{"method":"POST"}}}`, "Function URL"},
		{"deep nesting", strings.Repeat("[", 20000) + strings.Repeat("]", 20000), "not a JSON object"},
		{"deep nesting in an object", `{"type":"TOKEN","x":` + strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}`, "bad event"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ta.invoke(t, []byte(tt.payload))
			if !errors.Is(err, ErrBadEvent) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Invoke(%.40q) error = %v, want a bad-event error containing %q", tt.payload, err, tt.want)
			}
		})
	}
}

func TestOversizedEvents(t *testing.T) {
	t.Parallel()
	ta := newTestApp(t, map[string]string{})

	// A 1 MB header is no API Gateway event: a clear error.
	big := withHeader(t, "X-Big", strings.Repeat("a", 1<<20))
	_, err := ta.invoke(t, big)
	if !errors.Is(err, ErrBadEvent) || !strings.Contains(err.Error(), "bytes; an API Gateway authorizer event is at most") {
		t.Fatalf("Invoke(1 MB header) error = %v, want a size error", err)
	}

	// Long values under the event limit are decided: the API key and a header
	// attribute longer than the engine takes are hashed, giving their sender a
	// limit of its own.
	for _, h := range []string{"X-Api-Key", "X-Tenant"} {
		ev := withHeader(t, h, strings.Repeat("k", 100<<10))
		m, err := ta.invoke(t, ev)
		if err != nil {
			t.Fatalf("Invoke(100 KiB %s) error = %v", h, err)
		}
		if !readAnswer(t, restRequest, m).allowed {
			t.Errorf("Invoke(100 KiB %s) = %v, want Allow", h, m)
		}
	}

	// Invalid UTF-8 is replaced by the JSON decoder, never passed on.
	m, err := ta.invoke(t, []byte(strings.Replace(string(readEvent(t, "rest-request-authorizer.json")), `"acme"`, "\"ac\xffme\"", 1)))
	if err != nil || !readAnswer(t, restRequest, m).allowed {
		t.Fatalf("Invoke(invalid UTF-8 header) = %v, %v; want Allow", m, err)
	}
}

// TestExtractedAttributes checks the attributes each event shape yields.
func TestExtractedAttributes(t *testing.T) {
	t.Parallel()
	p, err := policy.Load(testPolicy)
	if err != nil {
		t.Fatalf("policy.Load() error = %v", err)
	}
	x := newExtractor(p)
	tests := []struct {
		file      string
		shape     shape
		attrs     map[string]string
		principal string
	}{
		{"rest-request-authorizer.json", restRequest, map[string]string{
			"api_key": testAPIKey, "remote_address": "203.0.113.7", "method": "GET",
			"path": "/pets/{petId}", "stage": "test", "x-tenant": "acme",
		}, algo.HashValue(testAPIKey)},
		{"rest-token-authorizer.json", restToken, map[string]string{
			"api_key": algo.HashValue(testToken), "method": "GET", "path": "/pets/42", "stage": "test",
		}, algo.HashValue(testToken)},
		{"http-api-v2-authorizer.json", httpV2, map[string]string{
			"api_key": testAPIKey, "remote_address": "203.0.113.7", "method": "GET",
			"path": "/pets/{petId}", "stage": "$default", "x-tenant": "acme",
		}, algo.HashValue(testAPIKey)},
	}
	for _, tt := range tests {
		r, err := x.decode(readEvent(t, tt.file))
		if err != nil {
			t.Fatalf("decode(%s) error = %v", tt.file, err)
		}
		if r.shape != tt.shape || r.principal != tt.principal || !r.identity {
			t.Errorf("decode(%s) = shape %v, principal %q, identity %v; want %v, %q, true", tt.file, r.shape, r.principal, r.identity, tt.shape, tt.principal)
		}
		if len(r.attrs) != len(tt.attrs) {
			t.Errorf("decode(%s) attrs = %v, want %v", tt.file, r.attrs, tt.attrs)
		}
		for k, v := range tt.attrs {
			if r.attrs[k] != v {
				t.Errorf("decode(%s) attrs[%s] = %q, want %q", tt.file, k, r.attrs[k], v)
			}
		}
	}
}

func TestSplitMethodArn(t *testing.T) {
	t.Parallel()
	tests := []struct {
		arn                 string
		stage, method, path string
		ok                  bool
	}{
		{"arn:aws:execute-api:us-east-1:123456789012:abcdef123/test/GET/pets/42", "test", "GET", "/pets/42", true},
		{"arn:aws:execute-api:us-west-2:123456789012:ymy8tbxw7b/*/GET/", "*", "GET", "/", true},
		{"arn:aws:execute-api:us-west-2:123456789012:ymy8tbxw7b/prod/POST", "prod", "POST", "/", true},
		{"arn:aws:lambda:us-east-1:123456789012:function:f", "", "", "", false},
		{"not an arn", "", "", "", false},
		{"arn:aws:execute-api:r:a:api", "", "", "", false},
	}
	for _, tt := range tests {
		stage, method, path, ok := splitMethodArn(tt.arn)
		if stage != tt.stage || method != tt.method || path != tt.path || ok != tt.ok {
			t.Errorf("splitMethodArn(%q) = %q, %q, %q, %v; want %q, %q, %q, %v", tt.arn, stage, method, path, ok, tt.stage, tt.method, tt.path, tt.ok)
		}
	}
}

func TestRoutePath(t *testing.T) {
	t.Parallel()
	tests := []struct{ key, raw, want string }{
		{"GET /pets/{petId}", "/pets/42", "/pets/{petId}"},
		{"ANY /{proxy+}", "/a/b", "/{proxy+}"},
		{"$default", "/a/b", "/a/b"},
		{"", "/x", "/x"},
	}
	for _, tt := range tests {
		if got := routePath(tt.key, tt.raw); got != tt.want {
			t.Errorf("routePath(%q, %q) = %q, want %q", tt.key, tt.raw, got, tt.want)
		}
	}
}

// FuzzHandle runs arbitrary events through the handler with the in-process store:
// it must never panic; an answer must be JSON of the right shape, with no attribute
// the engine refuses; an error must be Unauthorized or a bad event.
func FuzzHandle(f *testing.F) {
	for _, name := range []string{"rest-request-authorizer.json", "rest-token-authorizer.json", "http-api-v2-authorizer.json", "function-url.json"} {
		b, err := readEventFile(name)
		if err != nil {
			f.Fatalf("read %s: %v", name, err)
		}
		f.Add(b)
	}
	p, err := policy.Load(testPolicy)
	if err != nil {
		f.Fatalf("policy.Load() error = %v", err)
	}
	eng, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		f.Fatalf("engine.New() error = %v", err)
	}
	h, err := NewHandler(HandlerConfig{Engine: eng})
	if err != nil {
		f.Fatalf("NewHandler() error = %v", err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if r, err := h.x.Load().decode(data); err == nil {
			if r.arn == "" || r.principal == "" {
				t.Fatalf("decode(%q) = %+v: empty ARN or principal", data, r)
			}
			for k, v := range r.attrs {
				if v == "" || len(v) > bounds.MaxValueLength || !utf8.ValidString(v) {
					t.Fatalf("decode(%q) attrs[%q] = %q: empty, too long or not UTF-8", data, k, v)
				}
			}
		}
		out, err := h.Invoke(context.Background(), data)
		if err != nil {
			if !errors.Is(err, ErrBadEvent) && !errors.Is(err, ErrUnauthorized) {
				t.Fatalf("Invoke(%q) error = %v, want a bad event or Unauthorized", data, err)
			}
			return
		}
		var m map[string]any
		if err := json.Unmarshal(out, &m); err != nil {
			t.Fatalf("Invoke(%q) = %q, not a JSON object", data, out)
		}
		_, simple := m["isAuthorized"]
		_, doc := m["policyDocument"]
		if simple == doc {
			t.Fatalf("Invoke(%q) = %s, want either isAuthorized or policyDocument", data, out)
		}
	})
}

// TestLastHops checks that an X-Forwarded-For too long for an attribute keeps whole
// entries from its right end, where the trusted ones are.
func TestLastHops(t *testing.T) {
	t.Parallel()
	short := "203.0.113.5, 198.51.100.7"
	if got := lastHops(short); got != short {
		t.Errorf("lastHops(%q) = %q, want it unchanged", short, got)
	}
	long := strings.Repeat("192.0.2.1, ", 200) + "198.51.100.7, 10.0.0.2"
	got := lastHops(long)
	if len(got) > bounds.MaxValueLength || !strings.HasSuffix(got, "198.51.100.7, 10.0.0.2") || !strings.HasPrefix(got, " 192.0.2.1,") {
		t.Errorf("lastHops(%d bytes) = %d bytes %q…, want whole entries from the right, at most %d bytes", len(long), len(got), got[:min(len(got), 40)], bounds.MaxValueLength)
	}
}
