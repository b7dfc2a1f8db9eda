package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/awsredis"
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
		{"defaults", nil, nil, config{Listen: "127.0.0.1:8080", Batch: true}, ""},
		{"batching off", map[string]string{"TOLLGATE_BATCH": "false"}, nil, config{Listen: "127.0.0.1:8080"}, ""},
		{"bad batch flag", map[string]string{"TOLLGATE_BATCH": "sometimes"}, nil, config{}, "TOLLGATE_BATCH"},
		{"batch wait", map[string]string{"TOLLGATE_BATCH_WAIT": "1ms"}, nil, config{Listen: "127.0.0.1:8080", Batch: true, BatchWait: time.Millisecond}, ""},
		{"bad batch wait", map[string]string{"TOLLGATE_BATCH_WAIT": "soon"}, nil, config{}, "TOLLGATE_BATCH_WAIT"},
		{"ERL's response headers", map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}, nil, config{Listen: "127.0.0.1:8080", Batch: true, OneQuota: algo.OneQuotaNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}}, ""},
		{"bad ERL headers flag", map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "sometimes"}, nil, config{}, "LIMIT_RESPONSE_HEADERS_ENABLED"},
		{"batch wait of nothing", map[string]string{"TOLLGATE_BATCH_WAIT": "0"}, nil, config{}, "TOLLGATE_BATCH_WAIT"},
		{"batch wait too long", map[string]string{"TOLLGATE_BATCH_WAIT": "2s"}, nil, config{}, "TOLLGATE_BATCH_WAIT"},
		{"env", map[string]string{"TOLLGATE_LISTEN": ":9", "TOLLGATE_POLICY": "p.yaml", "REDIS_URL": "redis://r:6379", "REDIS_CLUSTER": "true", "TOLLGATE_ADMIN_TOKEN": "t"}, nil,
			config{Listen: ":9", PolicyPath: "p.yaml", RedisURL: "redis://r:6379", RedisCluster: true, AdminToken: "t", Batch: true}, ""},
		{"flags win", map[string]string{"TOLLGATE_LISTEN": ":9"}, []string{"--listen", ":10", "--policy", "x.yaml"}, config{Listen: ":10", PolicyPath: "x.yaml", Batch: true}, ""},
		{"inline policy", map[string]string{"TOLLGATE_POLICY_JSON": "{}"}, nil, config{Listen: "127.0.0.1:8080", PolicyJSON: "{}", Batch: true}, ""},
		{"bad cluster flag", map[string]string{"REDIS_CLUSTER": "yes please"}, nil, config{}, "REDIS_CLUSTER"},
		{"unknown flag", nil, []string{"--colour"}, config{}, "colour"},
		{"secret and IAM", map[string]string{"REDIS_URL": "rediss://c:6379", "REDIS_AUTH_SECRET_ARN": "arn:s", "REDIS_IAM_USER": "u", "REDIS_CACHE_NAME": "c"}, nil, config{}, "not both"},
		{"auth without a URL", map[string]string{"REDIS_AUTH_SECRET_ARN": "arn:s"}, nil, config{}, "REDIS_URL is empty"},
		{"server limits from env", map[string]string{"TOLLGATE_READ_TIMEOUT": "2s", "TOLLGATE_WRITE_TIMEOUT": "4s", "TOLLGATE_IDLE_TIMEOUT": "30s", "TOLLGATE_MAX_CONNS": "100", "TOLLGATE_SHUTDOWN_GRACE": "1s"}, nil,
			config{Listen: "127.0.0.1:8080", Batch: true, Server: serverLimits{2 * time.Second, 4 * time.Second, 30 * time.Second, 100, time.Second}}, ""},
		{"server limit flags win", map[string]string{"TOLLGATE_READ_TIMEOUT": "2s", "TOLLGATE_MAX_CONNS": "100"}, []string{"--read-timeout", "3s", "--max-conns", "7", "--shutdown-grace", "250ms"},
			config{Listen: "127.0.0.1:8080", Batch: true, Server: serverLimits{3 * time.Second, 10 * time.Second, time.Minute, 7, 250 * time.Millisecond}}, ""},
		{"bad read timeout", map[string]string{"TOLLGATE_READ_TIMEOUT": "5"}, nil, config{}, "TOLLGATE_READ_TIMEOUT"},
		{"bad max conns", map[string]string{"TOLLGATE_MAX_CONNS": "lots"}, nil, config{}, "TOLLGATE_MAX_CONNS"},
		{"zero write timeout", map[string]string{"TOLLGATE_WRITE_TIMEOUT": "0s"}, nil, config{}, "--write-timeout (TOLLGATE_WRITE_TIMEOUT) = 0s"},
		{"negative idle timeout flag", nil, []string{"--idle-timeout", "-1s"}, config{}, "--idle-timeout (TOLLGATE_IDLE_TIMEOUT) = -1s"},
		{"zero grace", nil, []string{"--shutdown-grace", "0s"}, config{}, "--shutdown-grace"},
		{"no connections", nil, []string{"--max-conns", "0"}, config{}, "--max-conns (TOLLGATE_MAX_CONNS) = 0: want at least 1"},
		{"unparsable flag", nil, []string{"--read-timeout", "soon"}, config{}, "read-timeout"},
		{"policy in SSM, polled every minute", map[string]string{"TOLLGATE_POLICY_SSM": "/tollgate/policy", "TOLLGATE_POLICY_POLL": "1m"}, nil,
			config{Listen: "127.0.0.1:8080", PolicySSM: "/tollgate/policy", PolicyPoll: time.Minute, Batch: true}, ""},
		{"gRPC listener", map[string]string{"TOLLGATE_GRPC_LISTEN": "127.0.0.1:8081"}, []string{"--grpc-listen", "127.0.0.1:9091"},
			config{Listen: "127.0.0.1:8080", GRPCListen: "127.0.0.1:9091", Batch: true}, ""},
		{"policy poll flag", nil, []string{"--policy-poll", "500ms"}, config{Listen: "127.0.0.1:8080", PolicyPoll: 500 * time.Millisecond, Batch: true}, ""},
		{"every setting from flags", nil, []string{"--redis", "redis://r:6379", "--redis-cluster", "--batch=false", "--batch-wait", "1ms", "--policy-ssm", "/p", "--embedded-redis", "127.0.0.1:6379", "--erl-config", "erl"},
			config{Listen: "127.0.0.1:8080", RedisURL: "redis://r:6379", RedisCluster: true, BatchWait: time.Millisecond, PolicySSM: "/p", EmbeddedRedis: "127.0.0.1:6379", ERLConfig: "erl"}, ""},
		{"every setting from env", map[string]string{"REDIS_URL": "redis://r:6379", "REDIS_CLUSTER": "true", "TOLLGATE_BATCH": "false", "TOLLGATE_BATCH_WAIT": "1ms", "TOLLGATE_POLICY_SSM": "/p", "TOLLGATE_EMBEDDED_REDIS": "127.0.0.1:6379", "TOLLGATE_ERL_CONFIG": "erl"}, nil,
			config{Listen: "127.0.0.1:8080", RedisURL: "redis://r:6379", RedisCluster: true, BatchWait: time.Millisecond, PolicySSM: "/p", EmbeddedRedis: "127.0.0.1:6379", ERLConfig: "erl"}, ""},
		{"flags win over every variable", map[string]string{"REDIS_URL": "redis://r:6379", "REDIS_CLUSTER": "true", "TOLLGATE_BATCH": "false", "TOLLGATE_BATCH_WAIT": "1ms", "TOLLGATE_EMBEDDED_REDIS": "127.0.0.1:6379", "TOLLGATE_POLICY_POLL": "1m"},
			[]string{"--redis", "redis://s:6379", "--redis-cluster=false", "--batch", "--batch-wait", "2ms", "--embedded-redis", "127.0.0.1:0", "--policy-poll", "3s"},
			config{Listen: "127.0.0.1:8080", RedisURL: "redis://s:6379", Batch: true, BatchWait: 2 * time.Millisecond, EmbeddedRedis: "127.0.0.1:0", PolicyPoll: 3 * time.Second}, ""},
		{"policy flag wins over an inline policy in the environment", map[string]string{"TOLLGATE_POLICY_JSON": "{}", "TOLLGATE_POLICY_SSM": "/p"}, []string{"--policy", "x.yaml"}, config{Listen: "127.0.0.1:8080", PolicyPath: "x.yaml", Batch: true}, ""},
		{"policy-json flag wins over a file in the environment", map[string]string{"TOLLGATE_POLICY": "p.yaml"}, []string{"--policy-json", "{}"}, config{Listen: "127.0.0.1:8080", PolicyJSON: "{}", Batch: true}, ""},
		{"bad batch wait flag", nil, []string{"--batch-wait", "2s"}, config{}, "--batch-wait (TOLLGATE_BATCH_WAIT) = 2s"},
		{"auth with a URL flag", map[string]string{"REDIS_AUTH_SECRET_ARN": "arn:s"}, []string{"--redis", "rediss://c:6379"}, config{Listen: "127.0.0.1:8080", RedisURL: "rediss://c:6379", Batch: true, Auth: awsredis.Auth{SecretARN: "arn:s"}}, ""},
		{"a word after the flags", nil, []string{"--listen", ":1", "serve"}, config{}, `unexpected argument "serve"`},
		{"help", nil, []string{"--help"}, config{}, "help requested"},
		{"bad policy poll", map[string]string{"TOLLGATE_POLICY_POLL": "often"}, nil, config{}, "TOLLGATE_POLICY_POLL"},
		{"negative policy poll flag", nil, []string{"--policy-poll", "-1s"}, config{}, "--policy-poll"},
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
			if tc.want.Server == (serverLimits{}) {
				tc.want.Server = defaultServerLimits
			}
			if tc.want.PolicyPoll == 0 {
				tc.want.PolicyPoll = 2 * time.Second
			}
			tc.want.LogLevel, tc.want.LogFormat = "info", "json"
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("loadConfig() = %+v, %v, want %+v", got, err, tc.want)
			}
		})
	}
}

