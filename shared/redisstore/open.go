package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/url"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Config configures a store and its Redis client. The zero value of every field but
// URL takes the documented default.
type Config struct {
	// URL is redis://[user:password@]host:port[/db] or rediss:// for TLS. Add more
	// nodes with ?addr=host:port (repeatable); cluster=true selects Redis Cluster;
	// master_name=NAME selects Sentinel (the hosts are then the sentinels).
	// unix://[user:password@]/path/to/socket[?db=N] is one Redis on a Unix socket.
	URL string
	// SentinelPassword authenticates to the sentinels of a master_name URL (the
	// URL's password is the master's and its replicas').
	SentinelPassword string
	// Cluster forces Redis Cluster mode (REDIS_CLUSTER=true).
	Cluster bool
	// Timeout bounds each command's read and write, and the wait for a free pooled
	// connection (default 100ms); the decision's context deadline bounds them too.
	Timeout time.Duration
	// DialTimeout bounds connecting (default 500ms).
	DialTimeout time.Duration
	// PoolSize is the connections per node (default go-redis's: 10 per CPU).
	PoolSize int
	// ConnMaxLifetime recycles connections (default 1h: well before ElastiCache's 12h cut).
	ConnMaxLifetime time.Duration
	// CredentialsProvider, when set, supplies the username and password for every new
	// connection (an ElastiCache IAM token or an AUTH token from Secrets Manager).
	CredentialsProvider func() (username, password string)
	// TLSConfig overrides the TLS settings of a rediss:// URL.
	TLSConfig *tls.Config
	// BatchWait and MaxBatch are the store's batching (Options): 0 and 0, the
	// default, send every request on its own.
	BatchWait time.Duration
	MaxBatch  int
}

// Options turns the configuration into go-redis universal options: retries off (a
// retried script could charge twice), context deadlines honoured, maintenance
// notifications and client identity off, so a decision is one command on one
// connection.
func (c Config) Options() (*redis.UniversalOptions, error) {
	if c.URL == "" {
		return nil, fmt.Errorf("redisstore: REDIS_URL is empty; set it to redis://host:6379 or rediss://host:6379")
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		return nil, fmt.Errorf("redisstore: REDIS_URL: %w", err)
	}
	var (
		addrs   []string
		master  string
		cluster = c.Cluster
		base    *redis.Options
		unix    = u.Scheme == "unix"
	)
	switch {
	case unix:
		// One Redis on a Unix socket: go-redis parses the path, user, password and db.
		if base, err = redis.ParseURL(c.URL); err != nil {
			return nil, fmt.Errorf("redisstore: REDIS_URL: %w", err)
		}
		if cluster || c.TLSConfig != nil {
			return nil, fmt.Errorf("redisstore: REDIS_URL %s: a Unix socket is one Redis, without TLS; use redis:// or rediss:// for a cluster or TLS", Redact(c.URL))
		}
		addrs = []string{base.Addr}
	case u.Scheme == "redis" || u.Scheme == "rediss":
		q := u.Query()
		addrs = append([]string{u.Host}, q["addr"]...)
		master = q.Get("master_name")
		cluster = cluster || q.Get("cluster") == "true"
		// go-redis parses the user, password, db and TLS of the first node.
		single := *u
		single.RawQuery = ""
		if base, err = redis.ParseURL(single.String()); err != nil {
			return nil, fmt.Errorf("redisstore: REDIS_URL: %w", err)
		}
		for _, a := range addrs {
			if a == "" || !strings.Contains(a, ":") {
				return nil, fmt.Errorf("redisstore: REDIS_URL: address %q: want host:port", a)
			}
		}
	default:
		return nil, fmt.Errorf("redisstore: REDIS_URL scheme %q: use redis://, rediss:// (TLS) or unix:// (a socket)", u.Scheme)
	}
	o := &redis.UniversalOptions{
		Addrs:            addrs,
		Username:         base.Username,
		Password:         base.Password,
		DB:               base.DB,
		TLSConfig:        base.TLSConfig,
		MasterName:       master,
		IsClusterMode:    cluster,
		SentinelPassword: c.SentinelPassword,
		MaxRetries:       -1,
		// One dial per attempt: go-redis would otherwise dial a dead node five times,
		// 100ms apart, inside each decision's budget and each slot-map reload; the
		// node's circuit breaker decides when to try again.
		DialerRetries: 1,
		DialTimeout:   def(c.DialTimeout, 500*time.Millisecond),
		ReadTimeout:   def(c.Timeout, 100*time.Millisecond),
		WriteTimeout:  def(c.Timeout, 100*time.Millisecond),
		// A decision waits for a free connection no longer than for an answer.
		PoolTimeout:           def(c.Timeout, 100*time.Millisecond),
		ContextTimeoutEnabled: true,
		PoolSize:              c.PoolSize,
		ConnMaxLifetime:       def(c.ConnMaxLifetime, time.Hour),
		DisableIdentity:       true,
		// No redirects either: the cluster client retries on network errors as it
		// follows redirects, and a script that timed out may have run. The store
		// follows a MOVED itself (the script did not run there).
		MaxRedirects: -1,
		MaintNotificationsConfig: &maintnotifications.Config{
			Mode: maintnotifications.ModeDisabled,
		},
	}
	if c.TLSConfig != nil {
		o.TLSConfig = c.TLSConfig
	}
	if c.CredentialsProvider != nil {
		o.CredentialsProvider = c.CredentialsProvider
	}
	switch {
	case unix:
		dial := dialTCP(o.DialTimeout)
		o.Dialer = func(ctx context.Context, _, addr string) (net.Conn, error) { return dial(ctx, "unix", addr) }
	case o.TLSConfig == nil:
		o.Dialer = dialTCP(o.DialTimeout)
	}
	if cluster && master != "" {
		return nil, fmt.Errorf("redisstore: REDIS_URL: cluster=true and master_name are exclusive")
	}
	if cluster && o.DB != 0 {
		return nil, fmt.Errorf("redisstore: REDIS_URL: Redis Cluster has only database 0")
	}
	return o, nil
}

