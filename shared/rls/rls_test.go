package rls_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

const testPolicy = `domain: rl
failure: {timeout: 2s} # a loaded CI machine must not turn answers into the failure mode's
rules:
  - {name: per-key, match: {key1: "*"}, limits: [{algorithm: fixed_window, rate: 20/min}]}
  - {name: per-ip, match: {remote_address: "*"}, limits: [{algorithm: fixed_window, rate: 3/min}]}
`

// client starts the service on a real Redis at url behind a gRPC server on loopback.
func client(t *testing.T, url string, cluster bool) rlsv3.RateLimitServiceClient {
	t.Helper()
	return serve(t, rls.New(testEngine(t, url, cluster), nil))
}

// testEngine returns an engine of testPolicy on a real Redis at url.
func testEngine(t *testing.T, url string, cluster bool) *engine.Engine {
	t.Helper()
	return policyEngine(t, url, cluster, testPolicy)
}

// policyEngine returns an engine of the policy doc on a real Redis at url.
func policyEngine(t *testing.T, url string, cluster bool, doc string) *engine.Engine {
	t.Helper()
	p, err := policy.Parse([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	patient(p)
	st, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	eng, err := engine.New(engine.Config{Policy: p, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// patient gives a policy that keeps the default timeout a generous one: a loaded
// machine must not turn answers into the failure mode's, as these tests check what
// the store decides.
func patient(p *policy.Policy) {
	if p.Failure.Timeout == policy.DefaultTimeout {
		p.Failure.Timeout = 5 * time.Second
	}
}

// serve runs srv behind a gRPC server on loopback and returns a client of it.
func serve(t testing.TB, srv *rls.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(rls.ServerOptions()...)
	rlsv3.RegisterRateLimitServiceServer(gs, srv)
	go gs.Serve(ln)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn)
}

func descriptor(kv ...string) *rlv3.RateLimitDescriptor {
	d := &rlv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// TestShouldRateLimit replays a request of two descriptors over gRPC on a real Redis,
// standalone and cluster: the per-IP descriptor goes over its 3 per minute on the
// fourth request, which is then denied whole — the per-key descriptor is not charged
// for it (its remaining count stops falling), where envoyproxy/ratelimit charges it.
func TestShouldRateLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		url     func(t *testing.T) string
		cluster bool
	}{
		{"standalone", func(t *testing.T) string { return "redis://" + redistest.StartServer(t).Addr }, false},
		{"cluster", func(t *testing.T) string { return redistest.StartCluster(t).URL() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			url := tc.url(t)
			c := client(t, url, tc.cluster)
			req := &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{
				descriptor("key1", "foo"), descriptor("remote_address", "192.0.2.7"),
			}}
			var last *rlsv3.RateLimitResponse
			for i := range 6 { // the fifth and sixth come from the deny cache
				resp, err := c.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				last = resp
				wantOK := i < 3
				if (resp.OverallCode == rlsv3.RateLimitResponse_OK) != wantOK || len(resp.Statuses) != 2 {
					t.Fatalf("request %d: %v with %d statuses, want OK: %v", i+1, resp.OverallCode, len(resp.Statuses), wantOK)
				}
				key, ip := resp.Statuses[0], resp.Statuses[1]
				if key.Code != rlsv3.RateLimitResponse_OK {
					t.Errorf("request %d: per-key %v, want OK", i+1, key.Code)
				}
				if want := uint32(20 - min(i+1, 3)); i < 4 && key.LimitRemaining != want {
					t.Errorf("request %d: per-key %d remaining, want %d", i+1, key.LimitRemaining, want)
				}
				if !wantOK && ip.Code != rlsv3.RateLimitResponse_OVER_LIMIT {
					t.Errorf("request %d: per-ip %v, want OVER_LIMIT", i+1, ip.Code)
				}
			}
			// In Redis, the per-key window holds the three admitted requests only.
			if !tc.cluster {
				rc := redis.NewClient(&redis.Options{Addr: strings.TrimPrefix(url, "redis://")})
				defer rc.Close()
				keys, err := rc.Keys(context.Background(), "*per-key*").Result()
				if err != nil || len(keys) != 1 {
					t.Fatalf("per-key keys in Redis = %v, %v; want one window", keys, err)
				}
				if n, err := rc.Get(context.Background(), keys[0]).Int(); err != nil || n != 3 {
					t.Errorf("GET %s = %d, %v; want 3: a denied request charged the descriptor under its limit", keys[0], n, err)
				}
			}
			// The per-key limit was charged by the three admitted requests only: the
			// next request of key1 alone finds 17 left and takes one.
			alone, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{descriptor("key1", "foo")}})
			if err != nil || alone.OverallCode != rlsv3.RateLimitResponse_OK || alone.Statuses[0].LimitRemaining != 16 {
				t.Errorf("key1 alone after the denials = %v, %v; want OK with 16 remaining (ERL would have charged the denied requests too)", alone, err)
			}
			lim := last.Statuses[1].CurrentLimit
			if lim.GetRequestsPerUnit() != 3 || lim.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || lim.GetName() != "per-ip" {
				t.Errorf("per-ip current_limit = %v, want 3 per MINUTE named per-ip", lim)
			}
			if d := last.Statuses[1].DurationUntilReset.AsDuration(); d <= 0 || d > 60e9 {
				t.Errorf("per-ip duration_until_reset = %v, want within the minute", d)
			}
			headers := map[string]string{}
			for _, h := range last.ResponseHeadersToAdd {
				headers[h.Key] = h.Value
			}
			if headers["Retry-After"] == "" || !strings.Contains(headers["RateLimit-Policy"], `"per-ip";q=3;w=60`) {
				t.Errorf("response_headers_to_add = %v, want Retry-After and the RateLimit headers", headers)
			}
		})
	}
}

