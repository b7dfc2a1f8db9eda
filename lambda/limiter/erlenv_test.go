package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/tollgate-dev/tollgate/internal/configmaptest"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/reload"
)

// erlBase is the environment of an ERL deployment as Istio's sample writes it.
func erlBase(extra map[string]string) map[string]string {
	m := map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_WATCH_ROOT": "false", "RUNTIME_IGNOREDOTFILES": "true",
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "redis:6379", "USE_STATSD": "false", "LOG_LEVEL": "debug",
	}
	for k, v := range extra {
		if v == "" {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return m
}

// TestLoadConfigERL reads envoyproxy/ratelimit's environment: its directory, ports,
// Redis settings and switches, with its defaults, and tollgate's own variables and
// flags winning over it.
func TestLoadConfigERL(t *testing.T) {
	t.Parallel()
	type want struct {
		listen, grpc, debug, dir, redis, level, format string
		cluster                                        bool
	}
	istio := want{"0.0.0.0:8080", "0.0.0.0:8081", "0.0.0.0:6070", "/data/ratelimit/config", "redis://redis:6379", "debug", "text", false}
	with := func(f func(w *want)) want { w := istio; f(&w); return w }
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want want
	}{
		{"Istio's sample", erlBase(nil), nil, istio},
		{"ERL's defaults", map[string]string{"RUNTIME_SUBDIRECTORY": "ratelimit", "REDIS_URL": "10.0.0.1:6379", "REDIS_SOCKET_TYPE": "tcp"}, nil,
			want{"0.0.0.0:8080", "0.0.0.0:8081", "0.0.0.0:6070", "/srv/runtime_data/current/ratelimit/config", "redis://10.0.0.1:6379", "warn", "text", false}},
		{"watching the directory, no subdirectory", erlBase(map[string]string{"RUNTIME_SUBDIRECTORY": ""}), nil, with(func(w *want) { w.dir = "/data/config" })},
		{"ports and hosts", erlBase(map[string]string{"HOST": "127.0.0.1", "PORT": "9080", "GRPC_HOST": "127.0.0.2", "GRPC_PORT": "9081", "DEBUG_HOST": "127.0.0.3", "DEBUG_PORT": "9070", "RUNTIME_APPDIRECTORY": "rl"}), nil,
			with(func(w *want) {
				w.listen, w.grpc, w.debug, w.dir = "127.0.0.1:9080", "127.0.0.2:9081", "127.0.0.3:9070", "/data/ratelimit/rl"
			})},
		{"gRPC on a Unix socket", erlBase(map[string]string{"GRPC_UDS": "/tmp/rl.sock"}), nil, with(func(w *want) { w.grpc = "unix:/tmp/rl.sock" })},
		{"JSON log", erlBase(map[string]string{"LOG_FORMAT": "JSON", "LOG_LEVEL": "Warning"}), nil, with(func(w *want) { w.format, w.level = "json", "warn" })},
		{"tollgate's variables win", erlBase(map[string]string{"TOLLGATE_LISTEN": ":1", "TOLLGATE_GRPC_LISTEN": ":2", "TOLLGATE_DEBUG_LISTEN": ":3", "TOLLGATE_ERL_CONFIG": "/etc/rl", "TOLLGATE_LOG_FORMAT": "json", "TOLLGATE_LOG_LEVEL": "error"}), nil,
			with(func(w *want) {
				w.listen, w.grpc, w.debug, w.dir, w.format, w.level = ":1", ":2", ":3", "/etc/rl", "json", "error"
			})},
		{"tollgate's flags win", erlBase(map[string]string{"TOLLGATE_LISTEN": ":1"}), []string{"--listen", ":4", "--grpc-listen", ":5", "--erl-config", "/x", "--redis", "redis://r:1", "--log-level", "info"},
			with(func(w *want) { w.listen, w.grpc, w.dir, w.redis, w.level = ":4", ":5", "/x", "redis://r:1", "info" })},
		{"cluster", erlBase(map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "a:7000,b:7001, c:7002"}), nil,
			with(func(w *want) { w.redis, w.cluster = "redis://a:7000?addr=b%3A7001&addr=c%3A7002", true })},
		{"sentinel", erlBase(map[string]string{"REDIS_TYPE": "SENTINEL", "REDIS_URL": "mymaster,s1:26379,s2:26379"}), nil,
			with(func(w *want) { w.redis = "redis://s1:26379?addr=s2%3A26379&master_name=mymaster" })},
		{"password", erlBase(map[string]string{"REDIS_AUTH": "p@ss"}), nil, with(func(w *want) { w.redis = "redis://:p%40ss@redis:6379" })},
		{"user and password, TLS", erlBase(map[string]string{"REDIS_AUTH": "alice:secret", "REDIS_TLS": "true"}), nil, with(func(w *want) { w.redis = "rediss://alice:secret@redis:6379" })},
		{"ERL's default Redis: nutcracker's socket", erlBase(map[string]string{"REDIS_URL": "", "REDIS_SOCKET_TYPE": ""}), nil,
			with(func(w *want) { w.redis = "unix:///var/run/nutcracker/ratelimit.sock" })},
		{"ERL's REDIS_URL outside its environment", map[string]string{"REDIS_URL": "r:6379", "REDIS_SOCKET_TYPE": "tcp"}, nil,
			want{"127.0.0.1:8080", "", "", "", "redis://r:6379", "info", "json", false}},
		{"tollgate's REDIS_URL in ERL's environment", erlBase(map[string]string{"REDIS_URL": "rediss://cache:6379", "REDIS_TYPE": "cluster"}), nil,
			with(func(w *want) { w.redis = "rediss://cache:6379" })},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := loadConfig(env(tc.env), tc.args)
			if err != nil {
				t.Fatalf("loadConfig() = %v", err)
			}
			got := want{c.Listen, c.GRPCListen, c.DebugListen, c.ERLConfig, c.RedisURL, c.LogLevel, c.LogFormat, c.RedisCluster}
			if got != tc.want {
				t.Errorf("loadConfig() = %+v, want %+v", got, tc.want)
			}
		})
	}

	t.Run("switches", func(t *testing.T) {
		c, err := loadConfig(env(erlBase(map[string]string{
			"MERGE_DOMAIN_CONFIG": "true", "SHADOW_MODE": "true", "QUOTA_MODE": "true", "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED": "true", "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true",
			"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":9191", "PROMETHEUS_PATH": "/prom", "GRPC_MAX_CONNECTION_AGE": "1m", "GRPC_MAX_CONNECTION_AGE_GRACE": "5s",
			"REDIS_PIPELINE_WINDOW": "150us", "REDIS_POOL_SIZE": "7", "REDIS_TIMEOUT": "2s", "REDIS_SENTINEL_AUTH": "sp", "REDIS_PERSECOND": "true", "USE_STATSD": "true",
		})), nil)
		if err != nil {
			t.Fatal(err)
		}
		e := c.ERL
		if !e.Merge || !e.Shadow || !e.Quota || !c.EveryDescriptor || !e.NeedConfig || !e.RedisHealth || !e.Prometheus || e.PrometheusAddr != ":9191" || e.PrometheusPath != "/prom" ||
			e.GRPCMaxAge != time.Minute || e.GRPCMaxAgeGrace != 5*time.Second || c.BatchWait != 150*time.Microsecond {
			t.Errorf("ERL switches read as %+v, batch wait %v", e, c.BatchWait)
		}
		if r := c.RedisERL; r.PoolSize != 7 || r.Timeout != 2*time.Second || r.DialTimeout != 2*time.Second || r.SentinelPassword != "sp" || r.TLSConfig != nil {
			t.Errorf("ERL's Redis settings read as %+v", r)
		}
		if w := strings.Join(e.Warnings, "\n"); !strings.Contains(w, "REDIS_PERSECOND=true is ignored") || !strings.Contains(w, "USE_STATSD=true is ignored") {
			t.Errorf("warnings %q, want REDIS_PERSECOND's and USE_STATSD's", w)
		}
		if c, _ := loadConfig(env(erlBase(map[string]string{"REDIS_POOL_SIZE": "7"})), []string{"--redis", "redis://r:1"}); c.RedisERL.PoolSize != 0 {
			t.Errorf("with --redis, REDIS_POOL_SIZE still applies (%d): ERL's settings describe its REDIS_URL only", c.RedisERL.PoolSize)
		}
		// Nor are they checked: --redis wins over a REDIS_URL whose companions are wrong.
		for _, bad := range []map[string]string{{"REDIS_SOCKET_TYPE": "udp"}, {"REDIS_TYPE": "replicated"}, {"REDIS_POOL_SIZE": "0"}, {"REDIS_TIMEOUT": "soon"}} {
			c, err := loadConfig(env(erlBase(bad)), []string{"--redis", "redis://r:1"})
			if err != nil || c.RedisURL != "redis://r:1" {
				t.Errorf("with --redis and %v, loadConfig() = %q, %v; want --redis's URL, no error", bad, c.RedisURL, err)
			}
			if _, err := loadConfig(env(erlBase(bad)), nil); err == nil {
				t.Errorf("without --redis, %v loads; want an error", bad)
			}
		}
	})

	for _, bad := range []struct {
		name string
		env  map[string]string
		want string
	}{
		{"root watched without a subdirectory", erlBase(map[string]string{"RUNTIME_WATCH_ROOT": "true", "RUNTIME_SUBDIRECTORY": ""}), "RUNTIME_SUBDIRECTORY is empty"},
		{"bad port", erlBase(map[string]string{"GRPC_PORT": "grpc"}), "GRPC_PORT"},
		{"bad log level", erlBase(map[string]string{"LOG_LEVEL": "loud"}), "LOG_LEVEL"},
		{"bad switch", erlBase(map[string]string{"SHADOW_MODE": "maybe"}), "SHADOW_MODE"},
		{"xDS", erlBase(map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}), "CONFIG_TYPE=GRPC_XDS_SOTW"},
		{"memcache", erlBase(map[string]string{"BACKEND_TYPE": "memcache"}), "BACKEND_TYPE=memcache"},
		{"bad quota switch", erlBase(map[string]string{"QUOTA_MODE": "sometimes"}), "QUOTA_MODE"},
		{"bad every-descriptor switch", erlBase(map[string]string{"LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED": "all"}), "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED"},
		{"host:port on ERL's default socket type", erlBase(map[string]string{"REDIS_SOCKET_TYPE": ""}), "set REDIS_SOCKET_TYPE=tcp"},
		{"unknown Redis type", erlBase(map[string]string{"REDIS_TYPE": "replicated"}), "REDIS_TYPE"},
		{"sentinel without sentinels", erlBase(map[string]string{"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster"}), "master's name then the sentinels"},
		{"two nodes, single", erlBase(map[string]string{"REDIS_URL": "a:1,b:2"}), "REDIS_TYPE=cluster"},
		{"not host:port", erlBase(map[string]string{"REDIS_TYPE": "cluster", "REDIS_URL": "a:1,b"}), `"b" is not host:port`},
		{"bad pool size", erlBase(map[string]string{"REDIS_POOL_SIZE": "0"}), "REDIS_POOL_SIZE"},
		{"missing CA file", erlBase(map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CACERT": "/nonexistent/ca.pem"}), "REDIS_TLS_CACERT"},
		{"client cert without key", erlBase(map[string]string{"REDIS_TLS": "true", "REDIS_TLS_CLIENT_CERT": "c.pem"}), "go together"},
		{"gRPC TLS without a certificate", erlBase(map[string]string{"GRPC_SERVER_USE_TLS": "true"}), "GRPC_SERVER_TLS_CERT"},
		{"pipeline window too long", erlBase(map[string]string{"REDIS_PIPELINE_WINDOW": "2s"}), "REDIS_PIPELINE_WINDOW"},
	} {
		if _, err := loadConfig(env(bad.env), nil); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%s: loadConfig() = %v, want an error naming %q", bad.name, err, bad.want)
		}
	}
}

