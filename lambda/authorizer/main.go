// Command authorizer is tollgate's API Gateway Lambda authorizer: it rate-limits
// requests before API Gateway forwards them, deciding against ElastiCache (Redis OSS or
// Valkey) with the same engine as the decision service.
//
// One binary answers three event shapes, told apart from the event itself:
//
//   - REST API REQUEST authorizer: the attributes are remote_address
//     (requestContext.identity.sourceIp, or X-Forwarded-For per the policy's
//     identity.trusted_proxies), method, path (the resource path, e.g.
//     /pets/{petId}), stage, api_key (identity.apiKey, else the x-api-key header) and
//     any header the policy names (by its lower-case name). The answer is an IAM
//     policy that allows or denies the method ARN, a principalId (the hashed API key,
//     else the client address) and a context map.
//   - REST API TOKEN authorizer: the token is the api_key attribute, hashed with
//     algo.HashValue before it reaches a key or a log. A TOKEN event carries nothing
//     but the token and the method ARN: there is no client IP (rules on
//     remote_address or headers never match it); stage, method and path come from the
//     method ARN.
//   - HTTP API payload format 2.0 authorizer with simple responses: the same
//     attributes (path is the route's path template, or rawPath for $default;
//     api_key is the x-api-key header) and the answer {isAuthorized, context}. HTTP
//     APIs have no gateway responses: a denial is always 403 Forbidden there, and the
//     context cannot set Retry-After on it.
//
// The context map holds limit, remaining, reset and retryAfter (whole seconds;
// retryAfter is 0 when allowed), rateLimit and rateLimitPolicy (the IETF RateLimit
// and RateLimit-Policy header values) and rule (the deciding rule). On a REST API,
// make the ACCESS_DENIED gateway response answer 429 with
// Retry-After: context.authorizer.retryAfter (infra/terraform does). Authorizer result
// caching must be off (TTL 0): a cached Allow would skip the limiter.
//
// A request that lacks an identity the policy requires fails with the error
// "Unauthorized", which API Gateway answers with 401: a missing identity is an
// authentication failure, not a rate-limit denial. The policy requires an API key of
// a request when only rules keyed on api_key could limit it: no non-shadow rule
// applies to the request without a key, and one that matches on api_key would with
// one. A request some non-shadow rule limits without a key (POST /login by client
// address, /search globally) is decided, not rejected. A TOKEN event with an empty
// token is always Unauthorized: a TOKEN authorizer requires its token. When Redis
// fails, the policy's failure mode decides (open, closed or local).
//
// Configuration, all from the environment (see config): REDIS_URL (rediss:// for
// TLS), REDIS_CLUSTER, REDIS_POOL_SIZE, REDIS_CONN_MAX_LIFETIME;
// REDIS_AUTH_SECRET_ARN (an AUTH token in Secrets Manager, fetched once at start) or
// REDIS_IAM_USER + REDIS_CACHE_NAME (+ REDIS_IAM_SERVERLESS) for IAM authentication;
// TOLLGATE_POLICY (default policy.yaml beside the binary) or TOLLGATE_POLICY_JSON;
// TOLLGATE_USAGE_IDENTIFIER_KEY; TOLLGATE_METRICS. A configuration or policy error is
// reported to the Lambda Runtime API as an init error.
//
// Metrics are CloudWatch Embedded Metric Format lines on stdout, namespace Tollgate:
// Decisions (dimensions Function, Rule, Result), DecisionLatency and
// FailureModeActivations (dimension Function). Logs are JSON lines on stderr.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/aws/aws-lambda-go/lambda"

	"github.com/tollgate-dev/tollgate/shared/awsredis"
	"github.com/tollgate-dev/tollgate/shared/emf"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/reload"
)

// MetricsNamespace is the CloudWatch namespace of the metrics.
const MetricsNamespace = "Tollgate"

func main() {
	log := newLogger(os.Stderr, slogLevel(os.Getenv("AWS_LAMBDA_LOG_LEVEL")))
	redisstore.UseLogger(log)
	// aws-lambda-go reports failed invocations with the standard logger.
	stdlog.SetFlags(0)
	stdlog.SetOutput(stdlogWriter{log})
	exeDir := "."
	if exe, err := os.Executable(); err == nil {
		exeDir = filepath.Dir(exe)
	}
	a, err := start(context.Background(), os.Getenv, exeDir, os.Stdout, log)
	if err != nil {
		log.Error("init failed", "err", err)
		if api := os.Getenv("AWS_LAMBDA_RUNTIME_API"); api != "" {
			if rerr := reportInitError(api, err); rerr != nil {
				log.Error("cannot report the init error", "err", rerr)
			}
		}
		os.Exit(1)
	}
	lambda.StartWithOptions(a.handler, lambda.WithEnableSIGTERM(func() {
		a.close()
		os.Exit(0)
	}))
}

