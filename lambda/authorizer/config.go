package main

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/shared/awsredis"
)

// Defaults of the configuration.
const (
	// DefaultPolicyTTL is how long a policy is used before its source is read again.
	DefaultPolicyTTL = 30 * time.Second
	// DefaultPolicyFile is the policy packaged next to the bootstrap binary.
	DefaultPolicyFile = "policy.yaml"
	// DefaultPoolSize is the Redis connections per node. A Lambda execution
	// environment answers one event at a time, so one is busy and one is spare.
	DefaultPoolSize = 2
	// DefaultConnMaxLifetime recycles connections well before ElastiCache closes
	// them at 12 hours (and IAM-authenticated ones must re-authenticate).
	DefaultConnMaxLifetime = time.Hour
	// MaxConnLifetime is the longest REDIS_CONN_MAX_LIFETIME accepted.
	MaxConnLifetime = 11 * time.Hour
	// DefaultFunction is the Function dimension outside Lambda.
	DefaultFunction = "tollgate-authorizer"
)

// config is the authorizer's configuration, read from the environment by
// loadConfig. Every variable is optional.
type config struct {
	// RedisURL (REDIS_URL) is redis:// or rediss:// (in-transit TLS), with
	// ?cluster=true or extra ?addr= nodes as redisstore.Config documents. Empty
	// decides in process only: each execution environment then has limits of its
	// own.
	RedisURL string
	// RedisCluster (REDIS_CLUSTER=true) selects Redis Cluster mode (cluster-mode
	// enabled ElastiCache, or serverless).
	RedisCluster bool
	// PoolSize (REDIS_POOL_SIZE) is the connections per node (default 2).
	PoolSize int
	// ConnMaxLifetime (REDIS_CONN_MAX_LIFETIME, a Go duration) recycles connections
	// (default 1h, at most 11h).
	ConnMaxLifetime time.Duration
	// Auth is the ElastiCache authentication: REDIS_AUTH_SECRET_ARN, or
	// REDIS_IAM_USER with REDIS_CACHE_NAME (and REDIS_IAM_SERVERLESS).
	Auth awsredis.Auth
	// PolicyPath (TOLLGATE_POLICY) is the policy file (default policy.yaml next to
	// the executable).
	PolicyPath string
	// PolicyJSON (TOLLGATE_POLICY_JSON) is an inline policy; it excludes
	// TOLLGATE_POLICY.
	PolicyJSON string
	// PolicySSM (TOLLGATE_POLICY_SSM) names an SSM Parameter Store parameter that
	// holds the policy; it excludes the other two.
	PolicySSM string
	// PolicyTTL (TOLLGATE_POLICY_POLL, default 30s, 0 never) is how long a policy
	// is used before its source is read again, before an invocation.
	PolicyTTL time.Duration
	// UsageIdentifierKey (TOLLGATE_USAGE_IDENTIFIER_KEY=true) returns the API key
	// or token as usageIdentifierKey, for usage plans with the AUTHORIZER key source.
	UsageIdentifierKey bool
	// Metrics (TOLLGATE_METRICS, default true) writes EMF metric lines to stdout.
	Metrics bool
	// Function (AWS_LAMBDA_FUNCTION_NAME) is the metrics' Function dimension.
	Function string
	// LogLevel (AWS_LAMBDA_LOG_LEVEL) is the lowest level logged (default INFO).
	LogLevel slog.Level
	// LambdaLogLevel is AWS_LAMBDA_LOG_LEVEL as Lambda set it, for the metrics'
	// level.
	LambdaLogLevel string
}

