// Command limiter is tollgate's HTTP decision service: POST /v1/check and friends. On
// AWS Lambda (detected from AWS_LAMBDA_RUNTIME_API) it serves a Function URL in
// RESPONSE_STREAM mode through aws-lambda-go's lambdaurl; elsewhere it listens on
// --listen. With REDIS_URL unset it starts an embedded in-process Redis (miniredis).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/lambda"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/awsredis"
	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/reload"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// config is the service's configuration, from flags and the environment.
type config struct {
	Listen string // TOLLGATE_LISTEN / --listen, default 127.0.0.1:8080
	// GRPCListen serves Envoy's gRPC RateLimitService there too (TOLLGATE_GRPC_LISTEN /
	// --grpc-listen; empty: not served). Not on Lambda.
	GRPCListen string
	// ERLConfig is a directory of envoyproxy/ratelimit configuration files, each
	// served as its domain by the gRPC service and POST /json beside the policy's,
	// each read again as the policy is (TOLLGATE_ERL_CONFIG / --erl-config; see
	// package erl and erlEngines).
	ERLConfig string
	// OneQuota names the one-limit headers of the gRPC service's and POST /json's
	// answers, from envoyproxy/ratelimit's own LIMIT_RESPONSE_HEADERS_ENABLED and
	// LIMIT_*_HEADER variables (rls.ERLHeaders); none by default, as in ERL.
	OneQuota algo.OneQuotaNames
	// EveryDescriptor sends the OneQuota headers once per descriptor with a limit
	// (LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED, rls.ERLEveryDescriptor).
	EveryDescriptor bool
	// PolicyPath is the policy file (TOLLGATE_POLICY / --policy; empty: the copy of
	// lambda/policy.yaml built into the binary, or policy.yaml next to the binary on
	// Lambda). A policy named by a flag wins over one named in the environment.
	PolicyPath string
	PolicyJSON string // TOLLGATE_POLICY_JSON / --policy-json: an inline policy, instead of the file
	PolicySSM  string // TOLLGATE_POLICY_SSM / --policy-ssm: an SSM parameter holding the policy, instead of the file
	// PolicyPoll is how often the policy's source is read for a change
	// (TOLLGATE_POLICY_POLL / --policy-poll, default 2s; 0: only on SIGHUP). On
	// Lambda the source is read at most this often, before a request.
	PolicyPoll   time.Duration
	RedisURL     string // REDIS_URL / --redis; empty: embedded miniredis
	RedisCluster bool   // REDIS_CLUSTER / --redis-cluster
	// EmbeddedRedis is the address the embedded Redis listens on when RedisURL is
	// empty (TOLLGATE_EMBEDDED_REDIS / --embedded-redis; empty: a free port on
	// 127.0.0.1). Its URL is logged at start.
	EmbeddedRedis string
	// AdminToken enables /v1/state and /v1/reset (TOLLGATE_ADMIN_TOKEN; no flag, so
	// that the secret stays out of the process list).
	AdminToken string
	OnLambda   bool // AWS_LAMBDA_RUNTIME_API is set
	// Batch sends concurrent decisions to Redis as one pipeline (TOLLGATE_BATCH /
	// --batch, default true; see redisstore.Options).
	Batch bool
	// BatchWait bounds how long a decision queued behind a Redis round trip waits
	// before its queue goes out on its own (TOLLGATE_BATCH_WAIT / --batch-wait, 1µs to 1s; unset:
	// redisstore.DefaultBatchWait).
	BatchWait time.Duration
	// Auth is the ElastiCache authentication: REDIS_AUTH_SECRET_ARN, or
	// REDIS_IAM_USER + REDIS_CACHE_NAME (+ REDIS_IAM_SERVERLESS).
	Auth awsredis.Auth
	// Server bounds what one connection may hold when the service listens itself
	// (not on Lambda, where the runtime owns the connections).
	Server serverLimits
	// DebugListen serves /debug/pprof/ and /metrics there (TOLLGATE_DEBUG_LISTEN /
	// --debug-listen, or ERL's DEBUG_HOST:DEBUG_PORT; empty: not served).
	DebugListen string
	// LogLevel and LogFormat shape the log (TOLLGATE_LOG_LEVEL / --log-level: debug,
	// info, warn or error, default info; TOLLGATE_LOG_FORMAT / --log-format: json or
	// text, default json; or ERL's LOG_LEVEL and LOG_FORMAT, default warn and text).
	LogLevel  string
	LogFormat string
	// ERL is envoyproxy/ratelimit's environment (erlEnv); when it is on, it gives
	// the defaults of Listen, GRPCListen, DebugListen, ERLConfig and the log.
	ERL erlEnv
	// RedisERL holds what ERL's Redis settings add to RedisURL: REDIS_TLS's
	// configuration, REDIS_SENTINEL_AUTH, REDIS_POOL_SIZE, REDIS_TIMEOUT. Its URL
	// is unused.
	RedisERL redisstore.Config
}

