package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// erlEnv is envoyproxy/ratelimit's (ERL's) environment as the service reads it: the
// settings of ERL's src/settings/settings.go that change what the service does, with
// ERL's defaults. docs/erl.md lists every ERL setting and what tollgate does with it.
//
// ERL's environment is in use when it names ERL's configuration directory: when any
// RUNTIME_ variable is set (On). Then the service listens where ERL would, serves that
// directory, and takes ERL's defaults for what is not set. Without one, only the
// variables that tollgate shares with ERL are read (REDIS_URL, in either form, and
// LIMIT_RESPONSE_HEADERS_ENABLED with its header names).
type erlEnv struct {
	On bool
	// Dir is the configuration directory: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/
	// RUNTIME_APPDIRECTORY (default /srv/runtime_data/current, none, config).
	Dir            string
	IgnoreDotFiles bool   // RUNTIME_IGNOREDOTFILES
	HTTP           string // HOST:PORT (0.0.0.0:8080)
	GRPC           string // GRPC_HOST:GRPC_PORT (0.0.0.0:8081), or unix:GRPC_UDS
	Debug          string // DEBUG_HOST:DEBUG_PORT (0.0.0.0:6070)
	LogLevel       slog.Level
	LogFormat      string // "json" or "text"
	// Merge joins the descriptors of files of one domain (MERGE_DOMAIN_CONFIG).
	Merge bool
	// Shadow answers OK where the answer would be OVER_LIMIT (SHADOW_MODE); Quota
	// reports a status over its limit and never denies for it (QUOTA_MODE). See
	// rls.ERLModes.
	Shadow, Quota bool
	// NeedConfig fails /healthcheck while no domain is loaded
	// (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED).
	NeedConfig bool
	// RedisHealth fails /healthcheck while Redis cannot be reached
	// (REDIS_HEALTH_CHECK_ACTIVE_CONNECTION).
	RedisHealth bool
	// Prometheus serves the metrics at PrometheusAddr+PrometheusPath
	// (USE_PROMETHEUS, PROMETHEUS_ADDR, PROMETHEUS_PATH).
	Prometheus                     bool
	PrometheusAddr, PrometheusPath string
	// GRPCMaxAge and GRPCMaxAgeGrace close gRPC connections after that long
	// (GRPC_MAX_CONNECTION_AGE 24h, GRPC_MAX_CONNECTION_AGE_GRACE 1h).
	GRPCMaxAge, GRPCMaxAgeGrace time.Duration
	// GRPCTLS serves gRPC over TLS (GRPC_SERVER_USE_TLS with GRPC_SERVER_TLS_CERT,
	// GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT, GRPC_CLIENT_TLS_SAN); nil: plain.
	GRPCTLS *tls.Config
	// PipelineWindow is REDIS_PIPELINE_WINDOW, the longest a Redis command waits to
	// share a round trip (0: unset).
	PipelineWindow time.Duration
	// Warnings are settings read and ignored that a user may expect to act, logged
	// at start.
	Warnings []string
}

// erlDefaults are ERL's defaults for the settings it reads.
var erlDefaults = map[string]string{
	"RUNTIME_ROOT":                  "/srv/runtime_data/current",
	"RUNTIME_APPDIRECTORY":          "config",
	"RUNTIME_WATCH_ROOT":            "true",
	"HOST":                          "0.0.0.0",
	"PORT":                          "8080",
	"GRPC_HOST":                     "0.0.0.0",
	"GRPC_PORT":                     "8081",
	"DEBUG_HOST":                    "0.0.0.0",
	"DEBUG_PORT":                    "6070",
	"LOG_LEVEL":                     "WARN",
	"LOG_FORMAT":                    "text",
	"CONFIG_TYPE":                   "FILE",
	"BACKEND_TYPE":                  "redis",
	"PROMETHEUS_ADDR":               ":9090",
	"PROMETHEUS_PATH":               "/metrics",
	"GRPC_MAX_CONNECTION_AGE":       "24h",
	"GRPC_MAX_CONNECTION_AGE_GRACE": "1h",
	"REDIS_SOCKET_TYPE":             "unix",
	"REDIS_TYPE":                    "SINGLE",
	"REDIS_URL":                     "/var/run/nutcracker/ratelimit.sock",
}

