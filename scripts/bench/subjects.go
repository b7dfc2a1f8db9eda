package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
)

// An op makes one decision for the client at index i of the key set.
type op func(ctx context.Context, i int) error

// A keyset is who the decisions are for.
type keyset string

const (
	distinct keyset = "distinct" // cfg.Clients clients, round robin
	hot      keyset = "hot"      // one client
)

// A subject is one contender of the benchmark.
type subject struct {
	Name    string   // "engine/gcra"
	Desc    string   // one line for the report
	Keysets []keyset // nil: both
	// setup builds the contender and returns its op and a function that frees it.
	setup func(e *env) (op, func(), error)
}

// env is what every subject shares: one Redis, one client configuration, one key
// set.
type env struct {
	cfg    config
	client redis.UniversalClient // for the ceiling and redis_rate
	store  *redisstore.Store     // tollgate's store, on the same client options
	ids    []string              // the client identities (api keys)
	attrs  []map[string]string   // per client, the request attributes
	log    *slog.Logger
	prefix string // the key prefix of the engine being set up ("" = the default)
}

// A decision run by tollgate never denies in the throughput cells: the limits are far
// above what two CPUs can send (sliding_log's count is capped by algo.MaxLogCount).
const benchRate = "1000000/s"

// benchPolicy returns the policy of one rule on api_key with the given limits (YAML
// flow maps), the failure mode closed (a store failure is a counted error, never a
// silent admit) and the deny cache on or off.
func benchPolicy(prefix string, denyCache bool, limits ...string) (*policy.Policy, error) {
	var b bytes.Buffer
	fmt.Fprintf(&b, "domain: bench\nshard_by: api_key\n")
	if prefix != "" {
		fmt.Fprintf(&b, "prefix: %q\n", prefix)
	}
	fmt.Fprintf(&b, "failure: {mode: closed, timeout: 10s, breaker: {failures: 1000000, open_for: 1ms}}\n")
	fmt.Fprintf(&b, "deny_cache: {enabled: %v}\n", denyCache)
	fmt.Fprintf(&b, "rules:\n  - name: r\n    match: {api_key: \"*\"}\n    limits:\n")
	for _, l := range limits {
		fmt.Fprintf(&b, "      - %s\n", l)
	}
	return policy.Parse(b.Bytes())
}

func limitYAML(a algo.Algorithm) string {
	rate := benchRate
	if a == algo.SlidingLog {
		rate = fmt.Sprintf("%d/s", algo.MaxLogCount)
	}
	return fmt.Sprintf("{algorithm: %s, rate: %s}", a, rate)
}

// threeLimits is the three-limit request: per second, minute and hour, all GCRA, as
// the three redis_rate calls it is compared with.
var threeLimits = []string{
	"{algorithm: gcra, rate: 1000000/s}",
	"{algorithm: gcra, rate: 60000000/min}",
	"{algorithm: gcra, rate: 3600000000/h}",
}

// storeKind says what the engine decides on.
type storeKind int

const (
	plainStore storeKind = iota // redisstore.Store: today's hot path
	argsStore                   // a store with MaxBatch 1: batching off
	batchStore                  // a store batching with the defaults
)

func (e *env) engineStore(k storeKind) (engine.Store, error) {
	switch k {
	case argsStore:
		return redisstore.NewWithOptions(e.store.Client(), redisstore.Options{BatchWait: redisstore.DefaultBatchWait, MaxBatch: 1})
	case batchStore:
		return redisstore.NewWithOptions(e.store.Client(), redisstore.Options{BatchWait: redisstore.DefaultBatchWait})
	}
	return e.store, nil
}

func (e *env) newEngine(k storeKind, denyCache bool, limits ...string) (*engine.Engine, error) {
	p, err := benchPolicy(e.prefix, denyCache, limits...)
	if err != nil {
		return nil, err
	}
	st, err := e.engineStore(k)
	if err != nil {
		return nil, err
	}
	return engine.New(engine.Config{Policy: p, Store: st, Logger: e.log})
}

// engineOp decides one request of the client through eng and fails on a store
// failure or an unexpected verdict.
func (e *env) engineOp(eng *engine.Engine, wantAllowed bool) op {
	return func(ctx context.Context, i int) error {
		v, err := eng.Check(ctx, engine.Request{Domain: "bench", Attributes: e.attrs[i], Cost: 1})
		if err != nil {
			return err
		}
		if v.Degraded {
			return errors.New("degraded verdict: the store failed")
		}
		if v.Allowed != wantAllowed {
			return fmt.Errorf("verdict allowed=%v, want %v", v.Allowed, wantAllowed)
		}
		return nil
	}
}