// serverLimits bound the plain HTTP server, so that slow or idle clients cannot hold
// it: every duration must be positive, MaxConns at least 1.
type serverLimits struct {
	// ReadTimeout is the time a whole request, headers and body, may take to arrive
	// (TOLLGATE_READ_TIMEOUT / --read-timeout, default 5s). A body is at most 16 KiB,
	// which a caller on the same network sends in well under a millisecond: 5s is
	// generous, and caps how long a client trickling bytes keeps its connection.
	// The policy's failure.timeout bounds the decision that follows, not the read.
	ReadTimeout time.Duration
	// WriteTimeout is the time from the end of the request's headers to the end of
	// the answer (TOLLGATE_WRITE_TIMEOUT / --write-timeout, default 10s). It covers
	// the body read and the decision, so it must exceed ReadTimeout plus the policy's
	// failure.timeout (checked at start).
	WriteTimeout time.Duration
	// IdleTimeout is how long a keep-alive connection may wait for its next request
	// (TOLLGATE_IDLE_TIMEOUT / --idle-timeout, default 60s).
	IdleTimeout time.Duration
	// MaxConns caps open connections (TOLLGATE_MAX_CONNS / --max-conns, default
	// 2048); further connections wait in the kernel's accept queue until one closes.
	// Each open connection costs a goroutine and its buffers, some 20 KiB.
	MaxConns int
	// ShutdownGrace is how long SIGTERM waits for requests in flight before it
	// closes every connection left (TOLLGATE_SHUTDOWN_GRACE / --shutdown-grace,
	// default 5s).
	ShutdownGrace time.Duration
}

// defaultServerLimits are the limits of a service configured with none.
var defaultServerLimits = serverLimits{
	ReadTimeout:   5 * time.Second,
	WriteTimeout:  10 * time.Second,
	IdleTimeout:   60 * time.Second,
	MaxConns:      2048,
	ShutdownGrace: 5 * time.Second,
}

// A usageError is a command line loadConfig cannot read: an unknown flag or word, or
// a flag without its value. main answers it with exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// loadConfig reads the environment through getenv, then the flags in args: a flag
// wins over its environment variable, tollgate's variable over envoyproxy/ratelimit's
// (see erlEnv), and that over the default. It returns flag.ErrHelp for -h or --help,
// and a usageError for a command line it cannot read.
func loadConfig(getenv func(string) string, args []string) (config, error) {
	e, err := readERL(getenv)
	if err != nil {
		return config{}, err
	}
	listen, logLevel, logFormat := defaultListen, "info", "json"
	if e.On {
		listen, logLevel, logFormat = e.HTTP, e.LogLevel.String(), e.LogFormat
	}
	c := config{
		ERL:           e,
		Listen:        or(getenv("TOLLGATE_LISTEN"), listen),
		GRPCListen:    or(getenv("TOLLGATE_GRPC_LISTEN"), e.GRPC),
		DebugListen:   or(getenv("TOLLGATE_DEBUG_LISTEN"), e.Debug),
		LogLevel:      strings.ToLower(or(getenv("TOLLGATE_LOG_LEVEL"), logLevel)),
		LogFormat:     or(getenv("TOLLGATE_LOG_FORMAT"), logFormat),
		ERLConfig:     or(getenv("TOLLGATE_ERL_CONFIG"), e.Dir),
		PolicyPath:    getenv("TOLLGATE_POLICY"),
		PolicyJSON:    getenv("TOLLGATE_POLICY_JSON"),
		PolicySSM:     getenv("TOLLGATE_POLICY_SSM"),
		PolicyPoll:    defaultPolicyPoll,
		RedisURL:      getenv("REDIS_URL"),
		EmbeddedRedis: getenv("TOLLGATE_EMBEDDED_REDIS"),
		AdminToken:    getenv("TOLLGATE_ADMIN_TOKEN"),
		OnLambda:      getenv("AWS_LAMBDA_RUNTIME_API") != "",
		Batch:         true,
		Server:        defaultServerLimits,
	}
	if err := c.Server.fromEnv(getenv); err != nil {
		return c, err
	}
	if v := getenv("TOLLGATE_POLICY_POLL"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return c, fmt.Errorf("TOLLGATE_POLICY_POLL=%q: want a duration such as 2s, or 0 to reload only on SIGHUP", v)
		}
		c.PolicyPoll = d
	}
	if v := getenv("TOLLGATE_BATCH"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("TOLLGATE_BATCH=%q: want true or false", v)
		}
		c.Batch = b
	}
	if e.PipelineWindow != 0 {
		c.BatchWait = e.PipelineWindow
	}
	if v := getenv("TOLLGATE_BATCH_WAIT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || !validBatchWait(d) {
			return c, fmt.Errorf("TOLLGATE_BATCH_WAIT=%q: want a duration from 1us to 1s, such as 300us (leave it unset for the default, %v)", v, redisstore.DefaultBatchWait)
		}
		c.BatchWait = d
	}
	oneQuota, err := rls.ERLHeaders(getenv)
	if err != nil {
		return c, err
	}
	c.OneQuota = oneQuota
	if c.EveryDescriptor, err = rls.ERLEveryDescriptor(getenv); err != nil {
		return c, err
	}
	if v := getenv("REDIS_CLUSTER"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("REDIS_CLUSTER=%q: want true or false", v)
		}
		c.RedisCluster = b
	}
	auth, err := awsredis.AuthFromEnv(getenv)
	if err != nil {
		return c, err
	}
	c.Auth = auth
	fs := flag.NewFlagSet("limiter", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // main prints the error and the usage
	c.flags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, err
		}
		return c, usageError{err}
	}
	if fs.NArg() > 0 {
		return c, usageError{fmt.Errorf("unexpected argument %q: the service takes only flags; the commands are policy and help", fs.Arg(0))}
	}
	// A policy named by a flag wins over one named in the environment.
	var redisFlag, clusterFlag bool
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "policy":
			c.PolicyJSON, c.PolicySSM = "", ""
		case "policy-json":
			c.PolicyPath, c.PolicySSM = "", ""
		case "policy-ssm":
			c.PolicyPath, c.PolicyJSON = "", ""
		case "redis":
			redisFlag = true
		case "redis-cluster":
			clusterFlag = true
		case "batch-wait":
			if !validBatchWait(c.BatchWait) {
				err = fmt.Errorf("--batch-wait (TOLLGATE_BATCH_WAIT) = %v: want a duration from 1us to 1s, such as 300us (leave it unset for the default, %v)", c.BatchWait, redisstore.DefaultBatchWait)
			}
		}
	})
	if err != nil {
		return c, err
	}
	// REDIS_URL in envoyproxy/ratelimit's form (no scheme), or unset in its
	// environment: its other Redis settings say what it is. They describe that
	// REDIS_URL only, so --redis leaves them unread (and unchecked).
	if !redisFlag && ((c.RedisURL != "" && !strings.Contains(c.RedisURL, "://")) || (c.RedisURL == "" && e.On)) {
		if c.RedisERL, err = erlRedis(getenv); err != nil {
			return c, err
		}
		url, cluster, err := erlRedisURL(getenv)
		if err != nil {
			return c, err
		}
		c.RedisURL = url
		if !clusterFlag {
			c.RedisCluster = cluster
		}
	}
	if c.Auth.Mode() != awsredis.ModeNone && c.RedisURL == "" {
		return c, fmt.Errorf("ElastiCache authentication is configured (%s) but REDIS_URL is empty; set REDIS_URL=rediss://host:6379", c.Auth.Mode())
	}
	if err := c.Server.validate(); err != nil {
		return c, err
	}
	if _, err := erlLogLevel(c.LogLevel); err != nil {
		return c, fmt.Errorf("--log-level (TOLLGATE_LOG_LEVEL) = %q: want debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		return c, fmt.Errorf("--log-format (TOLLGATE_LOG_FORMAT) = %q: want json or text", c.LogFormat)
	}
	if c.PolicyPoll < 0 {
		return c, fmt.Errorf("--policy-poll = %v: want 0 or more", c.PolicyPoll)
	}
	if c.PolicyPath == "" && c.PolicyJSON == "" && c.PolicySSM == "" && c.OnLambda {
		c.PolicyPath = besideExecutable("policy.yaml")
	}
	return c, nil
}