// TestLoadConfigEnvoyGateway gives loadConfig the environment Envoy Gateway sets
// on its own rate limit Deployment, which is configured over xDS: tollgate refuses
// it, naming CONFIG_TYPE, rather than failing on the TLS files that Deployment
// mounts or starting with no configuration.
func TestLoadConfigEnvoyGateway(t *testing.T) {
	t.Parallel()
	eg := map[string]string{
		"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_IGNOREDOTFILES": "true", "RUNTIME_WATCH_ROOT": "false",
		"LOG_LEVEL": "info", "USE_STATSD": "false",
		"CONFIG_TYPE": "GRPC_XDS_SOTW", "CONFIG_GRPC_XDS_NODE_ID": "envoy-ratelimit", "CONFIG_GRPC_XDS_SERVER_URL": "envoy-gateway:18001",
		"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true", "CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/certs/tls.crt",
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/certs/tls.key", "CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/certs/ca.crt",
		"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/certs/tls.crt", "GRPC_SERVER_TLS_KEY": "/certs/tls.key",
		"GRPC_CLIENT_TLS_CACERT": "/certs/ca.crt",
		"REDIS_SOCKET_TYPE":      "tcp", "REDIS_URL": "redis.redis-system.svc.cluster.local:6379",
		"USE_PROMETHEUS": "true", "PROMETHEUS_ADDR": ":19001", "PROMETHEUS_PATH": "/metrics",
		"FORCE_START_WITHOUT_INITIAL_CONFIG": "true",
	}
	_, err := loadConfig(env(eg), nil)
	if err == nil {
		t.Fatal("loadConfig(Envoy Gateway's environment) = nil error, want CONFIG_TYPE refused")
	}
	for _, want := range []string{"CONFIG_TYPE=GRPC_XDS_SOTW", "files only", "CONFIG_TYPE=FILE"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("loadConfig(Envoy Gateway's environment) = %v, want it to say %q", err, want)
		}
	}
	// The same environment reading its configuration from files gets past CONFIG_TYPE.
	eg["CONFIG_TYPE"] = "FILE"
	if _, err := loadConfig(env(eg), nil); err != nil && strings.Contains(err.Error(), "CONFIG_TYPE") {
		t.Errorf("with CONFIG_TYPE=FILE, loadConfig() = %v, still about CONFIG_TYPE", err)
	}
}