func subjects() []subject {
	ss := []subject{
		{
			Name: "ceiling",
			Desc: "go-redis EVALSHA of `return 1` (the client key as KEYS[1]): the most a Lua-backed limiter could do",
			setup: func(e *env) (op, func(), error) {
				script := redis.NewScript("return 1")
				if err := script.Load(context.Background(), e.client).Err(); err != nil {
					return nil, nil, err
				}
				keys := make([][]string, len(e.ids))
				for i, id := range e.ids {
					keys[i] = []string{e.prefix + id}
				}
				return func(ctx context.Context, i int) error {
					return script.Run(ctx, e.client, keys[i]).Err()
				}, nil, nil
			},
		},
		{
			Name: "redis_rate",
			Desc: "go-redis/redis_rate v10 `Allow` (GCRA, 1,000,000/s): the peer most Go users pick",
			setup: func(e *env) (op, func(), error) {
				lim := redis_rate.NewLimiter(e.client)
				limit := redis_rate.Limit{Rate: 1000000, Burst: 1000000, Period: time.Second}
				keys := make([]string, len(e.ids))
				for i, id := range e.ids {
					keys[i] = e.prefix + id
				}
				return func(ctx context.Context, i int) error {
					r, err := lim.Allow(ctx, keys[i], limit)
					if err != nil {
						return err
					}
					if r.Allowed != 1 {
						return errors.New("redis_rate denied")
					}
					return nil
				}, nil, nil
			},
		},
	}
	for _, kind := range []struct {
		prefix string
		k      storeKind
		desc   string
	}{
		{"engine", plainStore, "tollgate engine in process on redisstore.Store (one EVALSHA per decision)"},
		{"engine+batch", batchStore, "tollgate engine in process on a batching redisstore.Store (automatic pipelining, defaults)"},
	} {
		for _, a := range algo.Algorithms {
			ss = append(ss, subject{
				Name:  kind.prefix + "/" + string(a),
				Desc:  kind.desc + ", one " + string(a) + " limit",
				setup: engineSetup(kind.k, limitYAML(a)),
			})
		}
	}
	ss = append(ss,
		subject{
			Name:  "engine+args/gcra",
			Desc:  "tollgate engine on redisstore.Store with MaxBatch 1: batching off",
			setup: engineSetup(argsStore, limitYAML(algo.GCRA)),
		},
		subject{
			Name: "redis_rate×3",
			Desc: "three redis_rate `Allow` calls in a row (per second, minute, hour): three round trips",
			setup: func(e *env) (op, func(), error) {
				lim := redis_rate.NewLimiter(e.client)
				limits := []redis_rate.Limit{
					{Rate: 1000000, Burst: 1000000, Period: time.Second},
					{Rate: 60000000, Burst: 60000000, Period: time.Minute},
					{Rate: 360000000, Burst: 360000000, Period: time.Hour},
				}
				keys := make([][3]string, len(e.ids))
				for i, id := range e.ids {
					keys[i] = [3]string{e.prefix + id + ":s", e.prefix + id + ":m", e.prefix + id + ":h"}
				}
				return func(ctx context.Context, i int) error {
					for j, l := range limits {
						r, err := lim.Allow(ctx, keys[i][j], l)
						if err != nil {
							return err
						}
						if r.Allowed != 1 {
							return errors.New("redis_rate denied")
						}
					}
					return nil
				}, nil, nil
			},
		},
		subject{
			Name:  "engine/3-limits",
			Desc:  "tollgate engine, a request under three GCRA limits (second, minute, hour) in one EVALSHA",
			setup: engineSetup(plainStore, threeLimits...),
		},
		subject{
			Name:  "engine+batch/3-limits",
			Desc:  "the same three limits on a batching redisstore.Store",
			setup: engineSetup(batchStore, threeLimits...),
		},
		subject{
			Name:  "http/gcra",
			Desc:  "the decision service over loopback HTTP (`POST /v1/check`), engine on a batching redisstore.Store, one gcra limit; the client is a proxy's: kept-alive HTTP/1.1 connections (one per worker in flight), each request written and its response read by the worker itself",
			setup: func(e *env) (op, func(), error) { return e.httpSubject(batchStore, false) },
		},
		subject{
			Name:  "http-unbatched/gcra",
			Desc:  "the same decision service and client with the engine on redisstore.Store",
			setup: func(e *env) (op, func(), error) { return e.httpSubject(plainStore, false) },
		},
		subject{
			Name:  "http-nethttp/gcra",
			Desc:  "http/gcra with Go's net/http client, whose transport hands each request and response between goroutines",
			setup: func(e *env) (op, func(), error) { return e.httpSubject(batchStore, true) },
		},
		subject{
			Name:    "denied/deny-cache",
			Desc:    "a blocked client (gcra 1/h, used up) answered from the engine's deny cache",
			Keysets: []keyset{hot},
			setup:   func(e *env) (op, func(), error) { return e.deniedSubject(true) },
		},
		subject{
			Name:    "denied/redis",
			Desc:    "the same blocked client with the deny cache off: every denial is an EVALSHA",
			Keysets: []keyset{hot},
			setup:   func(e *env) (op, func(), error) { return e.deniedSubject(false) },
		},
	)
	return ss
}