// The defaults of the settings that have one.
const (
	defaultListen     = "127.0.0.1:8080"
	defaultPolicyPoll = 2 * time.Second
)

// validBatchWait reports whether d is a wait TOLLGATE_BATCH_WAIT accepts.
func validBatchWait(d time.Duration) bool { return d > 0 && d <= time.Second }

// flags defines a flag for each setting on fs, defaulting to c's values.
func (c *config) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.Listen, "listen", c.Listen, "serve HTTP on `ADDR`; port 0 picks a free one (env TOLLGATE_LISTEN)")
	fs.StringVar(&c.GRPCListen, "grpc-listen", c.GRPCListen, "also serve Envoy's gRPC RateLimitService on `ADDR`; empty: not served (env TOLLGATE_GRPC_LISTEN)")
	fs.StringVar(&c.ERLConfig, "erl-config", c.ERLConfig, "also serve the envoyproxy/ratelimit configuration files (*.yaml) in `DIR`, over gRPC and POST /json (env TOLLGATE_ERL_CONFIG)")
	fs.StringVar(&c.PolicyPath, "policy", c.PolicyPath, "read the policy from `FILE`, YAML or JSON, again when it changes; empty: the copy of lambda/policy.yaml built into the binary (on Lambda: policy.yaml beside the binary) (env TOLLGATE_POLICY)")
	fs.StringVar(&c.PolicyJSON, "policy-json", c.PolicyJSON, "the policy itself, a JSON `DOCUMENT`, instead of a file (env TOLLGATE_POLICY_JSON)")
	fs.StringVar(&c.PolicySSM, "policy-ssm", c.PolicySSM, "read the policy from the SSM Parameter Store parameter `NAME`, instead of a file (env TOLLGATE_POLICY_SSM)")
	fs.DurationVar(&c.PolicyPoll, "policy-poll", c.PolicyPoll, "read the policy for a change every `DURATION`; 0: only on SIGHUP (env TOLLGATE_POLICY_POLL)")
	fs.StringVar(&c.RedisURL, "redis", c.RedisURL, "decide on the Redis at `URL`, such as redis://127.0.0.1:6379 or rediss://host:6379; empty: an embedded in-process Redis (miniredis), whose state is lost on exit (env REDIS_URL)")
	fs.BoolVar(&c.RedisCluster, "redis-cluster", c.RedisCluster, "the Redis is a Redis Cluster (env REDIS_CLUSTER)")
	fs.StringVar(&c.EmbeddedRedis, "embedded-redis", c.EmbeddedRedis, "without --redis, the embedded Redis listens on `ADDR`; empty: a free port on 127.0.0.1. Its URL is logged at start (\"embedded Redis listening\") for limiter policy explain --redis URL (env TOLLGATE_EMBEDDED_REDIS)")
	fs.StringVar(&c.DebugListen, "debug-listen", c.DebugListen, "serve /debug/pprof/ and /metrics on `ADDR` too; empty: not served (env TOLLGATE_DEBUG_LISTEN; envoyproxy/ratelimit's DEBUG_HOST:DEBUG_PORT)")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log at `LEVEL` and above: debug, info, warn or error (env TOLLGATE_LOG_LEVEL; envoyproxy/ratelimit's LOG_LEVEL)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log as json or text (env TOLLGATE_LOG_FORMAT; envoyproxy/ratelimit's LOG_FORMAT)")
	fs.BoolVar(&c.Batch, "batch", c.Batch, "send concurrent decisions to Redis as one pipeline; --batch=false: one round trip each (env TOLLGATE_BATCH)")
	fs.DurationVar(&c.BatchWait, "batch-wait", c.BatchWait, "a decision queued behind a Redis round trip waits at most `DURATION` (1us to 1s); 0: "+redisstore.DefaultBatchWait.String()+" (env TOLLGATE_BATCH_WAIT)")
	c.Server.flags(fs)
}

