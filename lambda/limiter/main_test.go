package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestLoadConfig(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		args    []string
		want    config
		wantErr string
	}{
		{"defaults", nil, nil, config{Listen: "127.0.0.1:8080", PolicyPath: "lambda/policy.yaml", Batch: true}, ""},
		{"batching off", map[string]string{"TOLLGATE_BATCH": "false"}, nil, config{Listen: "127.0.0.1:8080", PolicyPath: "lambda/policy.yaml"}, ""},
		{"bad batch flag", map[string]string{"TOLLGATE_BATCH": "sometimes"}, nil, config{}, "TOLLGATE_BATCH"},
		{"env", map[string]string{"TOLLGATE_LISTEN": ":9", "TOLLGATE_POLICY": "p.yaml", "REDIS_URL": "redis://r:6379", "REDIS_CLUSTER": "true", "TOLLGATE_ADMIN_TOKEN": "t"}, nil,
			config{Listen: ":9", PolicyPath: "p.yaml", RedisURL: "redis://r:6379", RedisCluster: true, AdminToken: "t", Batch: true}, ""},
		{"flags win", map[string]string{"TOLLGATE_LISTEN": ":9"}, []string{"--listen", ":10", "--policy", "x.yaml"}, config{Listen: ":10", PolicyPath: "x.yaml", Batch: true}, ""},
		{"inline policy", map[string]string{"TOLLGATE_POLICY_JSON": "{}"}, nil, config{Listen: "127.0.0.1:8080", PolicyJSON: "{}", Batch: true}, ""},
		{"bad cluster flag", map[string]string{"REDIS_CLUSTER": "yes please"}, nil, config{}, "REDIS_CLUSTER"},
		{"unknown flag", nil, []string{"--colour"}, config{}, "colour"},
		{"secret and IAM", map[string]string{"REDIS_URL": "rediss://c:6379", "REDIS_AUTH_SECRET_ARN": "arn:s", "REDIS_IAM_USER": "u", "REDIS_CACHE_NAME": "c"}, nil, config{}, "not both"},
		{"auth without a URL", map[string]string{"REDIS_AUTH_SECRET_ARN": "arn:s"}, nil, config{}, "REDIS_URL is empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := loadConfig(env(tc.env), tc.args)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("loadConfig() error = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Errorf("loadConfig() = %+v, %v, want %+v", got, err, tc.want)
			}
		})
	}
}

func TestRefusesInvalidPolicy(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("domain: x\nrules:\n  - name: a\n    limits: [{algorithm: gcra, rate: 10/x}]\n"), 0o600)
	err := run(env(map[string]string{"TOLLGATE_POLICY": bad, "TOLLGATE_LISTEN": "127.0.0.1:0"}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), `rules[0].limits[0].rate: "10/x"`) {
		t.Fatalf("run() with an invalid policy = %v, want an error naming rules[0].limits[0].rate", err)
	}
}

// TestEmbeddedRedis runs the service as `make run` does, with no REDIS_URL, and
// decides with every algorithm of the default policy on the embedded Redis.
func TestEmbeddedRedis(t *testing.T) {
	c, err := loadConfig(env(map[string]string{"TOLLGATE_POLICY": "../policy.yaml"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	s, err := newService(context.Background(), c, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.mini == nil {
		t.Fatal("no embedded Redis started with REDIS_URL unset")
	}
	hs := httptest.NewServer(s.handler)
	defer hs.Close()
	post := func(body string) int {
		resp, err := http.Post(hs.URL+"/v1/check", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// login-per-ip (sliding_log, 5/min) plus the ip-tiers shadow ring.
	for i := range 6 {
		got := post(`{"domain":"public-api","attributes":{"remote_address":"192.0.2.1","path":"/login","user":"bob"}}`)
		if want := map[bool]int{true: 200, false: 429}[i < 5]; got != want {
			t.Fatalf("login %d = %d, want %d", i, got, want)
		}
	}
	// per-key (gcra + fixed_window), uploads (leaky_bucket), search-global (token_bucket).
	for _, body := range []string{
		`{"domain":"public-api","attributes":{"api_key":"k","path":"/upload"}}`,
		`{"domain":"public-api","attributes":{"path":"/search"},"cost":2000}`,
	} {
		if got := post(body); got != 200 {
			t.Errorf("POST %s = %d, want 200", body, got)
		}
	}
	if got := post(`{"domain":"public-api","attributes":{"path":"/search"},"cost":2000}`); got != 429 {
		t.Errorf("search after its burst was spent = %d, want 429", got)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		resp, err := http.Get(hs.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %d, want 200", p, resp.StatusCode)
		}
	}
}