// engineSetup sets up the engine on store kind k, deny cache on, with the limits
// given as policy YAML, and returns an op that expects admissions.
func engineSetup(k storeKind, limits ...string) func(e *env) (op, func(), error) {
	return func(e *env) (op, func(), error) {
		eng, err := e.newEngine(k, true, limits...)
		if err != nil {
			return nil, nil, err
		}
		return e.engineOp(eng, true), nil, nil
	}
}

// deniedSubject blocks client 0 and returns an op that expects denials.
func (e *env) deniedSubject(denyCache bool) (op, func(), error) {
	eng, err := e.newEngine(plainStore, denyCache, "{algorithm: gcra, rate: 1/h}")
	if err != nil {
		return nil, nil, err
	}
	ctx := context.Background()
	for range 2 {
		if _, err := eng.Check(ctx, engine.Request{Domain: "bench", Attributes: e.attrs[0], Cost: 1}); err != nil {
			return nil, nil, err
		}
	}
	check := e.engineOp(eng, false)
	return func(ctx context.Context, i int) error {
		return check(ctx, i)
	}, nil, nil
}

// httpSubject serves the decision service on a loopback port and returns an op that
// POSTs /v1/check to it, with Go's net/http client or (the default) with a proxy's
// lean client: a kept-alive connection per worker, written and read in the caller.
func (e *env) httpSubject(k storeKind, netHTTP bool) (op, func(), error) {
	eng, err := e.newEngine(k, true, limitYAML(algo.GCRA))
	if err != nil {
		return nil, nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	srv := &http.Server{Handler: decision.NewHandler(eng, decision.Options{Logger: e.log}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	addr := l.Addr().String()
	bodies := make([][]byte, len(e.ids))
	for i, id := range e.ids {
		bodies[i] = fmt.Appendf(nil, `{"domain":"bench","attributes":{"api_key":%q},"cost":1}`, id)
	}
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}
	if netHTTP {
		tr := &http.Transport{MaxIdleConns: 1024, MaxIdleConnsPerHost: 1024, DisableCompression: true, IdleConnTimeout: time.Minute}
		client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
		url := "http://" + addr + "/v1/check"
		o := func(ctx context.Context, i int) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(bodies[i]))
			if err != nil {
				return err
			}
			req.Header.Set("Content-Type", "application/json")
			resp, err := client.Do(req)
			if err != nil {
				return err
			}
			return drainOK(resp)
		}
		return o, func() { stop(); tr.CloseIdleConnections() }, nil
	}
	reqs := make([][]byte, len(bodies))
	for i, body := range bodies {
		reqs[i] = fmt.Appendf(nil, "POST /v1/check HTTP/1.1\r\nHost: tollgate\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	}
	conns := &rawConns{addr: addr, free: make(chan *rawConn, 1024)}
	o := func(ctx context.Context, i int) error {
		c, err := conns.get()
		if err != nil {
			return err
		}
		if err := c.post(reqs[i]); err != nil {
			c.Close()
			return err
		}
		conns.put(c)
		return nil
	}
	return o, func() { stop(); conns.close() }, nil
}

// rawConns keeps the lean client's connections between calls.
type rawConns struct {
	addr string
	free chan *rawConn
}

type rawConn struct {
	net.Conn
	br *bufio.Reader
}

func (p *rawConns) get() (*rawConn, error) {
	select {
	case c := <-p.free:
		return c, nil
	default:
	}
	c, err := net.DialTimeout("tcp", p.addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &rawConn{Conn: c, br: bufio.NewReader(c)}, nil
}

func (p *rawConns) put(c *rawConn) {
	select {
	case p.free <- c:
	default:
		c.Close()
	}
}

func (p *rawConns) close() {
	for {
		select {
		case c := <-p.free:
			c.Close()
		default:
			return
		}
	}
}

// post writes one request and reads its response, which must be 200 OK.
func (c *rawConn) post(req []byte) error {
	if err := c.SetDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	if _, err := c.Write(req); err != nil {
		return err
	}
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil {
		return err
	}
	return drainOK(resp)
}

// drainOK reads and closes resp's body, so the connection can carry the next
// request, and fails unless the answer was 200 OK.
func drainOK(resp *http.Response) error {
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("POST /v1/check: %s", resp.Status)
	}
	return nil
}