// A durationLimit is one of serverLimits' durations with its flag and variable.
type durationLimit struct {
	flag, env, usage string
	value            *time.Duration
}

// durations lists l's durations, pointing into l.
func (l *serverLimits) durations() []durationLimit {
	return []durationLimit{
		{"read-timeout", "TOLLGATE_READ_TIMEOUT", "time a whole request, headers and body, may take to arrive", &l.ReadTimeout},
		{"write-timeout", "TOLLGATE_WRITE_TIMEOUT", "time from a request's headers to the end of its answer", &l.WriteTimeout},
		{"idle-timeout", "TOLLGATE_IDLE_TIMEOUT", "time a keep-alive connection may wait for its next request", &l.IdleTimeout},
		{"shutdown-grace", "TOLLGATE_SHUTDOWN_GRACE", "time SIGTERM gives requests in flight before closing every connection", &l.ShutdownGrace},
	}
}

// fromEnv reads the limits' environment variables through getenv.
func (l *serverLimits) fromEnv(getenv func(string) string) error {
	for _, d := range l.durations() {
		if v := getenv(d.env); v != "" {
			var err error
			if *d.value, err = time.ParseDuration(v); err != nil {
				return fmt.Errorf("%s=%q: want a duration such as 5s or 500ms", d.env, v)
			}
		}
	}
	if v := getenv("TOLLGATE_MAX_CONNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("TOLLGATE_MAX_CONNS=%q: want a whole number of connections, such as 2048", v)
		}
		l.MaxConns = n
	}
	return nil
}

// flags defines the limits' flags on fs, defaulting to their current values.
func (l *serverLimits) flags(fs *flag.FlagSet) {
	for _, d := range l.durations() {
		fs.DurationVar(d.value, d.flag, *d.value, d.usage+" (env "+d.env+")")
	}
	fs.IntVar(&l.MaxConns, "max-conns", l.MaxConns, "hold at most `N` open connections; more wait to be accepted (env TOLLGATE_MAX_CONNS)")
}

// validate names the first limit out of range, with its flag and variable.
func (l *serverLimits) validate() error {
	def := defaultServerLimits
	for i, d := range l.durations() {
		if *d.value <= 0 {
			return fmt.Errorf("--%s (%s) = %v: want a positive duration, such as %v", d.flag, d.env, *d.value, *def.durations()[i].value)
		}
	}
	if l.MaxConns < 1 {
		return fmt.Errorf("--max-conns (TOLLGATE_MAX_CONNS) = %d: want at least 1, such as %d", l.MaxConns, def.MaxConns)
	}
	return nil
}

// fitsPolicy checks that an answer can still be written after the slowest body the
// read timeout lets through and the longest decision the policy allows.
func (l serverLimits) fitsPolicy(decisionTimeout time.Duration) error {
	if need := l.ReadTimeout + decisionTimeout; l.WriteTimeout <= need {
		return fmt.Errorf("--write-timeout (TOLLGATE_WRITE_TIMEOUT) = %v: must exceed --read-timeout (%v) plus the policy's failure.timeout (%v), or a slow body and a slow decision lose their answer; raise it above %v", l.WriteTimeout, l.ReadTimeout, decisionTimeout, need)
	}
	return nil
}