// erlOn reports whether getenv holds ERL's environment: a RUNTIME_ variable set.
func erlOn(getenv func(string) string) bool {
	for _, v := range []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY", "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES"} {
		if getenv(v) != "" {
			return true
		}
	}
	return false
}

// erlReader reads ERL's variables with ERL's defaults, keeping the first error.
type erlReader struct {
	getenv func(string) string
	err    error
}

func (r *erlReader) str(name string) string { return or(r.getenv(name), erlDefaults[name]) }

func (r *erlReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf(format, args...)
	}
}

// boolean reads a setting as ERL does (strconv.ParseBool), false when unset.
func (r *erlReader) boolean(name string) bool {
	v := r.str(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		r.fail("%s=%q: want true or false", name, v)
	}
	return b
}

func (r *erlReader) port(name string) string {
	v := r.str(name)
	if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 65535 {
		r.fail("%s=%q: want a port number, such as %s", name, v, erlDefaults[name])
	}
	return v
}

func (r *erlReader) duration(name string) time.Duration {
	v := r.str(name)
	if v == "" {
		return 0
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		r.fail("%s=%q: want a duration such as 10s", name, v)
	}
	return d
}

// readERL reads ERL's environment through getenv. Settings that ERL honours and that
// tollgate cannot honour the same way, where serving anyway would answer otherwise
// (another backend, configuration over xDS), are errors.
func readERL(getenv func(string) string) (erlEnv, error) {
	r := &erlReader{getenv: getenv}
	e := erlEnv{On: erlOn(getenv)}
	if !e.On {
		return e, nil
	}
	// Checked first, so that it is the error reported: a deployment configured over
	// xDS (Envoy Gateway's own rate limit Deployment) sets other variables tollgate
	// would refuse for a less telling reason, such as the certificates it mounts.
	if v := r.str("CONFIG_TYPE"); !strings.EqualFold(v, "FILE") {
		r.fail("CONFIG_TYPE=%s: tollgate reads envoyproxy/ratelimit's configuration from files only and has no xDS client, so a rate limit Deployment configured over xDS (such as Envoy Gateway's own) cannot run it; mount the configuration as a directory (RUNTIME_ROOT) and set CONFIG_TYPE=FILE, or install tollgate's Helm chart and point Envoy at it", v)
	}
	root, sub, app := r.str("RUNTIME_ROOT"), r.str("RUNTIME_SUBDIRECTORY"), r.str("RUNTIME_APPDIRECTORY")
	// ERL's runtime loader reads nothing when the directory it is given and its
	// subdirectory are not both named: RUNTIME_ROOT and RUNTIME_SUBDIRECTORY when it
	// watches the root, RUNTIME_ROOT/RUNTIME_SUBDIRECTORY and RUNTIME_APPDIRECTORY
	// otherwise.
	if r.boolean("RUNTIME_WATCH_ROOT") && sub == "" {
		r.fail("RUNTIME_SUBDIRECTORY is empty: envoyproxy/ratelimit then loads no configuration at all; set it to the directory under RUNTIME_ROOT (%s) that holds %s/, such as RUNTIME_SUBDIRECTORY=ratelimit", root, app)
	}
	if app == "" {
		r.fail("RUNTIME_APPDIRECTORY is empty: envoyproxy/ratelimit then loads no configuration at all; leave it unset for config")
	}
	e.Dir = filepath.Join(root, sub, app)
	e.IgnoreDotFiles = r.boolean("RUNTIME_IGNOREDOTFILES")
	e.HTTP = net.JoinHostPort(r.str("HOST"), r.port("PORT"))
	e.GRPC = net.JoinHostPort(r.str("GRPC_HOST"), r.port("GRPC_PORT"))
	if uds := getenv("GRPC_UDS"); uds != "" {
		e.GRPC = "unix:" + uds
	}
	e.Debug = net.JoinHostPort(r.str("DEBUG_HOST"), r.port("DEBUG_PORT"))
	level, err := erlLogLevel(r.str("LOG_LEVEL"))
	if err != nil {
		r.fail("%w", err)
	}
	e.LogLevel = level
	e.LogFormat = "text"
	if strings.EqualFold(r.str("LOG_FORMAT"), "json") {
		e.LogFormat = "json"
	}
	e.Merge = r.boolean("MERGE_DOMAIN_CONFIG")
	if e.Shadow, e.Quota, err = rls.ERLModes(getenv); err != nil {
		r.fail("%w", err)
	}
	e.NeedConfig = r.boolean("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED")
	e.RedisHealth = r.boolean("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION")
	e.Prometheus = r.boolean("USE_PROMETHEUS")
	e.PrometheusAddr, e.PrometheusPath = r.str("PROMETHEUS_ADDR"), r.str("PROMETHEUS_PATH")
	e.GRPCMaxAge, e.GRPCMaxAgeGrace = r.duration("GRPC_MAX_CONNECTION_AGE"), r.duration("GRPC_MAX_CONNECTION_AGE_GRACE")
	e.PipelineWindow = r.duration("REDIS_PIPELINE_WINDOW")
	if e.PipelineWindow != 0 && !validBatchWait(e.PipelineWindow) {
		r.fail("REDIS_PIPELINE_WINDOW=%v: want a duration from 1us to 1s, such as 300us, or 0", e.PipelineWindow)
	}
	if r.boolean("GRPC_SERVER_USE_TLS") {
		e.GRPCTLS, err = grpcServerTLS(getenv("GRPC_SERVER_TLS_CERT"), getenv("GRPC_SERVER_TLS_KEY"), getenv("GRPC_CLIENT_TLS_CACERT"), getenv("GRPC_CLIENT_TLS_SAN"))
		if err != nil {
			r.fail("%w", err)
		}
	}

	// What tollgate cannot serve the same way.
	if v := r.str("BACKEND_TYPE"); !strings.EqualFold(v, "redis") {
		r.fail("BACKEND_TYPE=%s: tollgate decides on Redis only (its scripts decide every limit of a request at once); point REDIS_URL at a Redis and set BACKEND_TYPE=redis", v)
	}

	// What tollgate reads and leaves aside, said once at start.
	if r.boolean("REDIS_PERSECOND") {
		e.Warnings = append(e.Warnings, "REDIS_PERSECOND=true is ignored: per-second limits are decided on REDIS_URL's Redis with the others, so that all the limits of a request are decided in one script, all or none")
	}
	for _, v := range []string{"USE_STATSD", "USE_DOG_STATSD"} {
		if getenv(v) != "" && r.boolean(v) {
			e.Warnings = append(e.Warnings, v+"=true is ignored: tollgate has no statsd sink; its metrics are on /metrics (and PROMETHEUS_ADDR with USE_PROMETHEUS=true)")
		}
	}
	if r.boolean("TRACING_ENABLED") {
		e.Warnings = append(e.Warnings, "TRACING_ENABLED=true is ignored: tollgate exports no traces")
	}
	if r.boolean("RESPONSE_DYNAMIC_METADATA") {
		e.Warnings = append(e.Warnings, "RESPONSE_DYNAMIC_METADATA=true is ignored: tollgate's answers carry no dynamic metadata")
	}
	if getenv("CACHE_KEY_PREFIX") != "" {
		e.Warnings = append(e.Warnings, "CACHE_KEY_PREFIX is ignored: tollgate keys each domain's counts under tg:DOMAIN:, so deployments that share a Redis share the counts of a domain they both serve")
	}
	return e, r.err
}