// loadConfig reads the configuration from getenv. exeDir is the directory of the
// executable, where the default policy file lives. Every problem is reported, each
// naming its variable.
func loadConfig(getenv func(string) string, exeDir string) (config, error) {
	c := config{
		RedisURL:        strings.TrimSpace(getenv("REDIS_URL")),
		PoolSize:        DefaultPoolSize,
		ConnMaxLifetime: DefaultConnMaxLifetime,
		PolicyPath:      strings.TrimSpace(getenv("TOLLGATE_POLICY")),
		PolicyJSON:      strings.TrimSpace(getenv("TOLLGATE_POLICY_JSON")),
		PolicySSM:       strings.TrimSpace(getenv("TOLLGATE_POLICY_SSM")),
		PolicyTTL:       DefaultPolicyTTL,
		Metrics:         true,
		Function:        strings.TrimSpace(getenv("AWS_LAMBDA_FUNCTION_NAME")),
		LambdaLogLevel:  strings.TrimSpace(getenv("AWS_LAMBDA_LOG_LEVEL")),
	}
	var errs []error
	boolVar := func(name string, dst *bool) {
		s := strings.TrimSpace(getenv(name))
		if s == "" {
			return
		}
		b, err := strconv.ParseBool(s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s=%q: want true or false", name, s))
			return
		}
		*dst = b
	}
	boolVar("REDIS_CLUSTER", &c.RedisCluster)
	boolVar("TOLLGATE_USAGE_IDENTIFIER_KEY", &c.UsageIdentifierKey)
	boolVar("TOLLGATE_METRICS", &c.Metrics)
	if s := strings.TrimSpace(getenv("REDIS_POOL_SIZE")); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 1000 {
			errs = append(errs, fmt.Errorf("REDIS_POOL_SIZE=%q: want a whole number from 1 to 1000", s))
		} else {
			c.PoolSize = n
		}
	}
	if s := strings.TrimSpace(getenv("REDIS_CONN_MAX_LIFETIME")); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Minute || d > MaxConnLifetime {
			errs = append(errs, fmt.Errorf("REDIS_CONN_MAX_LIFETIME=%q: want a duration from 1m to %v, e.g. 1h", s, MaxConnLifetime))
		} else {
			c.ConnMaxLifetime = d
		}
	}
	auth, err := awsredis.AuthFromEnv(getenv)
	if err != nil {
		errs = append(errs, err)
	}
	c.Auth = auth
	if c.Auth.Mode() != awsredis.ModeNone && c.RedisURL == "" {
		errs = append(errs, fmt.Errorf("REDIS_URL is empty but %s authentication is configured: set REDIS_URL to the cache endpoint (rediss://HOST:6379)", c.Auth.Mode()))
	}
	if s := strings.TrimSpace(getenv("TOLLGATE_POLICY_POLL")); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			errs = append(errs, fmt.Errorf("TOLLGATE_POLICY_POLL=%q: want a duration such as 30s, or 0 to read the policy once", s))
		} else {
			c.PolicyTTL = d
		}
	}
	var set []string
	for name, v := range map[string]string{"TOLLGATE_POLICY": c.PolicyPath, "TOLLGATE_POLICY_JSON": c.PolicyJSON, "TOLLGATE_POLICY_SSM": c.PolicySSM} {
		if v != "" {
			set = append(set, name)
		}
	}
	slices.Sort(set)
	switch len(set) {
	case 0:
		c.PolicyPath = filepath.Join(exeDir, DefaultPolicyFile)
	case 1:
	case 2:
		errs = append(errs, fmt.Errorf("%s and %s are both set: set one", set[0], set[1]))
	default:
		errs = append(errs, errors.New("TOLLGATE_POLICY, TOLLGATE_POLICY_JSON and TOLLGATE_POLICY_SSM are all set: set one"))
	}
	if c.Function == "" {
		c.Function = DefaultFunction
	}
	c.LogLevel = slogLevel(c.LambdaLogLevel)
	if len(errs) > 0 {
		return config{}, fmt.Errorf("authorizer: configuration: %w", errors.Join(errs...))
	}
	return c, nil
}

// slogLevel maps Lambda's log levels (TRACE, DEBUG, INFO, WARN, ERROR, FATAL) to
// slog's; anything else is INFO.
func slogLevel(s string) slog.Level {
	switch strings.ToUpper(s) {
	case "TRACE", "DEBUG":
		return slog.LevelDebug
	case "WARN":
		return slog.LevelWarn
	case "ERROR", "FATAL":
		return slog.LevelError
	default:
		return slog.LevelInfo
	}
}