func or(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

// policySource names where c's policy comes from, for the log.
func policySource(c config) string {
	switch {
	case c.PolicyJSON != "":
		return "TOLLGATE_POLICY_JSON"
	case c.PolicySSM != "":
		return "ssm:" + c.PolicySSM
	case c.PolicyPath != "":
		return c.PolicyPath
	}
	return lambda.DefaultPolicyName
}

func besideExecutable(name string) string {
	exe, err := os.Executable()
	if err != nil {
		return name
	}
	return exe[:len(exe)-len("bootstrap")] + name
}

// service is the wired decision service.
type service struct {
	handler http.Handler
	store   *redisstore.Store
	mini    *miniredis.Miniredis
	eng     *engine.Engine
	policy  *reload.Reloader
	// erl serves the domains of envoyproxy/ratelimit's configuration directory, and
	// erlDir reloads it; both nil without one.
	erl    *erlDomains
	erlDir *reload.Of[erlSet]
	// rls is Envoy's RateLimitService: erl, or the policy's engine alone.
	rls rlsv3.RateLimitServiceServer
	// rlqs is Envoy's Rate Limit Quota Service, for the policy's rlqs rules.
	rlqs *rlqs.Server
	// metrics serves the Prometheus registry (for the debug and Prometheus listeners).
	metrics http.Handler
	health  *health
}

// engines returns the policy's engine and those of envoyproxy/ratelimit's domains
// served now.
func (s *service) engines() []*engine.Engine {
	out := []*engine.Engine{s.eng}
	if s.erl != nil {
		out = append(out, s.erl.all()...)
	}
	return out
}

// reloaders returns what reloads the policy and the envoyproxy/ratelimit directory.
func (s *service) reloaders() []refresher {
	out := []refresher{s.policy}
	if s.erlDir != nil {
		out = append(out, s.erlDir)
	}
	return out
}

func (s *service) Close() {
	if s.store != nil {
		s.store.Close()
	}
	if s.mini != nil {
		s.mini.Close()
	}
}

// newService loads the policy, connects to Redis (or starts the embedded one), loads
// the scripts and builds the handler.
func newService(ctx context.Context, c config, log *slog.Logger) (*service, error) {
	src, err := reload.Where{Path: c.PolicyPath, JSON: c.PolicyJSON, SSM: c.PolicySSM}.Source(ctx)
	if err != nil {
		return nil, err
	}
	if !policyNamed(c) {
		src = reload.Inline{Label: lambda.DefaultPolicyName, Doc: lambda.DefaultPolicy()}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := decision.NewMetrics(reg)
	s := &service{}
	rl, p, err := reload.Load(ctx, reload.Config{
		Source: src,
		Apply: func(p *policy.Policy) error {
			if !c.OnLambda {
				if err := c.Server.fitsPolicy(p.Failure.Timeout); err != nil {
					return err
				}
			}
			return s.eng.SetPolicy(p)
		},
		Logger:   log,
		Reloaded: metrics.PolicyReloaded,
		Running:  metrics.PolicyRunning,
	})
	if err != nil {
		return nil, err
	}
	s.policy = rl
	url := c.RedisURL
	if url == "" {
		addr := or(c.EmbeddedRedis, "127.0.0.1:0")
		s.mini = miniredis.NewMiniRedis()
		if err := s.mini.StartAddr(addr); err != nil {
			return nil, fmt.Errorf("start the embedded Redis on %s: %w", addr, busyHint(err, "--embedded-redis ADDR or TOLLGATE_EMBEDDED_REDIS=ADDR"))
		}
		url = "redis://" + s.mini.Addr()
		log.Info("embedded Redis listening", "url", url, "explain", explainHint(c, url))
	}
	rc := c.RedisERL
	rc.URL, rc.Cluster = url, c.RedisCluster
	if s.mini != nil && rc.Timeout == 0 {
		// The embedded Redis answers from this process, on the CPUs the service
		// uses: its replies wait on the Go scheduler, not a network, so a command
		// waits up to a second rather than the default for a real Redis (the policy's
		// failure timeout still bounds a decision).
		rc.Timeout = time.Second
	}
	if c.Batch {
		rc.BatchWait = redisstore.DefaultBatchWait
		if c.BatchWait != 0 {
			rc.BatchWait = c.BatchWait
		}
	}
	store, err := awsredis.OpenStore(ctx, rc, c.Auth, log)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.store = store
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "tollgate_unreplicated_total",
		Help: "Admissions of limits with replicas whose charge did not reach that many replicas before the WAIT timed out (the decision stands).",
	}, func() float64 { return float64(store.Unreplicated()) }))
	// The engines of envoyproxy/ratelimit's domains come first, so that the store's
	// circuit breakers take the policy's settings from the engine made last.
	if c.ERLConfig != "" {
		if err := s.loadERL(ctx, c, store, metrics.Hooks(), log); err != nil {
			s.Close()
			return nil, err
		}
		if err := s.erl.rls.Register(reg); err != nil {
			s.Close()
			return nil, err
		}
	}
	s.eng, err = engine.New(engine.Config{Policy: p, Store: store, Logger: log, Hooks: metrics.Hooks()})
	if err != nil {
		s.Close()
		return nil, err
	}
	s.health = &health{needConfig: c.ERL.NeedConfig, redis: c.ERL.RedisHealth, s: s}
	// Envoy's Rate Limit Quota Service, for the policy's rlqs rules.
	if s.rlqs, err = rlqs.New(rlqs.Config{Engine: s.eng, Registerer: reg, Logger: log}); err != nil {
		s.Close()
		return nil, err
	}
	s.metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	mux := http.NewServeMux()
	mux.Handle("/", decision.NewHandler(s.eng, decision.Options{
		AdminToken: c.AdminToken,
		Admin:      store,
		Registry:   reg,
		Logger:     log,
	}))
	// envoyproxy/ratelimit's health check, on its HTTP port.
	mux.Handle("GET /healthcheck", s.health)
	if s.erl != nil {
		if policyNamed(c) {
			// The policy decides its domain, even where a file names it too.
			s.erl.own, s.erl.ownDomain = s.eng, p.Domain
			if err := s.erl.apply(s.erl.last); err != nil {
				s.Close()
				return nil, err
			}
		}
		s.rls = s.erl
		// envoyproxy/ratelimit's HTTP endpoint, for its clients.
		mux.Handle("POST /json", s.erl)
	} else {
		r := rls.New(s.eng, log)
		configureRLS(c)(r)
		if err := r.Register(reg); err != nil {
			s.Close()
			return nil, err
		}
		s.rls = r
		mux.Handle("POST /json", r.JSONHandler())
	}
	s.handler = mux
	return s, nil
}

// configureRLS returns what sets the gRPC service's (and POST /json's) settings from
// c: its headers and envoyproxy/ratelimit's global shadow and quota modes.
func configureRLS(c config) func(*rls.Server) {
	return func(r *rls.Server) {
		r.OneQuota = c.OneQuota
		r.EveryDescriptor = c.EveryDescriptor
		r.Shadow, r.Quota = c.ERL.Shadow, c.ERL.Quota
	}
}

// explainHint says how to explain a request with c's policy on the embedded Redis at
// url, for the log line that gives url: limiter policy explain reads a policy file,
// so a policy from elsewhere is saved to one first.
func explainHint(c config, url string) string {
	explain := func(file string) string {
		return "limiter policy explain --redis " + url + " " + file + " ATTRIBUTE=VALUE..."
	}
	builtIn := explain("lambda/policy.yaml") + " (in the source tree: the built-in policy is a copy of that file)"
	switch {
	case c.PolicyPath != "":
		return explain(c.PolicyPath)
	case c.PolicyJSON != "":
		return "save TOLLGATE_POLICY_JSON's document as policy.json, then " + explain("policy.json")
	case c.PolicySSM != "":
		return "aws ssm get-parameter --name " + c.PolicySSM + " --query Parameter.Value --output text > policy.yaml, then " + explain("policy.yaml")
	case c.ERLConfig != "":
		return "the envoyproxy/ratelimit domains of " + c.ERLConfig + " are not tollgate policy files, which limiter policy explain reads; POST /v1/check decides with the built-in policy: " + builtIn
	}
	return builtIn
}