// erlLogLevel reads LOG_LEVEL as ERL's logger (logrus) does, any case: trace and
// debug are slog's Debug, info Info, warn and warning Warn, error, fatal and panic
// Error.
func erlLogLevel(v string) (slog.Level, error) {
	switch strings.ToLower(v) {
	case "trace", "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn", "warning":
		return slog.LevelWarn, nil
	case "error", "fatal", "panic":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("LOG_LEVEL=%q: want one of trace, debug, info, warn, error", v)
}

// erlRedisURL turns ERL's Redis settings into a redisstore URL: REDIS_URL as ERL
// writes it (host:port, or a socket's path, or for a cluster host:port,host:port…,
// or for Sentinel MASTER,sentinel:port,…), with REDIS_TYPE (single, cluster,
// sentinel), REDIS_SOCKET_TYPE (tcp or unix), REDIS_AUTH (password, or
// user:password) and REDIS_TLS. It returns the URL and whether it is a cluster.
func erlRedisURL(getenv func(string) string) (string, bool, error) {
	r := &erlReader{getenv: getenv}
	raw, kind, socket := r.str("REDIS_URL"), strings.ToLower(r.str("REDIS_TYPE")), strings.ToLower(r.str("REDIS_SOCKET_TYPE"))
	useTLS := r.boolean("REDIS_TLS")
	if r.err != nil {
		return "", false, r.err
	}
	u := url.URL{Scheme: "redis"}
	if useTLS {
		u.Scheme = "rediss"
	}
	if auth := getenv("REDIS_AUTH"); auth != "" {
		if user, pass, ok := strings.Cut(auth, ":"); ok {
			u.User = url.UserPassword(user, pass)
		} else {
			u.User = url.UserPassword("", auth)
		}
	}
	addrs := strings.Split(raw, ",")
	q := url.Values{}
	switch kind {
	case "single":
		addrs = []string{raw} // ERL splits the URL only for a cluster or Sentinel
		if socket == "tcp" && strings.Contains(raw, ",") {
			return "", false, fmt.Errorf("REDIS_URL=%q with REDIS_TYPE=single: want one host:port (or a socket's path); for several nodes set REDIS_TYPE=cluster or sentinel", raw)
		}
		if socket == "unix" {
			if _, port, err := net.SplitHostPort(raw); err == nil && port != "" && !strings.Contains(raw, "/") {
				return "", false, fmt.Errorf("REDIS_URL=%q looks like host:port, but REDIS_SOCKET_TYPE is unix (envoyproxy/ratelimit's default), which takes a socket's path; set REDIS_SOCKET_TYPE=tcp, or write REDIS_URL=redis://%s", raw, raw)
			}
			if useTLS {
				return "", false, fmt.Errorf("REDIS_TLS=true with REDIS_SOCKET_TYPE=unix: tollgate speaks TLS over TCP only; set REDIS_SOCKET_TYPE=tcp")
			}
			u.Scheme, u.Path = "unix", raw
			return u.String(), false, nil
		}
	case "cluster":
	case "sentinel":
		if len(addrs) < 2 {
			return "", false, fmt.Errorf("REDIS_URL=%q with REDIS_TYPE=sentinel: want the master's name then the sentinels, such as mymaster,sentinel-1:26379,sentinel-2:26379", raw)
		}
		q.Set("master_name", addrs[0])
		addrs = addrs[1:]
	default:
		return "", false, fmt.Errorf("REDIS_TYPE=%q: want single, cluster or sentinel", kind)
	}
	if socket != "tcp" && socket != "unix" {
		return "", false, fmt.Errorf("REDIS_SOCKET_TYPE=%q: want tcp or unix", socket)
	}
	if socket == "unix" {
		return "", false, fmt.Errorf("REDIS_SOCKET_TYPE=unix with REDIS_TYPE=%s: a cluster's or Sentinel's nodes are reached over TCP; set REDIS_SOCKET_TYPE=tcp", kind)
	}
	for i, a := range addrs {
		if _, _, err := net.SplitHostPort(strings.TrimSpace(a)); err != nil {
			return "", false, fmt.Errorf("REDIS_URL=%q: %q is not host:port", raw, a)
		}
		if i == 0 {
			u.Host = strings.TrimSpace(a)
		} else {
			q.Add("addr", strings.TrimSpace(a))
		}
	}
	u.RawQuery = q.Encode()
	return u.String(), kind == "cluster", nil
}

// erlRedis reads what ERL's Redis settings add to the URL erlRedisURL makes: TLS
// (erlRedisTLS), REDIS_SENTINEL_AUTH, REDIS_POOL_SIZE and REDIS_TIMEOUT (each
// command's and each connection's; unset, tollgate's shorter defaults stand, as the
// policy's failure timeout bounds a decision).
func erlRedis(getenv func(string) string) (redisstore.Config, error) {
	var c redisstore.Config
	tlsc, err := erlRedisTLS(getenv)
	if err != nil {
		return c, err
	}
	c.TLSConfig = tlsc
	c.SentinelPassword = getenv("REDIS_SENTINEL_AUTH")
	if v := getenv("REDIS_POOL_SIZE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return c, fmt.Errorf("REDIS_POOL_SIZE=%q: want a number of connections, at least 1, such as 10", v)
		}
		c.PoolSize = n
	}
	r := &erlReader{getenv: getenv}
	c.Timeout = r.duration("REDIS_TIMEOUT")
	c.DialTimeout = c.Timeout
	return c, r.err
}