// erlTestdata returns ERL's integration configuration file name, from shared/erl.
func erlTestdata(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "shared", "erl", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func freePort(t *testing.T) string {
	t.Helper()
	_, port, _ := net.SplitHostPort(freeAddr(t))
	return port
}

func ask(t *testing.T, c rlsv3.RateLimitServiceClient, domain string, hits uint32, kv ...string) (*rlsv3.RateLimitResponse, error) {
	t.Helper()
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlv3.RateLimitDescriptor{d}, HitsAddend: hits})
}

// TestERLEnvironmentAlone runs the built binary from an empty directory with
// envoyproxy/ratelimit's environment alone (no tollgate variable, flag or policy),
// its integration configurations mounted as Kubernetes mounts a ConfigMap, on a
// real Redis given as ERL writes it (host:port): it answers ShouldRateLimit on
// GRPC_PORT and /healthcheck and POST /json on PORT, metrics on DEBUG_PORT, replays
// ERL's basic, another and share_threshold scenarios, and reloads a ConfigMap update
// whole, refusing an invalid one while the running configuration keeps serving.
func TestERLEnvironmentAlone(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	root := t.TempDir()
	vol := &configmaptest.Volume{T: t, Dir: filepath.Join(root, "ratelimit", "config")}
	files := map[string]string{
		"basic.yaml":           erlTestdata(t, "basic.yaml"),
		"another.yaml":         erlTestdata(t, "another.yaml"),
		"share_threshold.yaml": erlTestdata(t, "share_threshold.yaml"),
	}
	vol.Update(files)
	httpPort, grpcPort, debugPort := freePort(t), freePort(t), freePort(t)
	p := startProcess(t, t.TempDir(), []string{
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false", "RUNTIME_IGNOREDOTFILES=true",
		"HOST=127.0.0.1", "PORT=" + httpPort, "GRPC_HOST=127.0.0.1", "GRPC_PORT=" + grpcPort, "DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + debugPort,
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + srv.Addr, "USE_STATSD=false", "LOG_LEVEL=info", "LOG_FORMAT=json",
	})
	if p.url != "http://127.0.0.1:"+httpPort {
		t.Fatalf("HTTP on %s, want PORT %s", p.url, httpPort)
	}
	get := func(url string) (int, string) {
		t.Helper()
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("GET %s: %v", url, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get(p.url + "/healthcheck"); code != 200 || body != "OK" {
		t.Errorf("GET /healthcheck = %d %q, want 200 OK", code, body)
	}
	conn, err := grpc.NewClient("127.0.0.1:"+grpcPort, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := rlsv3.NewRateLimitServiceClient(conn)
	if h, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{Service: "ratelimit"}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health of ratelimit = %v, %v; want SERVING", h, err)
	}

	// basic: key1 is 50 a second.
	r, err := ask(t, c, "basic", 1, "key1", "foo")
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 50 ||
		r.Statuses[0].CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || r.Statuses[0].LimitRemaining != 49 {
		t.Errorf("basic key1 = %v, %v; want OK, 50 a second, 49 left", r, err)
	}
	// another: key2 is 20 a minute per value; the 21st is over.
	value := strconv.FormatInt(time.Now().UnixNano(), 10)
	for i := range 25 {
		r, err := ask(t, c, "another", 1, "key2", value)
		wantCode, wantLeft := rlsv3.RateLimitResponse_OK, uint32(20-(i+1))
		if i >= 20 {
			wantCode, wantLeft = rlsv3.RateLimitResponse_OVER_LIMIT, 0
		}
		if err != nil || r.OverallCode != wantCode || r.Statuses[0].LimitRemaining != wantLeft || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 20 {
			t.Fatalf("another key2 request %d = %v, %v; want %v with %d left of 20", i+1, r, err, wantCode, wantLeft)
		}
	}
	// share_threshold: every files/* value shares one count of 10 an hour.
	for i := range 11 {
		r, err := ask(t, c, "share-threshold-test", 1, "files", "files/"+strconv.Itoa(i)+".txt")
		want := rlsv3.RateLimitResponse_OK
		if i == 10 {
			want = rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if err != nil || r.OverallCode != want {
			t.Fatalf("share-threshold files request %d = %v, %v; want %v (files/* share 10 an hour)", i+1, r, err, want)
		}
	}
	// A domain no file defines: OK with no limit, as envoyproxy/ratelimit answers it,
	// over gRPC and POST /json, and counted.
	unknownOK(t, c, "foo")
	if resp, err := http.Post(p.url+"/json", "application/json", strings.NewReader(`{"domain": "foo", "descriptors": [{"entries": [{"key": "hello", "value": "world"}]}]}`)); err != nil {
		t.Fatal(err)
	} else {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var r rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(b, &r); err != nil || resp.StatusCode != 200 || r.OverallCode != rlsv3.RateLimitResponse_OK || len(r.Statuses) != 1 || r.Statuses[0].CurrentLimit != nil {
			t.Errorf("POST /json for unknown domain foo = %d %s (%v), want 200 OK with no limit", resp.StatusCode, b, err)
		}
	}
	// POST /json on PORT.
	resp, err := http.Post(p.url+"/json", "application/json", strings.NewReader(`{"domain": "basic", "descriptors": [{"entries": [{"key": "one_per_minute", "value": "`+value+`"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("POST /json = %d, want 200", resp.StatusCode)
	}
	// DEBUG_PORT: metrics, and the domains served.
	debug := "http://127.0.0.1:" + debugPort
	if code, body := get(debug + "/metrics"); code != 200 || !strings.Contains(body, "\ntollgate_rls_unknown_domain_requests_total{domain=\"foo\"} 2\n") {
		t.Errorf("GET DEBUG_PORT/metrics = %d, want 200 with tollgate's metrics, the two requests for domain foo counted:\n%s", code, body)
	}
	if code, body := get(debug + "/rlconfig"); code != 200 || body != "another\nbasic\nshare-threshold-test\n" {
		t.Errorf("GET DEBUG_PORT/rlconfig = %d %q, want the three domains", code, body)
	}

	// A ConfigMap update: basic's key1 down to 7 a second, another removed. The
	// service reads the directory every 2 seconds (TOLLGATE_POLICY_POLL's default).
	basic7 := strings.Replace(files["basic.yaml"], "requests_per_unit: 50\n\n  - key: key1_local", "requests_per_unit: 7\n\n  - key: key1_local", 1)
	if basic7 == files["basic.yaml"] {
		t.Fatal("basic.yaml's key1 limit not found to change")
	}
	vol.Update(map[string]string{"basic.yaml": basic7, "share_threshold.yaml": files["share_threshold.yaml"]})
	key1Limit := func() uint32 {
		r, err := ask(t, c, "basic", 1, "key1", "bar")
		if err != nil {
			t.Fatalf("basic key1 = %v", err)
		}
		return r.Statuses[0].CurrentLimit.GetRequestsPerUnit()
	}
	deadline := time.Now().Add(15 * time.Second)
	for key1Limit() != 7 {
		if time.Now().After(deadline) {
			t.Fatalf("basic key1 still %d a second 15s after the ConfigMap update to 7", key1Limit())
		}
		time.Sleep(100 * time.Millisecond)
	}
	unknownOK(t, c, "another") // its file removed
	if _, body := get(debug + "/metrics"); !strings.Contains(body, "\ntollgate_rls_unknown_domain_requests_total{domain=\"another\"} 1\n") {
		t.Errorf("GET DEBUG_PORT/metrics after a request for removed domain another, want it counted once:\n%s", body)
	}
	// An invalid update is refused, logged, and the running configuration stays.
	vol.Update(map[string]string{"basic.yaml": strings.Replace(basic7, "unit: minute", "unit: fortnight", 1), "share_threshold.yaml": files["share_threshold.yaml"]})
	deadline = time.Now().Add(15 * time.Second)
	for !strings.Contains(p.logText(), "fortnight") {
		if time.Now().After(deadline) {
			t.Fatalf("no log of the refused update 15s after it:\n%s", p.logText())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if l := p.logLine(t, "policy reload refused; the running policy stays"); !strings.Contains(l["err"].(string), "basic.yaml") {
		t.Errorf("refused reload logged as %v, want the file named", l)
	}
	if got := key1Limit(); got != 7 {
		t.Errorf("basic key1 after the refused update = %d a second, want the running 7", got)
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("no exit 10s after SIGTERM")
	}
}

// TestERLHealthNeedsConfig starts on an empty configuration directory with
// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED: /healthcheck fails until a file appears.
func TestERLHealthNeedsConfig(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "ratelimit", "config")
	c, err := loadConfig(env(erlBase(map[string]string{"RUNTIME_ROOT": root, "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": "true", "REDIS_URL": "", "REDIS_SOCKET_TYPE": ""})), []string{"--redis", ""})
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, c)
	check := func() int {
		rec := httptest.NewRecorder()
		s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthcheck", nil))
		return rec.Code
	}
	if got := check(); got != http.StatusInternalServerError {
		t.Errorf("/healthcheck with no configuration = %d, want 500", got)
	}
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "basic.yaml"), []byte(erlTestdata(t, "basic.yaml")), 0o644)
	if result, err := s.erlDir.Reload(context.Background()); err != nil {
		t.Fatalf("Reload() = %s, %v", result, err)
	}
	if got := check(); got != http.StatusOK {
		t.Errorf("/healthcheck with basic.yaml loaded = %d, want 200", got)
	}
	s.health.stop()
	if got := check(); got != http.StatusInternalServerError {
		t.Errorf("/healthcheck after SIGTERM = %d, want 500", got)
	}
}

// TestERLMergeShadowUDS serves two files of one domain, joined by
// MERGE_DOMAIN_CONFIG (refused without it), in SHADOW_MODE (an answer over the
// limit becomes OK, its descriptor's status still OVER_LIMIT), over gRPC on the Unix
// socket GRPC_UDS names.
func TestERLMergeShadowUDS(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	dir := filepath.Join(root, "rl", "config")
	os.MkdirAll(dir, 0o755)
	os.WriteFile(filepath.Join(dir, "a.yaml"), []byte("domain: d\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "b.yaml"), []byte("domain: d\ndescriptors:\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 2}\n"), 0o644)
	sock := filepath.Join(t.TempDir(), "rl.sock")
	base := map[string]string{"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "rl", "GRPC_UDS": sock, "REDIS_URL": redistest.StartServer(t).Addr, "REDIS_SOCKET_TYPE": "tcp"}
	c, err := loadConfig(env(base), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := newService(context.Background(), c, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "MERGE_DOMAIN_CONFIG") {
		t.Fatalf("newService with domain d in two files = %v, want an error naming MERGE_DOMAIN_CONFIG", err)
	}
	base["MERGE_DOMAIN_CONFIG"], base["SHADOW_MODE"] = "true", "true"
	if c, err = loadConfig(env(base), nil); err != nil {
		t.Fatal(err)
	}
	s := startService(t, c)
	serveGRPC(t, c, s)
	conn, err := grpc.NewClient("unix:"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r, err := ask(t, client, "d", 1, "k1", "v")
		if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != want {
			t.Errorf("k1 request %d in shadow mode = %v, %v; want overall OK, descriptor %v", i+1, r, err, want)
		}
	}
	if r, err := ask(t, client, "d", 1, "k2", "v"); err != nil || r.Statuses[0].CurrentLimit.GetRequestsPerUnit() != 2 {
		t.Errorf("k2 (from b.yaml, merged) = %v, %v; want its limit of 2 a minute", r, err)
	}
	// POST /json is in shadow mode too: k1's third request is over, and passed.
	code, r := postJSON(t, s.handler, `{"domain": "d", "descriptors": [{"entries": [{"key": "k1", "value": "v"}]}]}`)
	if code != http.StatusOK || r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].Code != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("POST /json k1 in shadow mode = %d %v; want 200, overall OK, descriptor OVER_LIMIT", code, r)
	}
}

// TestERLQuotaModeEveryDescriptor sets QUOTA_MODE (a request over a limit is
// passed, and its descriptor's status says OK) and
// LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED (the limit headers once per descriptor).
func TestERLQuotaModeEveryDescriptor(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "q.yaml"), []byte("domain: q\ndescriptors:\n  - key: k1\n    rate_limit: {unit: minute, requests_per_unit: 1}\n  - key: k2\n    rate_limit: {unit: minute, requests_per_unit: 5}\n"), 0o644)
	base := map[string]string{"RUNTIME_ROOT": filepath.Dir(dir), "RUNTIME_SUBDIRECTORY": ".", "RUNTIME_APPDIRECTORY": filepath.Base(dir),
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": redistest.StartServer(t).Addr, "LIMIT_RESPONSE_HEADERS_ENABLED": "true"}
	for _, quota := range []bool{false, true} {
		base["QUOTA_MODE"] = strconv.FormatBool(quota)
		base["LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED"] = strconv.FormatBool(quota)
		v := strconv.FormatBool(quota) // each run its own counts
		body := `{"domain": "q", "descriptors": [{"entries": [{"key": "k1", "value": "` + v + `"}]}, {"entries": [{"key": "k2", "value": "` + v + `"}]}]}`
		c, err := loadConfig(env(base), nil)
		if err != nil {
			t.Fatal(err)
		}
		s, err := newService(context.Background(), c, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		postJSON(t, s.handler, body) // k1's one request of the minute
		code, r := postJSON(t, s.handler, body)
		limits := 0
		for _, h := range r.ResponseHeadersToAdd {
			if h.Key == "RateLimit-Limit" {
				limits++
			}
		}
		wantCode, wantOverall, wantK1, wantLimits := http.StatusTooManyRequests, rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT, 1
		if quota {
			wantCode, wantOverall, wantK1, wantLimits = http.StatusOK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, 2
		}
		if code != wantCode || r.OverallCode != wantOverall || len(r.Statuses) != 2 || r.Statuses[0].Code != wantK1 || limits != wantLimits {
			t.Errorf("QUOTA_MODE=%v: k1 over its limit = %d %v; want %d, overall %v, k1 %v, RateLimit-Limit %d times", quota, code, r, wantCode, wantOverall, wantK1, wantLimits)
		}
	}
}

// postJSON posts body to h's POST /json and returns the status code and the answer.
func postJSON(t *testing.T, h http.Handler, body string) (int, *rlsv3.RateLimitResponse) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
	var r rlsv3.RateLimitResponse
	if err := protojson.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatalf("POST /json = %d %s: %v", rec.Code, rec.Body, err)
	}
	return rec.Code, &r
}

// TestERLHealthFollowsRedis sets REDIS_HEALTH_CHECK_ACTIVE_CONNECTION: /healthcheck
// answers 500 once Redis is gone (its circuit breaker open), and 200 while it
// answers.
func TestERLHealthFollowsRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "basic.yaml"), []byte(erlTestdata(t, "basic.yaml")), 0o644)
	c, err := loadConfig(env(map[string]string{"RUNTIME_ROOT": filepath.Dir(dir), "RUNTIME_SUBDIRECTORY": ".", "RUNTIME_APPDIRECTORY": filepath.Base(dir),
		"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": srv.Addr, "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION": "true"}), nil)
	if err != nil {
		t.Fatal(err)
	}
	s := startService(t, c)
	check := func() int {
		rec := httptest.NewRecorder()
		s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthcheck", nil))
		return rec.Code
	}
	decide := func() {
		rec := httptest.NewRecorder()
		s.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(`{"domain": "basic", "descriptors": [{"entries": [{"key": "key1", "value": "x"}]}]}`)))
	}
	decide()
	if got := check(); got != http.StatusOK {
		t.Fatalf("/healthcheck with Redis up = %d, want 200", got)
	}
	srv.Kill()
	for i := 0; check() == http.StatusOK; i++ {
		if i == 100 {
			t.Fatal("/healthcheck still 200 after 100 decisions with Redis gone")
		}
		decide()
	}
}

// TestERLReloadWhileServing swaps a ConfigMap-style directory between two versions
// while clients decide: every answer is one version's (domain d limited to 1000 or
// 2000 a minute; domain e present in the second only), never a failure of a domain
// the version being served has.
func TestERLReloadWhileServing(t *testing.T) {
	t.Parallel()
	vol := &configmaptest.Volume{T: t, Dir: t.TempDir()}
	v1 := map[string]string{"d.yaml": erlDoc("d", 1000)}
	v2 := map[string]string{"d.yaml": erlDoc("d", 2000), "e.yaml": erlDoc("e", 5)}
	vol.Update(v1)
	s := erlService(t, vol.Dir)
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				r, err := s.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}})
				if err != nil {
					errs <- err
					return
				}
				if n := r.Statuses[0].CurrentLimit.GetRequestsPerUnit(); n != 1000 && n != 2000 {
					errs <- fmt.Errorf("limit %d, want 1000 or 2000", n)
					return
				}
			}
		}()
	}
	applied := 0
	for i := range 40 {
		vol.Update([]map[string]string{v2, v1}[i%2])
		if result, err := s.erlDir.Reload(context.Background()); result == reload.Applied {
			applied++
		} else if err != nil {
			t.Errorf("Reload() = %s, %v", result, err)
		}
	}
	close(stop)
	for range 4 {
		if err := <-errs; err != nil {
			t.Errorf("a decision during the reloads: %v", err)
		}
	}
	if applied != 40 {
		t.Errorf("%d of 40 updates applied, want all", applied)
	}
}

// unknownOK checks that c answers a request for domain, which no file defines, as
// envoyproxy/ratelimit does: OK, and one status OK with no limit.
func unknownOK(t *testing.T, c rlsv3.RateLimitServiceClient, domain string) {
	t.Helper()
	r, err := ask(t, c, domain, 1, "key2", "v")
	if err != nil || r.OverallCode != rlsv3.RateLimitResponse_OK || len(r.Statuses) != 1 ||
		r.Statuses[0].Code != rlsv3.RateLimitResponse_OK || r.Statuses[0].CurrentLimit != nil {
		t.Errorf("unknown domain %s = %v, %v; want OK with one status OK and no limit", domain, r, err)
	}
}

// startService starts the service of configuration c, closed when t ends.
func startService(t *testing.T, c config) *service {
	t.Helper()
	s, err := newService(context.Background(), c, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// serveGRPC serves s's gRPC services (grpcServer) on c's gRPC listener, with the
// quota service's windows running, until t ends, and returns the listener's
// address.
func serveGRPC(t *testing.T, c config, s *service) string {
	t.Helper()
	ln, err := listen(c.GRPCListen)
	if err != nil {
		t.Fatal(err)
	}
	gs := s.grpcServer(c)
	ctx, cancel := context.WithCancel(context.Background())
	go s.rlqs.Run(ctx)
	go gs.Serve(ln)
	t.Cleanup(func() { gs.Stop(); cancel() })
	return ln.Addr().String()
}
