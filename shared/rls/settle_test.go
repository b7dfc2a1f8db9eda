package rls_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// The tokens example (deploy/examples/tokens): a tenant's 1000 tokens a minute as a
// tollgate policy and as an ERL configuration with tollgate's settle extension. Envoy's
// request-phase call sends the tenant, its response-phase call (apply_on_stream_done)
// the tenant and phase=response, which only the settling rule matches; both count one
// balance.
var tokensFiles = map[string]string{"policy": "policy.yaml", "erl": "ratelimit-config.yaml"}

// tokensServer serves the tokens example, its tollgate policy or its ERL configuration
// (kind "policy" or "erl"), on store, its engines reporting to hooks.
func tokensServer(t testing.TB, kind string, store engine.Store, hooks engine.Hooks) *rls.Server {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "deploy", "examples", "tokens", tokensFiles[kind]))
	if err != nil {
		t.Fatal(err)
	}
	var tr erl.Translation
	if kind == "erl" {
		if tr, err = erl.Translate(doc); err != nil {
			t.Fatal(err)
		}
		doc = tr.Policy
	}
	p, err := policy.Parse(doc)
	if err != nil {
		t.Fatalf("%v\n%s", err, doc)
	}
	patient(p)
	eng, err := engine.New(engine.Config{Policy: p, Store: store, Hooks: hooks})
	if err != nil {
		t.Fatal(err)
	}
	if kind == "erl" {
		return rls.NewDomains(map[string]rls.Domain{tr.Domain: rls.ERLDomain(tr, eng)}, nil)
	}
	return rls.New(eng, nil)
}

// tokens is a request of the tenant's: the request phase's (a check of hits), or the
// response phase's (a settlement of hits).
func tokens(tenant string, response bool, hits uint32) *rlsv3.RateLimitRequest {
	d := descriptor("tenant", tenant)
	if response {
		d = descriptor("tenant", tenant, "phase", "response")
	}
	return &rlsv3.RateLimitRequest{Domain: "ai", HitsAddend: hits, Descriptors: []*rlv3.RateLimitDescriptor{d}}
}

// counted sums the counters Redis holds for tenant (every window of its count).
func counted(t testing.TB, c redis.UniversalClient, tenant string) int64 {
	t.Helper()
	ctx := context.Background()
	var total atomic.Int64
	scan := func(ctx context.Context, node *redis.Client) error {
		iter := node.Scan(ctx, 0, "*"+tenant+"*", 100).Iterator()
		for iter.Next(ctx) {
			n, err := node.Get(ctx, iter.Val()).Int64()
			if err != nil {
				return fmt.Errorf("GET %s: %w", iter.Val(), err)
			}
			total.Add(n)
		}
		return iter.Err()
	}
	var err error
	switch cc := c.(type) {
	case *redis.ClusterClient:
		err = cc.ForEachMaster(ctx, scan)
	case *redis.Client:
		err = scan(ctx, cc)
	}
	if err != nil {
		t.Fatal(err)
	}
	return total.Load()
}

// inOneMinute waits, when less than need is left of the current minute, for the next:
// a scenario on a fixed window of a minute must not straddle two.
func inOneMinute(need time.Duration) { inOneWindow(time.Minute, need) }

// inOneWindow waits, if need be, until at least need is left of the current
// window of length w (aligned to the epoch, as fixed windows are), so that the
// calls that follow count in one window.
func inOneWindow(w, need time.Duration) {
	if left := w - time.Duration(time.Now().UnixNano())%w; left < need {
		time.Sleep(left + 10*time.Millisecond)
	}
}

// asker sends a RateLimitRequest: over gRPC, or as POST /json.
type asker func(*rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error)

// jsonAsker posts requests to srv's /json handler and reads its answers back,
// errors as gRPC statuses of the HTTP code.
func jsonAsker(srv *rls.Server) asker {
	h := srv.JSONHandler()
	return func(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
		body, err := protojson.Marshal(req)
		if err != nil {
			return nil, err
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(string(body))))
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests:
		case http.StatusBadRequest:
			return nil, status.Error(codes.InvalidArgument, rec.Body.String())
		case http.StatusServiceUnavailable:
			return nil, status.Error(codes.Unavailable, rec.Body.String())
		default:
			return nil, fmt.Errorf("POST /json: %d %s", rec.Code, rec.Body)
		}
		var resp rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(rec.Body.Bytes(), &resp); err != nil {
			return nil, fmt.Errorf("POST /json: %w: %s", err, rec.Body)
		}
		return &resp, nil
	}
}