// Open builds a client from the configuration and a store on it. It does not connect;
// call Preload to connect and load the Lua library. On Sentinel it starts following the
// master's switches in the background (see startWatch), until Close.
func Open(c Config) (*Store, error) {
	o, err := c.Options()
	if err != nil {
		return nil, err
	}
	var client redis.UniversalClient
	switch {
	case o.IsClusterMode:
		co := o.Cluster()
		co.MaxRetries = -1
		co.MaxRedirects = -1
		client = redis.NewClusterClient(co)
	case o.MasterName != "":
		client = redis.NewFailoverClient(o.Failover())
	default:
		client = redis.NewClient(o.Simple())
	}
	s, err := NewWithOptions(client, Options{BatchWait: c.BatchWait, MaxBatch: c.MaxBatch})
	if err != nil {
		_ = client.Close()
		return nil, err
	}
	if o.MasterName != "" {
		// The failover client follows the master; its breaker is the master's, by name,
		// and a switch of master tells it to probe at once.
		s.node = "sentinel:" + o.MasterName
		s.startWatch(o.Failover())
	}
	return s, nil
}

// Redact returns the URL without its password, for logs.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparseable REDIS_URL)"
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

func def[T comparable](v, d T) T {
	var zero T
	if v == zero {
		return d
	}
	return v
}

// dialTCP dials a plaintext connection as go-redis's default dialer does (TCP
// keep-alive probes after 30s idle, every 5s, 3 of them). The connection keeps its
// syscall.RawConn: go-redis checks a pooled connection's health before every command
// through SyscallConn, which otherwise allocates a new RawConn each time.
func dialTCP(timeout time.Duration) func(ctx context.Context, network, addr string) (net.Conn, error) {
	d := &net.Dialer{
		Timeout:         timeout,
		KeepAliveConfig: net.KeepAliveConfig{Enable: true, Idle: 30 * time.Second, Interval: 5 * time.Second, Count: 3},
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		sc, ok := c.(syscall.Conn)
		if !ok {
			return c, nil
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return c, nil
		}
		return &rawConn{Conn: c, raw: raw}, nil
	}
}

// rawConn is a connection that hands out the same syscall.RawConn every time.
type rawConn struct {
	net.Conn
	raw syscall.RawConn
}

// SyscallConn returns the connection's RawConn.
func (c *rawConn) SyscallConn() (syscall.RawConn, error) { return c.raw, nil }