func TestRefusesInvalidPolicy(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	os.WriteFile(bad, []byte("domain: x\nrules:\n  - name: a\n    limits: [{algorithm: gcra, rate: 10/x}]\n"), 0o600)
	err := run(context.Background(), env(map[string]string{"TOLLGATE_POLICY": bad, "TOLLGATE_LISTEN": "127.0.0.1:0"}), nil, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), `rules[0].limits[0].rate: "10/x"`) {
		t.Fatalf("run() with an invalid policy = %v, want an error naming rules[0].limits[0].rate", err)
	}
}

func TestServerLimitsFitPolicy(t *testing.T) {
	tests := []struct {
		name     string
		limits   serverLimits
		decision time.Duration
		wantErr  bool
	}{
		{"defaults, default policy", defaultServerLimits, 50 * time.Millisecond, false},
		{"defaults, slowest policy", defaultServerLimits, 10 * time.Second, true},
		{"write timeout equal to the read timeout", serverLimits{ReadTimeout: time.Second, WriteTimeout: time.Second}, time.Millisecond, true},
		{"room for both", serverLimits{ReadTimeout: time.Second, WriteTimeout: 2 * time.Second}, 500 * time.Millisecond, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.limits.fitsPolicy(tc.decision)
			if (err != nil) != tc.wantErr || err != nil && !strings.Contains(err.Error(), "--write-timeout") {
				t.Errorf("fitsPolicy(%v) with %+v = %v, want an error naming --write-timeout: %v", tc.decision, tc.limits, err, tc.wantErr)
			}
		})
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
		var resp *http.Response
		var body []byte
		// A readiness probe whose Redis ping a loaded machine delayed past the
		// store's timeout answers 503 once; a healthy service is ready on a retry.
		for try := 0; try < 5; try++ {
			var err error
			if resp, err = http.Get(hs.URL + p); err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		if resp.StatusCode != 200 {
			t.Errorf("GET %s = %d, want 200: %s", p, resp.StatusCode, body)
		}
		if p == "/metrics" && !strings.Contains(string(body), "tollgate_unreplicated_total 0") {
			t.Errorf("GET /metrics lacks tollgate_unreplicated_total 0")
		}
	}
}

