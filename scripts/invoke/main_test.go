package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestInvokeRunsOutTheLimit runs the real tool: the authorizer's binary on the REST
// REQUEST event, five times against one miniredis, with the authorizer's test
// policy (3 per minute).
func TestInvokeRunsOutTheLimit(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the authorizer; skipped in -short mode")
	}
	var out, errOut bytes.Buffer
	err := run([]string{"-n", "5", "-policy", "../../lambda/authorizer/testdata/policy.yaml", "../../events/rest-request-authorizer.json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("run() error = %v\n%s", err, errOut.String())
	}
	var verdicts []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "--- invoke ") {
			f := strings.Fields(line)
			verdicts = append(verdicts, f[3])
		}
	}
	want := []string{"Allow", "Allow", "Allow", "Deny", "Deny"}
	if strings.Join(verdicts, " ") != strings.Join(want, " ") {
		t.Fatalf("verdicts = %v, want %v\n%s", verdicts, want, out.String())
	}
	if !strings.Contains(out.String(), "retryAfter=20") {
		t.Errorf("output lacks retryAfter=20:\n%s", out.String())
	}
}

// TestInvokeLimiterOnLambda runs the decision service's real binary in its Lambda mode
// (aws-lambda-go's lambdaurl, RESPONSE_STREAM) on the Function URL event: a policy of
// 5 per minute per API key answers 200 five times, then 429.
func TestInvokeLimiterOnLambda(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the limiter; skipped in -short mode")
	}
	pol := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(pol, []byte("domain: public-api\nrules:\n  - name: per-key\n    match: {api_key: \"*\"}\n    limits:\n      - {algorithm: sliding_log, rate: 5/min}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	if err := run([]string{"-n", "6", "-policy", pol, "../../events/function-url.json"}, &out, &errOut); err != nil {
		t.Fatalf("run() error = %v\n%s", err, errOut.String())
	}
	var statuses []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, "--- invoke ") {
			statuses = append(statuses, strings.Fields(line)[4])
		}
	}
	if got, want := strings.Join(statuses, " "), "200 200 200 200 200 429"; got != want {
		t.Fatalf("statuses = %v, want %v\n%s", got, want, out.String())
	}
	if !strings.Contains(out.String(), `"Retry-After":"`) {
		t.Errorf("the 429 lacks Retry-After:\n%s", out.String())
	}
}

func TestFunctionFor(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		`{"version":"2.0","rawPath":"/v1/check","requestContext":{"http":{}}}`:           "limiter",
		`{"version":"2.0","type":"REQUEST","routeArn":"a","requestContext":{"http":{}}}`: "authorizer",
		`{"type":"TOKEN","authorizationToken":"t","methodArn":"a"}`:                      "authorizer",
		`garbage`: "authorizer",
	}
	for in, want := range tests {
		if got := functionFor([]byte(in)); got != want {
			t.Errorf("functionFor(%s) = %q, want %q", in, got, want)
		}
	}
}

func TestRenderStreamedResponse(t *testing.T) {
	t.Parallel()
	body := []byte(`{"statusCode":429,"headers":{"Retry-After":"20"}}` + "\x00\x00\x00\x00\x00\x00\x00\x00" + `{"allowed":false}`)
	got := render(body, false)
	want := `{"headers":{"Retry-After":"20"},"statusCode":429}` + "\n" + `{"allowed":false}`
	if got != want {
		t.Errorf("render() = %q, want %q", got, want)
	}
	if s := summary(answer{body: body}); s != "HTTP 429" {
		t.Errorf("summary() = %q, want HTTP 429", s)
	}
	if s := summary(answer{body: []byte(`{"errorMessage":"Unauthorized"}`), isError: true}); s != "error: Unauthorized" {
		t.Errorf("summary(error) = %q, want error: Unauthorized", s)
	}
}