// TestSettleTenantScenario plays Envoy's two calls per request against a tenant's
// 1000 tokens a minute, as a tollgate policy and as an ERL configuration with the
// settle extension, over gRPC (standalone and cluster) and POST /json: a check
// (hits_addend 0, which counts as 1), 900 (OK, 99 remaining), then the response
// phase's 200, which does not fit and is charged all the same: Redis's counter holds
// 1101, what ERL's INCRBY counter holds after the same calls. The next check is denied
// until the window ends; a settlement of 0 charges nothing; descriptors that disagree
// are refused with the fix.
func TestSettleTenantScenario(t *testing.T) {
	for _, tg := range redistest.Targets(t) {
		st, err := redisstore.Open(redisstore.Config{URL: tg.URL, Cluster: tg.Cluster, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		for _, kind := range []string{"policy", "erl"} {
			for _, door := range []string{"grpc", "json"} {
				t.Run(tg.Name+"/"+kind+"/"+door, func(t *testing.T) {
					s := tokensServer(t, kind, st, engine.Hooks{})
					ask := asker(jsonAsker(s))
					if door == "grpc" {
						c := serve(t, s)
						ask = func(r *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
							return c.ShouldRateLimit(context.Background(), r)
						}
					}
					tenant := fmt.Sprintf("t-%s-%s-%s-%d", tg.Name, kind, door, time.Now().UnixNano())
					inOneMinute(10 * time.Second)
					step := func(what string, req *rlsv3.RateLimitRequest, code rlsv3.RateLimitResponse_Code, remaining uint32, counter int64) *rlsv3.RateLimitResponse_DescriptorStatus {
						t.Helper()
						resp, err := ask(req)
						if err != nil {
							t.Fatalf("%s: %v", what, err)
						}
						st := resp.Statuses[0]
						if resp.OverallCode != code || st.Code != code || st.LimitRemaining != remaining {
							t.Fatalf("%s: %v (status %v, %d remaining), want %v with %d remaining", what, resp.OverallCode, st.Code, st.LimitRemaining, code, remaining)
						}
						if got := counted(t, tg.Client, tenant); got != counter {
							t.Fatalf("%s: Redis's counter holds %d, want %d (ERL's INCRBY after the same calls)", what, got, counter)
						}
						return st
					}
					const ok, over = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
					step("check (hits_addend 0)", tokens(tenant, false, 0), ok, 999, 1)
					step("hits_addend 900", tokens(tenant, false, 900), ok, 99, 901)
					settled := step("response phase, 200", tokens(tenant, true, 200), ok, 0, 1101)
					if d := settled.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
						t.Errorf("the settlement's duration_until_reset = %v, want the window's end", d)
					}
					denied := step("the next check", tokens(tenant, false, 0), over, 0, 1101)
					if d := denied.DurationUntilReset.AsDuration(); d <= 0 || d > time.Minute {
						t.Errorf("the denied check's duration_until_reset = %v, want the window's end, when the debt is paid", d)
					}
					step("response phase, 0", tokens(tenant, true, 0), ok, 0, 1101)
					mixed := tokens(tenant, false, 5)
					mixed.Descriptors = append(mixed.Descriptors, tokens(tenant, true, 5).Descriptors...)
					if _, err := ask(mixed); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "which settles") || !strings.Contains(err.Error(), "apply_on_stream_done") {
						t.Errorf("a check and a settlement in one request: %v, want INVALID_ARGUMENT naming the fix", err)
					}
					if got := counted(t, tg.Client, tenant); got != 1101 {
						t.Errorf("after the refused request, Redis's counter holds %d, want 1101", got)
					}
				})
			}
		}
	}
}

// TestSettleFailure settles with Redis gone: UNAVAILABLE, and the units counted by
// the engine's hook (tollgate_settle_failed_units_total in the service), since Envoy
// ignores the answer of a response-phase call.
func TestSettleFailure(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	var failed atomic.Int64
	s := tokensServer(t, "policy", st, engine.Hooks{SettleFailed: func(_ string, units int64, _ error) { failed.Add(units) }})
	c := serve(t, s)
	ctx := context.Background()
	if resp, err := c.ShouldRateLimit(ctx, tokens("t1", true, 120)); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("settle 120 with Redis up: %v, %v; want OK", resp, err)
	}
	srv.Kill()
	_, err = c.ShouldRateLimit(ctx, tokens("t1", true, 70))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "not charged") {
		t.Errorf("settle 70 with Redis down: %v, want UNAVAILABLE, not charged", err)
	}
	if got := failed.Load(); got != 70 {
		t.Errorf("failed settlement units counted: %d, want 70", got)
	}
}