// TestExplainHint checks that the embedded Redis's log line names the policy the
// service runs, wherever it comes from.
func TestExplainHint(t *testing.T) {
	const url = "redis://127.0.0.1:7"
	for _, tc := range []struct {
		name string
		c    config
		want []string
		not  string
	}{
		{"file", config{PolicyPath: "/etc/tg/p.yaml"}, []string{"limiter policy explain --redis " + url + " /etc/tg/p.yaml ATTRIBUTE=VALUE..."}, "lambda/policy.yaml"},
		{"document", config{PolicyJSON: `{"domain":"d"}`}, []string{"TOLLGATE_POLICY_JSON", "policy.json"}, "lambda/policy.yaml"},
		{"SSM parameter", config{PolicySSM: "/tg/policy"}, []string{"aws ssm get-parameter --name /tg/policy", url + " policy.yaml"}, "lambda/policy.yaml"},
		{"envoyproxy/ratelimit files alone", config{ERLConfig: "/srv/runtime_data/current/config"}, []string{"/srv/runtime_data/current/config", "not tollgate policy files", "built-in"}, ""},
		{"built-in", config{}, []string{url + " lambda/policy.yaml", "built-in"}, "envoyproxy"},
	} {
		got := explainHint(tc.c, url)
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: explainHint = %q, want %q in it", tc.name, got, w)
			}
		}
		if tc.not != "" && strings.Contains(got, tc.not) {
			t.Errorf("%s: explainHint = %q, names %q", tc.name, got, tc.not)
		}
	}
}