// erlRedisTLS is the TLS configuration of REDIS_TLS: the system's roots, or those
// plus REDIS_TLS_CACERT; a client certificate from REDIS_TLS_CLIENT_CERT and
// REDIS_TLS_CLIENT_KEY; and with REDIS_TLS_SKIP_HOSTNAME_VERIFICATION the chain still
// verified, but not the server's name (as ERL does). Nil when REDIS_TLS is not set.
func erlRedisTLS(getenv func(string) string) (*tls.Config, error) {
	r := &erlReader{getenv: getenv}
	if !r.boolean("REDIS_TLS") {
		return nil, r.err
	}
	skip := r.boolean("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION")
	if r.err != nil {
		return nil, r.err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := getenv("REDIS_TLS_CACERT"); ca != "" {
		pool, err := certPool("REDIS_TLS_CACERT", ca)
		if err != nil {
			return nil, err
		}
		c.RootCAs = pool
	}
	cert, key := getenv("REDIS_TLS_CLIENT_CERT"), getenv("REDIS_TLS_CLIENT_KEY")
	if (cert == "") != (key == "") {
		return nil, errors.New("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together: set both, or neither")
	}
	if cert != "" {
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("REDIS_TLS_CLIENT_CERT=%s, REDIS_TLS_CLIENT_KEY=%s: %w", cert, key, err)
		}
		c.Certificates = []tls.Certificate{pair}
	}
	if skip {
		roots := c.RootCAs
		c.InsecureSkipVerify = true // the chain is verified below, without the name
		c.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			if len(raw) == 0 {
				return errors.New("redis: the server sent no certificate")
			}
			certs := make([]*x509.Certificate, len(raw))
			for i, b := range raw {
				cert, err := x509.ParseCertificate(b)
				if err != nil {
					return fmt.Errorf("redis: the server's certificate: %w", err)
				}
				certs[i] = cert
			}
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool()}
			for _, c := range certs[1:] {
				opts.Intermediates.AddCert(c)
			}
			_, err := certs[0].Verify(opts)
			return err
		}
	}
	return c, nil
}