// TestHostileRequests gets INVALID_ARGUMENT, with a message, for what tollgate cannot
// decide: no or too many descriptors, a huge value, per-descriptor costs or limits, a
// huge hits_addend. (An unknown domain is answered, as envoyproxy/ratelimit answers
// it: TestUnknownDomain.)
func TestHostileRequests(t *testing.T) {
	t.Parallel()
	c := client(t, "redis://"+redistest.StartServer(t).Addr, false)
	many := make([]*rlv3.RateLimitDescriptor, rls.MaxDescriptors+1)
	for i := range many {
		many[i] = descriptor("key1", "x")
	}
	withLimit := func(per uint32, unit typev3.RateLimitUnit, mult *wrapperspb.UInt32Value) *rlv3.RateLimitDescriptor {
		d := descriptor("key1", "x")
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: per, Unit: unit, UnitMultiplier: mult}
		return d
	}
	perCost := descriptor("key1", "x")
	perCost.HitsAddend = wrapperspb.UInt64(7)
	for name, tc := range map[string]struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		"no descriptors":      {&rlsv3.RateLimitRequest{Domain: "rl"}, "no descriptors"},
		"too many":            {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: many}, "at most 64"},
		"huge value":          {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{descriptor("key1", strings.Repeat("v", 5000))}}, "longer than 1024 bytes"},
		"huge hits":           {&rlsv3.RateLimitRequest{Domain: "rl", HitsAddend: 1 << 31, Descriptors: []*rlv3.RateLimitDescriptor{descriptor("key1", "x")}}, "cost must be from 0 to"},
		"override of 0":       {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{withLimit(0, typev3.RateLimitUnit_SECOND, nil)}}, "limit.requests_per_unit is 0"},
		"override of 2 years": {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{withLimit(5, typev3.RateLimitUnit_YEAR, wrapperspb.UInt32(2))}}, "send a shorter window"},
		"override no unit":    {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{withLimit(5, typev3.RateLimitUnit_UNKNOWN, nil)}}, "limit.unit UNKNOWN"},
		"override too long":   {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{withLimit(5, typev3.RateLimitUnit_DAY, wrapperspb.UInt32(1<<32-1))}}, "send a shorter window"},
		"override mult 0":     {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{withLimit(5, typev3.RateLimitUnit_DAY, wrapperspb.UInt32(0))}}, "limit.unit_multiplier is 0"},
		"costs that differ":   {&rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{perCost, descriptor("key1", "y")}}, "descriptors[1]: a cost (hits_addend) of 1 where descriptors[0] has 7"},
	} {
		_, err := c.ShouldRateLimit(context.Background(), tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want INVALID_ARGUMENT with %q", name, err, tc.want)
		}
	}
}

// TestDomainsCheckTheEngine serves domain "api" on an engine whose policy decides
// another domain (as the service's own policy reloaded under a new name would): a
// request for "api" is refused, never decided by that policy.
func TestDomainsCheckTheEngine(t *testing.T) {
	t.Parallel()
	eng := testEngine(t, "redis://"+redistest.StartServer(t).Addr, false) // domain rl
	c := serve(t, rls.NewDomains(map[string]rls.Domain{"api": {Engine: eng}}, nil))
	_, err := c.ShouldRateLimit(context.Background(), request("api", descriptor("key1", "x")))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "unknown domain") {
		t.Errorf("domain api on an engine of domain rl: %v, want INVALID_ARGUMENT, unknown domain", err)
	}
}