// policyNamed reports whether c names a policy (a file, a document or a parameter)
// rather than leaving the built-in one.
func policyNamed(c config) bool { return c.PolicyPath != "" || c.PolicyJSON != "" || c.PolicySSM != "" }

// loadERL loads envoyproxy/ratelimit's configuration directory, c.ERLConfig, every
// file in it translated (package erl) and validated, into an engine per domain on
// store, and keeps the reloader of the directory. A reload applies the directory
// whole when every file is valid (domains added, changed, removed); one problem in
// any file refuses it, logged, and the running set keeps serving. A directory that
// Kubernetes mounts from a ConfigMap is read through one resolution of its ..data
// link (reload.Dir), so an update is never read half old, half new.
//
// With ERL's environment (c.ERL.On) the directory is read as ERL reads it: a missing
// or empty one serves no domain (see HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED), dot
// files count unless RUNTIME_IGNOREDOTFILES. With --erl-config it must hold a file,
// and dot files are skipped.
func (s *service) loadERL(ctx context.Context, c config, store engine.Store, hooks engine.Hooks, log *slog.Logger) error {
	s.erl = newERLDomains(store, hooks, log, configureRLS(c))
	src := reload.Dir{Path: c.ERLConfig, IgnoreDotFiles: !c.ERL.On || c.ERL.IgnoreDotFiles, AllowMissing: c.ERL.On}
	rl, set, err := reload.LoadOf(ctx, reload.ConfigOf[erlSet]{
		Source: src,
		Parse:  func(doc []byte) (erlSet, error) { return parseERLDir(doc, c.ERL.Merge) },
		Apply:  s.erl.apply,
		Logger: log,
	})
	if err != nil {
		return fmt.Errorf("envoyproxy/ratelimit configuration: %w", err)
	}
	if len(set.domains) == 0 && !c.ERL.On {
		return fmt.Errorf("--erl-config %s: no configuration file in the directory", c.ERLConfig)
	}
	if len(set.domains) == 0 {
		log.Warn("no envoyproxy/ratelimit configuration in the directory yet; every domain is unknown until one appears", "dir", c.ERLConfig)
	}
	s.erlDir = rl
	return s.erl.apply(set)
}

// A refresher reads its source again: when it was last read at least ttl ago
// (Refresh), or every interval and on a signal (Watch).
type refresher interface {
	Refresh(ctx context.Context, ttl time.Duration) (string, error)
	Watch(ctx context.Context, every time.Duration, now <-chan os.Signal)
}

// refreshing reads the policy's source (and the envoyproxy/ratelimit files) before a
// request when it was last read at least every ago: on Lambda, where nothing runs
// between invocations to poll it.
func refreshing(h http.Handler, rls []refresher, every time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for _, rl := range rls {
			rl.Refresh(r.Context(), every)
		}
		h.ServeHTTP(w, r)
	})
}

func main() {
	os.Exit(command(context.Background(), os.Getenv, os.Args[1:], os.Stdout, os.Stderr))
}

// command runs the limiter with args, a command or the service's flags, and returns
// its exit status: 0, 1 when the service stops on an error (logged as JSON on
// stderr), 2 for a command line it cannot read (with the usage). Help goes to
// stdout.
func command(ctx context.Context, getenv func(string) string, args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "policy":
			return policyCommand(ctx, args[1:], stdout)
		case "help":
			if len(args) > 1 && args[1] == "policy" {
				return policyCommand(ctx, []string{"help"}, stdout)
			}
			printUsage(stdout)
			return 0
		}
		fmt.Fprintf(stderr, "limiter: unknown command %q\n\n", args[0])
		printUsage(stderr)
		return 2
	}
	// Help, even when a variable is wrong.
	if errors.Is(defaultFlags().Parse(args), flag.ErrHelp) {
		printUsage(stdout)
		return 0
	}
	c, err := loadConfig(getenv, args)
	if _, ok := errors.AsType[usageError](err); ok {
		fmt.Fprintf(stderr, "limiter: %v\n\n", err)
		printUsage(stderr)
		return 2
	}
	log := newLogger(stderr, c.LogLevel, c.LogFormat)
	if err == nil {
		// go-redis logs through a package-level logger, in plain text on stderr unless
		// it is given one: the service's log is JSON only. (Only the process that
		// serves sets it, so tests running command in parallel do not race on it.)
		redisstore.UseLogger(log)
		tuneGC(getenv)
		sctx, stop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
		err = serveConfig(sctx, c, log)
		stop()
	}
	if err != nil {
		log.Error("limiter stopped", "err", err)
		return 1
	}
	return 0
}

// newLogger logs to w at level and above, as JSON or text (format); a level or
// format it cannot read (a configuration refused) is info, and JSON.
func newLogger(w io.Writer, level, format string) *slog.Logger {
	l, err := erlLogLevel(level)
	if err != nil {
		l = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: l}
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}