// grpcServerTLS is the gRPC server's TLS configuration of GRPC_SERVER_USE_TLS: its
// certificate and key; with a client CA, clients must present a certificate it
// signed, and with a SAN, one whose name is that SAN.
func grpcServerTLS(certFile, keyFile, clientCA, san string) (*tls.Config, error) {
	if certFile == "" || keyFile == "" {
		return nil, errors.New("GRPC_SERVER_USE_TLS=true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (the server's certificate and key files)")
	}
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("GRPC_SERVER_TLS_CERT=%s, GRPC_SERVER_TLS_KEY=%s: %w", certFile, keyFile, err)
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{pair}}
	if clientCA == "" {
		return c, nil
	}
	pool, err := certPool("GRPC_CLIENT_TLS_CACERT", clientCA)
	if err != nil {
		return nil, err
	}
	c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	if san != "" {
		c.VerifyPeerCertificate = func(_ [][]byte, chains [][]*x509.Certificate) error {
			for _, chain := range chains {
				if len(chain) == 0 {
					return errors.New("no client certificate")
				}
				if err := chain[0].VerifyHostname(san); err != nil {
					return fmt.Errorf("the client's certificate is not for GRPC_CLIENT_TLS_SAN: %w", err)
				}
			}
			return nil
		}
	}
	return c, nil
}

// certPool is the system's roots plus the certificates of the PEM file named by the
// variable env.
func certPool(env, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", env, err)
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s=%s: no PEM certificate in the file", env, file)
	}
	return pool, nil
}