// newLogger returns a JSON logger whose lines carry "level" and an RFC 3339
// "timestamp", the fields Lambda's log-level filtering reads.
func newLogger(w io.Writer, level slog.Level) *slog.Logger {
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{
		Level: level,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if len(groups) == 0 && a.Key == slog.TimeKey {
				a.Key = "timestamp"
			}
			return a
		},
	}))
}

// stdlogWriter turns the standard logger's lines into JSON log lines at WARN.
type stdlogWriter struct{ log *slog.Logger }

func (w stdlogWriter) Write(p []byte) (int, error) {
	w.log.Warn(strings.TrimSpace(string(p)))
	return len(p), nil
}

// app is the authorizer, built once per execution environment.
type app struct {
	handler *Handler
	store   *redisstore.Store // nil without REDIS_URL
	log     *slog.Logger
}

// close closes the Redis client.
func (a *app) close() {
	if a.store != nil {
		if err := a.store.Close(); err != nil {
			a.log.Warn("closing the Redis client", "err", err)
		}
	}
	a.log.Info("shut down")
}

// start reads the configuration and builds the authorizer: the policy, the Redis
// client (authenticated, its scripts preloaded), the engine and the handler. Metrics
// go to stdout.
func start(ctx context.Context, getenv func(string) string, exeDir string, stdout io.Writer, log *slog.Logger) (*app, error) {
	cfg, err := loadConfig(getenv, exeDir)
	if err != nil {
		return nil, err
	}
	return build(ctx, cfg, stdout, log)
}

func build(ctx context.Context, cfg config, stdout io.Writer, log *slog.Logger) (*app, error) {
	src, err := reload.Where{Path: cfg.PolicyPath, JSON: cfg.PolicyJSON, SSM: cfg.PolicySSM}.Source(ctx)
	if err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	var eng *engine.Engine
	a := &app{log: log}
	rl, p, err := reload.Load(ctx, reload.Config{
		Source: src,
		Apply:  func(p *policy.Policy) error { return eng.SetPolicy(p) },
		Logger: log,
		// Reloads happen in Handle, after the handler is built.
		Reloaded: func(result string) {
			if a.handler != nil {
				a.handler.metrics.reloaded(result)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	var store engine.Store // stays a nil interface without Redis
	if cfg.RedisURL == "" {
		log.Warn("REDIS_URL is empty: deciding in process only, so every execution environment has limits of its own")
	} else {
		st, err := openStore(ctx, cfg, p, log)
		if err != nil {
			return nil, err
		}
		a.store, store = st, st
	}
	eng, err = engine.New(engine.Config{Policy: p, Store: store, Logger: log})
	if err != nil {
		a.close()
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	hc := HandlerConfig{Engine: eng, UsageIdentifierKey: cfg.UsageIdentifierKey, Function: cfg.Function, Logger: log}
	if _, inline := src.(reload.Inline); !inline && cfg.PolicyTTL > 0 {
		hc.Policy, hc.PolicyTTL = rl, cfg.PolicyTTL
	}
	if cfg.Metrics {
		m, err := emf.New(stdout, MetricsNamespace, cfg.LambdaLogLevel)
		if err != nil {
			a.close()
			return nil, fmt.Errorf("authorizer: metrics: %w", err)
		}
		hc.Metrics = m
	}
	a.handler, err = NewHandler(hc)
	if err != nil {
		a.close()
		return nil, err
	}
	log.Info("ready", "domain", p.Domain, "rules", len(p.Rules), "failure_mode", string(p.Failure.Mode),
		"redis", redisstore.Redact(cfg.RedisURL), "redis_auth", string(cfg.Auth.Mode()))
	return a, nil
}

// openStore builds the Redis client once (see awsredis.OpenStore), with command
// timeouts from the policy.
func openStore(ctx context.Context, cfg config, p *policy.Policy, log *slog.Logger) (*redisstore.Store, error) {
	st, err := awsredis.OpenStore(ctx, redisstore.Config{
		URL:             cfg.RedisURL,
		Cluster:         cfg.RedisCluster,
		Timeout:         p.Failure.Timeout,
		PoolSize:        cfg.PoolSize,
		ConnMaxLifetime: cfg.ConnMaxLifetime,
	}, cfg.Auth, log)
	if err != nil {
		return nil, fmt.Errorf("authorizer: %w", err)
	}
	return st, nil
}

// reportInitError posts err to the Lambda Runtime API's /runtime/init/error, so
// that Lambda reports a failed start (Runtime.ExitError is all it says otherwise).
func reportInitError(api string, err error) error {
	body, _ := json.Marshal(map[string]any{
		"errorMessage": err.Error(),
		"errorType":    "ConfigError",
		"stackTrace":   []string{},
	})
	req, rerr := http.NewRequest(http.MethodPost, "http://"+api+"/2018-06-01/runtime/init/error", bytes.NewReader(body))
	if rerr != nil {
		return rerr
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Lambda-Runtime-Function-Error-Type", "Function.ConfigError")
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{Proxy: nil}}
	resp, rerr := c.Do(req)
	if rerr != nil {
		return rerr
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusAccepted {
		return errors.New("init/error answered " + resp.Status)
	}
	return nil
}
