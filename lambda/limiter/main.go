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
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/tollgate-dev/tollgate/shared/awsredis"
	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// config is the service's configuration, from flags and the environment.
type config struct {
	Listen       string // TOLLGATE_LISTEN / --listen, default 127.0.0.1:8080
	PolicyPath   string // TOLLGATE_POLICY / --policy, default lambda/policy.yaml (policy.yaml next to the binary on Lambda)
	PolicyJSON   string // TOLLGATE_POLICY_JSON: an inline policy, instead of the file
	RedisURL     string // REDIS_URL; empty: embedded miniredis
	RedisCluster bool   // REDIS_CLUSTER=true
	AdminToken   string // TOLLGATE_ADMIN_TOKEN: enables /v1/state and /v1/reset
	OnLambda     bool   // AWS_LAMBDA_RUNTIME_API is set
	// Batch sends concurrent decisions to Redis as one pipeline (TOLLGATE_BATCH,
	// default true; see redisstore.Batcher).
	Batch bool
	// Auth is the ElastiCache authentication: REDIS_AUTH_SECRET_ARN, or
	// REDIS_IAM_USER + REDIS_CACHE_NAME (+ REDIS_IAM_SERVERLESS).
	Auth awsredis.Auth
}

// loadConfig reads the environment through getenv, then the flags in args.
func loadConfig(getenv func(string) string, args []string) (config, error) {
	c := config{
		Listen:     or(getenv("TOLLGATE_LISTEN"), "127.0.0.1:8080"),
		PolicyPath: getenv("TOLLGATE_POLICY"),
		PolicyJSON: getenv("TOLLGATE_POLICY_JSON"),
		RedisURL:   getenv("REDIS_URL"),
		AdminToken: getenv("TOLLGATE_ADMIN_TOKEN"),
		OnLambda:   getenv("AWS_LAMBDA_RUNTIME_API") != "",
		Batch:      true,
	}
	if v := getenv("TOLLGATE_BATCH"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return c, fmt.Errorf("TOLLGATE_BATCH=%q: want true or false", v)
		}
		c.Batch = b
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
	if auth.Mode() != awsredis.ModeNone && c.RedisURL == "" {
		return c, fmt.Errorf("ElastiCache authentication is configured (%s) but REDIS_URL is empty; set REDIS_URL=rediss://host:6379", auth.Mode())
	}
	fs := flag.NewFlagSet("limiter", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", c.Listen, "address to listen on (env TOLLGATE_LISTEN)")
	fs.StringVar(&c.PolicyPath, "policy", c.PolicyPath, "policy file, YAML or JSON (env TOLLGATE_POLICY)")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if c.PolicyPath == "" && c.PolicyJSON == "" {
		c.PolicyPath = "lambda/policy.yaml"
		if c.OnLambda {
			c.PolicyPath = besideExecutable("policy.yaml")
		}
	}
	return c, nil
}

func or(v, d string) string {
	if v == "" {
		return d
	}
	return v
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
	policy  *policy.Policy
}

func (s *service) Close() {
	if s.store != nil {
		s.store.Close()
	}
	if s.mini != nil {
		s.mini.Close()
	}
}

// loadPolicy reads the policy from the inline JSON or the file.
func loadPolicy(c config) (*policy.Policy, error) {
	if c.PolicyJSON != "" {
		p, err := policy.Parse([]byte(c.PolicyJSON))
		if err != nil {
			return nil, fmt.Errorf("TOLLGATE_POLICY_JSON: %w", err)
		}
		return p, nil
	}
	return policy.Load(c.PolicyPath)
}

// newService loads the policy, connects to Redis (or starts the embedded one), loads
// the scripts and builds the handler.
func newService(ctx context.Context, c config, log *slog.Logger) (*service, error) {
	p, err := loadPolicy(c)
	if err != nil {
		return nil, err
	}
	s := &service{policy: p}
	url := c.RedisURL
	if url == "" {
		s.mini = miniredis.NewMiniRedis()
		if err := s.mini.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded redis: %w", err)
		}
		url = "redis://" + s.mini.Addr()
	}
	store, err := awsredis.OpenStore(ctx, redisstore.Config{URL: url, Cluster: c.RedisCluster}, c.Auth, log)
	if err != nil {
		s.Close()
		return nil, err
	}
	s.store = store
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := decision.NewMetrics(reg)
	var decider engine.Store = store
	if c.Batch {
		b, err := redisstore.NewBatcher(store, redisstore.BatchConfig{})
		if err != nil {
			s.Close()
			return nil, err
		}
		decider = b
	}
	eng, err := engine.New(engine.Config{Policy: p, Store: decider, Logger: log, Hooks: metrics.Hooks()})
	if err != nil {
		s.Close()
		return nil, err
	}
	s.handler = decision.NewHandler(eng, decision.Options{
		AdminToken: c.AdminToken,
		Admin:      store,
		Ready:      store.Ping,
		Registry:   reg,
		Logger:     log,
	})
	return s, nil
}

func main() {
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := run(os.Getenv, os.Args[1:], log); err != nil {
		log.Error("limiter stopped", "err", err)
		os.Exit(1)
	}
}

func run(getenv func(string) string, args []string, log *slog.Logger) error {
	c, err := loadConfig(getenv, args)
	if err != nil {
		return err
	}
	if c.RedisURL == "" {
		log.Info("REDIS_URL is not set: starting an embedded in-process Redis (miniredis); state is lost on exit and not shared with other instances")
	} else {
		log.Info("using Redis", "url", redisstore.Redact(c.RedisURL), "cluster", c.RedisCluster)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	s, err := newService(ctx, c, log)
	if err != nil {
		return err
	}
	defer s.Close()
	log.Info("policy loaded", "domain", s.policy.Domain, "rules", len(s.policy.Rules), "failure_mode", string(s.policy.Failure.Mode))
	if c.OnLambda {
		lambdaurl.Start(s.handler)
		return nil
	}
	srv := &http.Server{Addr: c.Listen, Handler: s.handler, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("listening", "addr", c.Listen)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