// TestDescriptorLimitOverride sends descriptors that carry their own limit (Envoy's
// dynamic override) on a real Redis: the override alone decides (2 per minute where
// the policy says 20), each override has its own count, a descriptor without one
// still gets the policy's limit and was never charged by the overridden requests,
// and the override's key expires with its window.
func TestDescriptorLimitOverride(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	c := client(t, "redis://"+srv.Addr, false)
	ctx := context.Background()
	send := func(d *rlv3.RateLimitDescriptor) *rlsv3.RateLimitResponse_DescriptorStatus {
		t.Helper()
		resp, err := c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0]
	}
	over := func(per uint32) *rlv3.RateLimitDescriptor {
		d := descriptor("key1", "foo")
		d.Limit = &rlv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: per, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		st := send(over(2))
		if st.Code != want || st.CurrentLimit.GetRequestsPerUnit() != 2 || st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetName() != rls.OverrideRule {
			t.Errorf("override 2/min, request %d: %v, want %v at 2 per MINUTE named %s", i+1, st, want, rls.OverrideRule)
		}
	}
	if st := send(over(3)); st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 2 {
		t.Errorf("override 3/min after three of 2/min: %v, want OK with 2 remaining (a count of its own)", st)
	}
	if st := send(descriptor("key1", "foo")); st.Code != rlsv3.RateLimitResponse_OK || st.LimitRemaining != 19 {
		t.Errorf("no override: %v, want the policy's 20/min with 19 remaining (the overrides charged it nothing)", st)
	}
	keys, err := srv.Client(t).Keys(ctx, "*"+rls.OverrideRule+"*").Result()
	if err != nil || len(keys) != 2 {
		t.Fatalf("override keys = %v, %v; want one per override", keys, err)
	}
	for _, k := range keys {
		if ttl, err := srv.Client(t).PTTL(ctx, k).Result(); err != nil || ttl <= 0 || ttl > time.Minute {
			t.Errorf("PTTL(%s) = %v, %v; want at most the minute's window", k, ttl, err)
		}
	}
}

// TestJSONEndpoint posts envoyproxy/ratelimit's /json requests: 200 until the limit,
// then 429 with the statuses, 200 OK for an unknown domain, and 400 with a message for
// garbage.
func TestJSONEndpoint(t *testing.T) {
	t.Parallel()
	eng := testEngine(t, "redis://"+redistest.StartServer(t).Addr, false)
	h := rls.New(eng, nil).JSONHandler()
	post := func(body string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		return rec.Code, rec.Body.String()
	}
	req := `{"domain": "rl", "descriptors": [{"entries": [{"key": "remote_address", "value": "192.0.2.9"}]}]}`
	for i := range 4 {
		code, body := post(req)
		if want := map[bool]int{true: 200, false: 429}[i < 3]; code != want || !strings.Contains(body, `"overallCode"`) {
			t.Fatalf("request %d: %d %s, want %d with the response", i+1, code, body, want)
		}
		if i == 3 && !strings.Contains(body, `"OVER_LIMIT"`) {
			t.Errorf("over the limit: %s, want OVER_LIMIT", body)
		}
	}
	// A domain the service does not decide is OK with no limit, as in ERL.
	if code, body := post(`{"domain": "other", "descriptors": [{"entries": [{"key": "a", "value": "b"}]}]}`); code != 200 || !strings.Contains(body, `"OK"`) || strings.Contains(body, "currentLimit") {
		t.Errorf("POST for an unknown domain = %d %s, want 200 OK with no limit", code, body)
	}
	for _, bad := range []string{`{`, `{"domain": "rl", "descriptors": "x"}`, `{"domain": "other", "descriptors": []}`} {
		if code, body := post(bad); code != 400 || !strings.Contains(body, `"error"`) {
			t.Errorf("POST %s = %d %s, want 400 with an error", bad, code, body)
		}
	}
}

// TestDescriptorHitsAddend charges a descriptor's own hits_addend in place of the
// request's, as ERL does, and a descriptor's own 0 checks without charging.
func TestDescriptorHitsAddend(t *testing.T) {
	t.Parallel()
	c := client(t, "redis://"+redistest.StartServer(t).Addr, false)
	send := func(hits *wrapperspb.UInt64Value) uint32 {
		t.Helper()
		d := descriptor("key1", "costly")
		d.HitsAddend = hits
		resp, err := c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", HitsAddend: 2, Descriptors: []*rlv3.RateLimitDescriptor{d}})
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].LimitRemaining
	}
	for _, step := range []struct {
		hits *wrapperspb.UInt64Value
		want uint32
	}{
		{wrapperspb.UInt64(5), 15}, // the descriptor's 5, not the request's 2
		{nil, 13},                  // the request's 2
		{wrapperspb.UInt64(0), 13}, // a check that charges nothing
		{wrapperspb.UInt64(3), 10},
	} {
		if got := send(step.hits); got != step.want {
			t.Errorf("hits_addend %v: %d remaining of 20, want %d", step.hits, got, step.want)
		}
	}
}