// usage is the limiter's help, before its flags.
const usage = `limiter is tollgate's HTTP decision service.

usage:
  limiter [FLAGS]
      serves decisions: POST /v1/check, /healthz, /readyz, /metrics, /healthcheck
      (and Envoy's gRPC RateLimitService with --grpc-listen, POST /json)
  limiter policy check FILE...
      lists every problem of each policy file; exit status 1 if any has one
  limiter policy explain [--redis URL] [--cluster] FILE [ATTRIBUTE=VALUE...]
      shows which rules a request matches, its keys, and with --redis each limit's state
  limiter help, limiter --help
      this text (limiter policy --help: the policy commands')

Each setting comes from a flag, else its environment variable, else its default.
With make run, set the variable (TOLLGATE_LISTEN=127.0.0.1:9090 make run), or pass
make run LISTEN=ADDR POLICY=FILE ARGS='--flag value ...'.

flags:
`

// envOnly lists the settings that only the environment sets.
const envOnly = `
environment only:
  TOLLGATE_ADMIN_TOKEN
      bearer token enabling /v1/state and /v1/reset (no flag: it stays out of ps)
  REDIS_AUTH_SECRET_ARN, or REDIS_IAM_USER + REDIS_CACHE_NAME (+ REDIS_IAM_SERVERLESS=true)
      ElastiCache authentication: a Secrets Manager secret, or IAM; needs a rediss:// URL
  LIMIT_RESPONSE_HEADERS_ENABLED, LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER
      envoyproxy/ratelimit's one-limit response headers on gRPC and POST /json (off by default)
  RUNTIME_ROOT, RUNTIME_SUBDIRECTORY, PORT, GRPC_PORT, REDIS_TYPE, ... (envoyproxy/ratelimit's)
      with a RUNTIME_ variable set, serve its configuration directory on its ports;
      a flag or TOLLGATE_ variable wins (docs/erl.md lists every one)
  GOGC (default here 400), GOMEMLIMIT (default on Lambda 90% of the function's memory)
  AWS_LAMBDA_RUNTIME_API
      set by Lambda: serve a Function URL instead of listening
`

// printUsage writes the limiter's help to w: its commands, each flag with its
// environment variable and default, and the settings only the environment sets.
func printUsage(w io.Writer) {
	fmt.Fprint(w, usage)
	printFlags(w, defaultFlags())
	fmt.Fprint(w, envOnly)
}

// wrap breaks text into lines of at most width bytes (a longer word stands alone),
// each starting with indent and ending with a newline.
func wrap(text, indent string, width int) string {
	var b strings.Builder
	line := indent
	for _, w := range strings.Fields(text) {
		if line != indent && len(line)+1+len(w) > width {
			b.WriteString(line + "\n")
			line = indent
		}
		if line != indent {
			line += " "
		}
		line += w
	}
	b.WriteString(line + "\n")
	return b.String()
}

// defaultFlags is the service's flag set with the defaults of an empty environment,
// writing nothing itself.
func defaultFlags() *flag.FlagSet {
	c := config{Listen: defaultListen, PolicyPoll: defaultPolicyPoll, Batch: true, Server: defaultServerLimits}
	fs := flag.NewFlagSet("limiter", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.flags(fs)
	return fs
}

// printFlags writes each of fs's flags, its value's name and its default, then its
// usage on the next line.
func printFlags(w io.Writer, fs *flag.FlagSet) {
	fs.VisitAll(func(f *flag.Flag) {
		name, text := flag.UnquoteUsage(f)
		if name != "" {
			name = " " + strings.ToUpper(name)
		}
		def := ""
		switch f.DefValue {
		case "", "0", "0s", "false":
		default:
			def = " (default " + f.DefValue + ")"
		}
		fmt.Fprintf(w, "  --%s%s%s\n%s", f.Name, name, def, wrap(text, "      ", 86))
	})
}

// gcPercent is the collector's target when GOGC is not set. The service's live heap
// is a few megabytes, so at Go's default (100) it collects dozens of times a second
// under load, about a sixth of its CPU; 400 keeps the heap within a few tens of
// megabytes. In one pair of make bench-erl runs at concurrency 64 it moved
// tollgate from 1.27× to 1.51× envoyproxy/ratelimit's throughput.
const gcPercent = 400

// tuneGC sets the collector's target to gcPercent unless GOGC is set, and on Lambda,
// unless GOMEMLIMIT is set, a soft memory limit of 90% of the function's memory, so
// that a heap grown under that target is collected before it runs out.
func tuneGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(gcPercent)
	}
	if mb, err := strconv.ParseInt(getenv("AWS_LAMBDA_FUNCTION_MEMORY_SIZE"), 10, 64); err == nil && mb > 0 && getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(mb << 20 * 9 / 10)
	}
}

// run serves until ctx is done (SIGTERM or an interrupt, in main).
func run(ctx context.Context, getenv func(string) string, args []string, log *slog.Logger) error {
	c, err := loadConfig(getenv, args)
	if err != nil {
		return err
	}
	return serveConfig(ctx, c, log)
}