// TestSettleUnderLoad is the load of an AI gateway: 16 clients loop "check
// (hits_addend 0), then settle 1–200 tokens" against 1000 tokens a minute over gRPC
// for 2 seconds, on a standalone Redis and a cluster. Every token settled is in
// Redis's counter (it equals the admitted checks plus the settled tokens: no
// settlement lost), and checks are denied once the count reaches the limit: the
// admitted tokens stay within the limit plus what the clients in flight settle (16 ×
// (1 + 200)).
func TestSettleUnderLoad(t *testing.T) {
	for _, tg := range redistest.Targets(t) {
		t.Run(tg.Name, func(t *testing.T) {
			st, err := redisstore.Open(redisstore.Config{URL: tg.URL, Cluster: tg.Cluster, Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { st.Close() })
			c := serve(t, tokensServer(t, "policy", st, engine.Hooks{}))
			tenant := fmt.Sprintf("load-%s-%d", tg.Name, time.Now().UnixNano())
			const clients, limit, most = 16, 1000, 200
			var admitted, denied, settled atomic.Int64
			inOneMinute(5 * time.Second)
			stop := time.Now().Add(2 * time.Second)
			var wg sync.WaitGroup
			errs := make(chan error, clients)
			for i := range clients {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(i), 28))
					ctx := context.Background()
					for time.Now().Before(stop) {
						resp, err := c.ShouldRateLimit(ctx, tokens(tenant, false, 0))
						if err != nil {
							errs <- fmt.Errorf("check: %w", err)
							return
						}
						if resp.OverallCode != rlsv3.RateLimitResponse_OK {
							denied.Add(1)
							continue
						}
						admitted.Add(1)
						n := 1 + r.Uint32N(most)
						resp, err = c.ShouldRateLimit(ctx, tokens(tenant, true, n))
						if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
							errs <- fmt.Errorf("settle %d: %v, %w", n, resp, err)
							return
						}
						settled.Add(int64(n))
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			got := counted(t, tg.Client, tenant)
			t.Logf("%s: %d checks admitted (%d denied), %d tokens settled; Redis's counter holds %d", tg.Name, admitted.Load(), denied.Load(), settled.Load(), got)
			if want := admitted.Load() + settled.Load(); got != want {
				t.Errorf("Redis's counter holds %d, want %d: the admitted checks and every settled token", got, want)
			}
			if bound := int64(limit + clients*(1+most)); got > bound {
				t.Errorf("%d units admitted in one window, want at most %d (the limit and one response per client in flight)", got, bound)
			}
			if denied.Load() == 0 || got < limit {
				t.Errorf("%d checks denied, %d units counted: want the checks denied once the count reached %d", denied.Load(), got, limit)
			}
		})
	}
}

// TestSettleBesideNoLimit settles a response-phase descriptor beside one that reaches
// no limit (which has no say), at the descriptor's own hits_addend, as Envoy sends
// the cost of a route rate limit's hits_addend; the settlement leaves the tenant in
// debt, and the descriptor without a limit is OK with none.
func TestSettleBesideNoLimit(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	st, err := redisstore.Open(redisstore.Config{URL: srv.URL(), Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, kind := range []string{"policy", "erl"} {
		c := serve(t, tokensServer(t, kind, st, engine.Hooks{}))
		tenant := "beside-" + kind
		spent := tokens(tenant, true, 0)
		spent.Descriptors[0].HitsAddend = wrapperspb.UInt64(1200)
		other := descriptor("model", "m1")
		other.HitsAddend = wrapperspb.UInt64(1200) // one cost for every descriptor
		spent.Descriptors = append(spent.Descriptors, other)
		inOneMinute(5 * time.Second)
		resp, err := c.ShouldRateLimit(context.Background(), spent)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 0 || resp.Statuses[0].CurrentLimit == nil || resp.Statuses[1].CurrentLimit != nil {
			t.Errorf("%s: a settlement of 1200 beside a descriptor without a limit = %v, want OK, 0 remaining, and no limit for the second", kind, resp)
		}
		if got := counted(t, srv.Client(t), tenant); got != 1200 {
			t.Errorf("%s: Redis's counter holds %d, want the 1200 settled", kind, got)
		}
		if resp, err := c.ShouldRateLimit(context.Background(), tokens(tenant, false, 0)); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Errorf("%s: a check after a debt of 200 = %v, %v; want OVER_LIMIT", kind, resp, err)
		}
	}
}
