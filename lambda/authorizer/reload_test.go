package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// TestPolicyFromSSM builds the authorizer as main does with its policy in an SSM
// parameter (the real SDK, against a fake SSM endpoint on loopback) and a real
// redis-server: a key over its limit is denied, the parameter raises the limit, and
// the next invocation after the TTL decides under the new policy. An invalid value
// is refused and the running policy keeps deciding.
func TestPolicyFromSSM(t *testing.T) {
	var value atomic.Value
	var calls atomic.Int32
	ssm := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		body, _ := io.ReadAll(r.Body)
		var in struct{ Name string }
		_ = json.Unmarshal(body, &in)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		if r.Header.Get("X-Amz-Target") != "AmazonSSM.GetParameter" || in.Name != "/tollgate/policy" {
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"__type":"ParameterNotFound","message":"%s"}`, in.Name)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"Parameter": map[string]any{"Name": in.Name, "Type": "String", "Value": value.Load()}})
	}))
	defer ssm.Close()
	for k, v := range map[string]string{
		"AWS_ENDPOINT_URL_SSM": ssm.URL, "AWS_REGION": "eu-central-1",
		"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": "secret", "AWS_EC2_METADATA_DISABLED": "true",
	} {
		t.Setenv(k, v)
	}
	policyAt := func(n int) string {
		return fmt.Sprintf("domain: d\nrules:\n  - {name: per-key, match: {api_key: '*'}, limits: [{algorithm: fixed_window, rate: %d/min}]}\n", n)
	}
	value.Store(policyAt(1))
	srv := redistest.StartServer(t)
	ta := newTestApp(t, map[string]string{
		"TOLLGATE_POLICY_SSM": "/tollgate/policy", "TOLLGATE_POLICY_POLL": "1ns", "REDIS_URL": "redis://" + srv.Addr,
	})
	event := readEvent(t, "http-api-v2-authorizer.json")
	allowed := func() bool {
		t.Helper()
		m, err := ta.invoke(t, event)
		if err != nil {
			t.Fatalf("invoke = %v", err)
		}
		return readAnswer(t, httpV2, m).allowed
	}
	if !allowed() || allowed() {
		t.Fatal("under 1/min: want the first request allowed and the second denied")
	}
	value.Store(policyAt(100))
	if !allowed() {
		t.Error("after the parameter raised the limit to 100/min: denied, want allowed")
	}
	value.Store("domain: d\nrules: [{name: x, limits: [{algorithm: gcra, rate: 1/fortnight}]}]\n")
	if !allowed() {
		t.Error("after an invalid parameter value: denied, want the 100/min policy still deciding")
	}
	for _, result := range []string{"applied", "invalid"} {
		if !strings.Contains(ta.metrics.String(), `"Result":"`+result+`"`) || !strings.Contains(ta.metrics.String(), `"PolicyReloads"`) {
			t.Errorf("metrics lack a PolicyReloads line with Result %s:\n%s", result, ta.metrics.String())
		}
	}
	if n := calls.Load(); n < 4 {
		t.Errorf("SSM calls = %d, want one at the start and one per invocation past the 1ns TTL", n)
	}
}