// serveConfig serves as c says until ctx is done.
func serveConfig(ctx context.Context, c config, log *slog.Logger) error {
	for _, w := range c.ERL.Warnings {
		log.Warn(w)
	}
	if c.ERL.On {
		log.Info("envoyproxy/ratelimit's environment", "config_dir", c.ERLConfig, "http", c.Listen, "grpc", c.GRPCListen, "debug", c.DebugListen)
	}
	if c.RedisURL == "" {
		log.Info("REDIS_URL is not set: starting an embedded in-process Redis (miniredis); state is lost on exit and not shared with other instances")
	} else {
		log.Info("using Redis", "url", redisstore.Redact(c.RedisURL), "cluster", c.RedisCluster)
	}
	s, err := newService(ctx, c, log)
	if err != nil {
		return err
	}
	defer s.Close()
	p := s.eng.Policy()
	if policyNamed(c) || s.erl == nil {
		log.Info("policy loaded", "source", policySource(c), "domain", p.Domain, "rules", len(p.Rules), "failure_mode", string(p.Failure.Mode), "sha256", s.policy.SHA256())
	}
	if c.OnLambda {
		lambdaurl.Start(refreshing(s.handler, s.reloaders(), c.PolicyPoll))
		return nil
	}
	if err := c.Server.fitsPolicy(p.Failure.Timeout); err != nil {
		return err
	}
	ln, err := listen(c.Listen)
	if err != nil {
		return busyHint(err, "--listen ADDR, TOLLGATE_LISTEN=ADDR or make run LISTEN=ADDR")
	}
	for _, rl := range s.reloaders() {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go rl.Watch(ctx, c.PolicyPoll, hup)
	}
	go returnLeases(ctx, s.engines, leaseSweep)
	defer func() {
		// Give back what the leases hold, so other instances can use it at once.
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		for _, e := range s.engines() {
			e.EndLeases(ectx)
		}
	}()
	side := []struct {
		addr, what, how string
		h               http.Handler
	}{
		{c.DebugListen, "debug", "--debug-listen ADDR, TOLLGATE_DEBUG_LISTEN=ADDR or DEBUG_PORT", s.debugHandler()},
	}
	if c.ERL.Prometheus {
		m := http.NewServeMux()
		m.Handle(c.ERL.PrometheusPath, s.metrics)
		side = append(side, struct {
			addr, what, how string
			h               http.Handler
		}{c.ERL.PrometheusAddr, "Prometheus", "PROMETHEUS_ADDR", m})
	}
	for _, l := range side {
		if l.addr == "" {
			continue
		}
		sln, err := listen(l.addr)
		if err != nil {
			ln.Close()
			return fmt.Errorf("%s listener: %w", l.what, busyHint(err, l.how))
		}
		srv := &http.Server{Handler: l.h, ReadHeaderTimeout: c.Server.ReadTimeout, IdleTimeout: c.Server.IdleTimeout}
		go srv.Serve(newLimitListener(sln, c.Server.MaxConns))
		defer srv.Close()
		log.Info("serving "+l.what, "addr", sln.Addr().String())
	}
	if c.GRPCListen != "" {
		gln, err := listen(c.GRPCListen)
		if err != nil {
			ln.Close()
			return fmt.Errorf("--grpc-listen: %w", busyHint(err, "--grpc-listen ADDR, TOLLGATE_GRPC_LISTEN=ADDR or GRPC_PORT"))
		}
		gs := s.grpcServer(c)
		go s.rlqs.Run(ctx)
		go func() {
			if err := gs.Serve(gln); err != nil {
				log.Error("gRPC server stopped", "err", err)
			}
		}()
		defer gs.GracefulStop()
		log.Info("serving Envoy's RateLimitService and RateLimitQuotaService", "addr", gln.Addr().String())
	}
	go func() {
		// From SIGTERM on, the health checks fail, as envoyproxy/ratelimit's do, so
		// that a load balancer stops sending while requests in flight finish.
		<-ctx.Done()
		s.health.stop()
	}()
	return serve(ctx, ln, s.handler, c.Server, log)
}

// grpcServer returns the service's gRPC server, with c's options: Envoy's
// RateLimitService, its RateLimitQuotaService (whose windows Run starts) and the
// health service.
func (s *service) grpcServer(c config) *grpc.Server {
	gs := grpc.NewServer(grpcOptions(c)...)
	rlsv3.RegisterRateLimitServiceServer(gs, s.rls)
	rlqspb.RegisterRateLimitQuotaServiceServer(gs, s.rlqs)
	healthpb.RegisterHealthServer(gs, s.health.grpc())
	return gs
}

// busyHint adds to a listener's error, when its address is in use, how to choose
// another: the settings named in how.
func busyHint(err error, how string) error {
	if !errors.Is(err, syscall.EADDRINUSE) {
		return err
	}
	return fmt.Errorf("%w: another process (another limiter?) holds that port; stop it, or choose another address with %s (port 0 picks a free one)", err, how)
}

// leaseSweep is how often the service gives back the unused units of ended leases.
const leaseSweep = 20 * time.Millisecond

// returnLeases gives back, every period until ctx is done, the unused units of the
// engines' ended leases (engine.ReturnLeases), so that an instance whose traffic
// stopped does not hold them until its next request.
func returnLeases(ctx context.Context, engines func() []*engine.Engine, period time.Duration) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			for _, e := range engines() {
				e.ReturnLeases(ctx)
			}
		}
	}
}

// serve answers on ln within limits until ctx is done, then shuts down: it stops
// accepting, gives requests in flight limits.ShutdownGrace to finish, and closes the
// connections still open after that (a client trickling a body, say). It returns
// nil after a shutdown, and the server's error otherwise.
func serve(ctx context.Context, ln net.Listener, h http.Handler, limits serverLimits, log *slog.Logger) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: limits.ReadTimeout,
		ReadTimeout:       limits.ReadTimeout,
		WriteTimeout:      limits.WriteTimeout,
		IdleTimeout:       limits.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(newLimitListener(ln, limits.MaxConns)) }()
	log.Info("listening", "addr", ln.Addr().String(), "max_conns", limits.MaxConns,
		"read_timeout", limits.ReadTimeout.String(), "write_timeout", limits.WriteTimeout.String(), "idle_timeout", limits.IdleTimeout.String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "grace", limits.ShutdownGrace.String())
	sctx, cancel := context.WithTimeout(context.Background(), limits.ShutdownGrace)
	defer cancel()
	err := srv.Shutdown(sctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("shutdown grace expired: closing the connections still open")
		err = srv.Close()
	}
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
