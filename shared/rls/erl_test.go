package rls_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// erlClient serves the ERL configuration documents (one domain each) on a real Redis
// at url over gRPC on loopback.
func erlClient(t *testing.T, url string, cluster bool, configs ...[]byte) rlsv3.RateLimitServiceClient {
	t.Helper()
	return serve(t, erlService(t, url, cluster, configs...))
}

// erlServer is the service of the ERL configuration documents on a standalone Redis
// at url.
func erlServer(t *testing.T, url string, configs ...[]byte) *rls.Server {
	t.Helper()
	return erlService(t, url, false, configs...)
}

func erlService(t *testing.T, url string, cluster bool, configs ...[]byte) *rls.Server {
	t.Helper()
	st, err := redisstore.Open(redisstore.Config{URL: url, Cluster: cluster, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	domains := map[string]rls.Domain{}
	for _, c := range configs {
		tr, err := erl.Translate(c)
		if err != nil {
			t.Fatal(err)
		}
		p, err := policy.Parse(tr.Policy)
		if err != nil {
			t.Fatalf("the translation of domain %s does not parse: %v\n%s", tr.Domain, err, tr.Policy)
		}
		patient(p)
		eng, err := engine.New(engine.Config{Policy: p, Store: st})
		if err != nil {
			t.Fatal(err)
		}
		domains[tr.Domain] = rls.ERLDomain(tr, eng)
	}
	return rls.NewDomains(domains, nil)
}

func erlConfig(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "erl", "testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func request(domain string, descriptors ...*rlv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: descriptors, HitsAddend: 1}
}

// wantStatus checks one descriptor status the way ERL's integration test does: code,
// requests_per_unit, unit and remaining.
func wantStatus(t *testing.T, what string, st *rlsv3.RateLimitResponse_DescriptorStatus, code rlsv3.RateLimitResponse_Code, per uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, remaining uint32) {
	t.Helper()
	if st.GetCode() != code || st.GetCurrentLimit().GetRequestsPerUnit() != per || st.GetCurrentLimit().GetUnit() != unit || st.GetLimitRemaining() != remaining {
		t.Errorf("%s: %v %d/%v remaining %d, want %v %d/%v remaining %d", what, st.GetCode(), st.GetCurrentLimit().GetRequestsPerUnit(), st.GetCurrentLimit().GetUnit(), st.GetLimitRemaining(), code, per, unit, remaining)
	}
}

// TestERLIntegrationScenarios replays envoyproxy/ratelimit's own integration scenarios
// (its test/integration configurations basic.yaml, another.yaml and
// share_threshold.yaml, loaded as they are) over gRPC on a real Redis, standalone and
// cluster, with ERL's expected answers. The differences, each on purpose:
//   - two descriptors in one request: once one is over its limit, the other is not
//     charged (ERL's StopCacheKeyIncrementWhenOverlimit gives the same numbers);
//   - none other: a wildcard value without share_threshold counts each value apart,
//     as in ERL.
func TestERLIntegrationScenarios(t *testing.T) {
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
			c := erlClient(t, tc.url(t), tc.cluster, erlConfig(t, "basic.yaml"), erlConfig(t, "another.yaml"), erlConfig(t, "share_threshold.yaml"))
			ctx := context.Background()
			const (
				ok   = rlsv3.RateLimitResponse_OK
				over = rlsv3.RateLimitResponse_OVER_LIMIT
			)
			resp, err := c.ShouldRateLimit(ctx, request("basic", descriptor("key1", "foo")))
			if err != nil {
				t.Fatal(err)
			}
			wantStatus(t, "basic key1", resp.Statuses[0], ok, 50, rlsv3.RateLimitResponse_RateLimit_SECOND, 49)

			// basic/foo_unknown_domain: a domain no file defines is OK with no limit.
			resp, err = c.ShouldRateLimit(ctx, request("foo", descriptor("key1", "foo")))
			if err != nil || resp.OverallCode != ok || resp.Statuses[0].CurrentLimit != nil {
				t.Errorf("unknown domain foo: %v, %v; want OK with no limit", resp, err)
			}

			// Over a 20 per minute limit on a fresh value.
			v := fmt.Sprint(time.Now().UnixNano())
			for i := range 25 {
				resp, err := c.ShouldRateLimit(ctx, request("another", descriptor("key2", v)))
				if err != nil {
					t.Fatal(err)
				}
				code, rem := ok, uint32(20-(i+1))
				if i >= 20 {
					code, rem = over, 0
				}
				if resp.OverallCode != code {
					t.Fatalf("another key2 request %d: %v, want %v", i+1, resp.OverallCode, code)
				}
				wantStatus(t, fmt.Sprintf("another key2 request %d", i+1), resp.Statuses[0], code, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, rem)
			}

			// Two descriptors in one request: key3 (10 per hour) goes over first.
			v = fmt.Sprint(time.Now().UnixNano())
			for i := range 15 {
				resp, err := c.ShouldRateLimit(ctx, request("another", descriptor("key2", v), descriptor("key3", v)))
				if err != nil {
					t.Fatal(err)
				}
				code, rem1, rem2 := ok, uint32(20-(i+1)), uint32(10-(i+1))
				if i >= 10 {
					code, rem1, rem2 = over, 10, 0
				}
				if resp.OverallCode != code {
					t.Fatalf("another key2+key3 request %d: %v, want %v", i+1, resp.OverallCode, code)
				}
				what := fmt.Sprintf("another key2+key3 request %d", i+1)
				wantStatus(t, what+" key3", resp.Statuses[1], code, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, rem2)
				// From the 12th on the deny cache answers, with key2's status as Redis gave it.
				wantStatus(t, what+" key2", resp.Statuses[0], ok, 20, rlsv3.RateLimitResponse_RateLimit_MINUTE, rem1)
			}

			// share_threshold: every value under files/ shares one count of 10 per hour.
			for i := range 10 {
				if _, err := c.ShouldRateLimit(ctx, request("share-threshold-test", descriptor("files", fmt.Sprintf("files/%d.pdf", i%2)))); err != nil {
					t.Fatal(err)
				}
			}
			resp, err = c.ShouldRateLimit(ctx, request("share-threshold-test", descriptor("files", "files/b.csv")))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode != over {
				t.Fatalf("share-threshold files/b.csv after 10: %v, want OVER_LIMIT", resp.OverallCode)
			}
			wantStatus(t, "share-threshold files/b.csv", resp.Statuses[0], over, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 0)

			// Without share_threshold every value under files_no_share/ counts apart.
			base := time.Now().UnixNano()
			for i := range 10 {
				resp, err := c.ShouldRateLimit(ctx, request("share-threshold-test", descriptor("files_no_share", fmt.Sprintf("files_no_share/%d-%d", base, i))))
				if err != nil {
					t.Fatal(err)
				}
				wantStatus(t, fmt.Sprintf("share-threshold files_no_share value %d", i), resp.Statuses[0], ok, 10, rlsv3.RateLimitResponse_RateLimit_HOUR, 9)
			}
		})
	}
}

// TestERLSpecificity checks ERL's walk on nested descriptors: the exact value wins over
// the key alone at each level, a specific node without the request's next key gives no
// limit (ERL does not fall back to the generic node), and a descriptor of other keys
// than a rule's never meets it.
func TestERLSpecificity(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: nested
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 5}
    descriptors:
      - key: path
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: minute, requests_per_unit: 100}
`)
	c := erlClient(t, "redis://"+redistest.StartServer(t).Addr, false, conf)
	count := func(ds ...*rlv3.RateLimitDescriptor) (admitted int, rpu uint32) {
		for range 10 {
			resp, err := c.ShouldRateLimit(context.Background(), request("nested", ds...))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
			rpu = resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
		}
		return admitted, rpu
	}
	for _, tt := range []struct {
		what     string
		d        *rlv3.RateLimitDescriptor
		admitted int
		rpu      uint32
	}{
		{"a client by address", descriptor("remote_address", "192.0.2.1"), 5, 5},
		{"a client by address and path", descriptor("remote_address", "192.0.2.2", "path", "/x"), 3, 3},
		{"the specific address", descriptor("remote_address", "10.0.0.1"), 10, 100},
		{"the specific address and a path: no limit, as in ERL", descriptor("remote_address", "10.0.0.1", "path", "/x"), 10, 0},
		{"unknown keys", descriptor("path", "/x"), 10, 0},
	} {
		admitted, rpu := count(tt.d)
		if admitted != tt.admitted || rpu != tt.rpu {
			t.Errorf("%s: %d of 10 admitted under %d per unit, want %d under %d", tt.what, admitted, rpu, tt.admitted, tt.rpu)
		}
	}
}

// TestERLReplaces sends a request of two descriptors, one of which reaches a limit
// that replaces (ERL's replaces, across the descriptors of a request) the other's:
// as in ERL, the replaced limit is not applied, so its descriptor answers OK with no
// limit and its count stays untouched in Redis, while alone it is limited.
func TestERLReplaces(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: repl
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2, name: per-tenant}
  - key: plan
    value: gold
    rate_limit: {unit: minute, requests_per_unit: 50, name: gold, replaces: [{name: per-tenant}]}
`)
	srv := redistest.StartServer(t)
	c := erlClient(t, "redis://"+srv.Addr, false, conf)
	ctx := context.Background()
	for i := range 5 {
		resp, err := c.ShouldRateLimit(ctx, request("repl", descriptor("tenant", "acme"), descriptor("plan", "gold")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].GetCurrentLimit().GetRequestsPerUnit() != 50 {
			t.Fatalf("gold request %d: %v, want OK, the tenant's limit replaced and gold's 50 per minute", i+1, resp)
		}
	}
	if keys, err := srv.Client(t).Keys(ctx, "*per-tenant*").Result(); err != nil || len(keys) != 0 {
		t.Errorf("per-tenant keys after the gold requests = %v, %v; want none: a replaced limit is not charged", keys, err)
	}
	admitted := 0
	for range 5 {
		resp, err := c.ShouldRateLimit(ctx, request("repl", descriptor("tenant", "acme")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 2 {
		t.Errorf("the tenant alone: %d of 5 admitted, want its 2 per minute", admitted)
	}
}

// TestERLDomainsApart serves two ERL files with the same descriptors under different
// domains on one real Redis: each keeps its own count, as ERL keys counts by domain;
// and with Redis gone, a translated domain answers UNAVAILABLE (its failure mode is
// closed), so that Envoy's failure_mode_deny decides, as with ERL.
func TestERLDomainsApart(t *testing.T) {
	t.Parallel()
	conf := func(domain string) []byte {
		return []byte("domain: " + domain + "\ndescriptors:\n  - {key: client, rate_limit: {unit: minute, requests_per_unit: 2}}\n")
	}
	srv := redistest.StartServer(t)
	c := erlClient(t, "redis://"+srv.Addr, false, conf("alpha"), conf("beta"))
	ctx := context.Background()
	for _, domain := range []string{"alpha", "beta"} {
		admitted := 0
		for range 4 {
			resp, err := c.ShouldRateLimit(ctx, request(domain, descriptor("client", "c1")))
			if err != nil {
				t.Fatal(err)
			}
			if resp.OverallCode == rlsv3.RateLimitResponse_OK {
				admitted++
			}
		}
		if admitted != 2 {
			t.Errorf("domain %s: %d of 4 admitted, want its own 2 per minute", domain, admitted)
		}
	}
	srv.Kill()
	_, err := c.ShouldRateLimit(ctx, request("alpha", descriptor("client", "c2")))
	if status.Code(err) != codes.Unavailable {
		t.Errorf("with Redis gone: %v, want UNAVAILABLE", err)
	}
}

// TestERLNamesAsWritten serves ERL files whose domains and keys tollgate's own names
// do not take (upper case, ':') over gRPC on a real Redis, requested as Envoy sends
// them: each limit applies to its own key, keys and domains that differ only in case
// keep their own counts, as in ERL.
func TestERLNamesAsWritten(t *testing.T) {
	t.Parallel()
	conf := func(domain string) []byte {
		return []byte("domain: " + domain + `
descriptors:
  - {key: USER_ID, rate_limit: {unit: minute, requests_per_unit: 2}}
  - {key: user_id, rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: "path:prefix", value: "/Admin", rate_limit: {unit: minute, requests_per_unit: 1}}
`)
	}
	srv := redistest.StartServer(t)
	c := erlClient(t, "redis://"+srv.Addr, false, conf("Edge"), conf("edge"))
	ctx := context.Background()
	for _, domain := range []string{"Edge", "edge"} {
		for _, tc := range []struct {
			key, value string
			want       int
		}{{"USER_ID", "bob", 2}, {"user_id", "bob", 3}, {"path:prefix", "/Admin", 1}} {
			admitted := 0
			for range 5 {
				resp, err := c.ShouldRateLimit(ctx, request(domain, descriptor(tc.key, tc.value)))
				if err != nil {
					t.Fatalf("domain %s, %s=%s: %v", domain, tc.key, tc.value, err)
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					admitted++
				}
			}
			if admitted != tc.want {
				t.Errorf("domain %s, %s=%s: %d of 5 admitted, want its own %d per minute", domain, tc.key, tc.value, admitted, tc.want)
			}
		}
	}
	// A descriptor no rule reaches is allowed, with no limit.
	resp, err := c.ShouldRateLimit(ctx, request("Edge", descriptor("path:prefix", "/admin")))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
		t.Errorf("path:prefix=/admin (no rule): %v, %v; want OK with no limit", resp, err)
	}
}

// TestERLWildcards serves wildcards at the end of a value (ERL's) and anywhere in it
// (tollgate's reading of "*" beyond ERL's current release) over gRPC on a real Redis:
// "*" stands for any run of characters; of wildcard siblings the first in the file
// that matches wins, as in ERL; an exact value wins over any wildcard; without
// share_threshold each value counts apart, with it all share one count.
func TestERLWildcards(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: wild
descriptors:
  - {key: host, value: "api.*.example.com", rate_limit: {unit: minute, requests_per_unit: 3}}
  - {key: host, value: "api.*", rate_limit: {unit: minute, requests_per_unit: 4}}
  - {key: host, value: "*.example.com", share_threshold: true, rate_limit: {unit: minute, requests_per_unit: 5}}
  - {key: host, value: "api.eu.example.com", rate_limit: {unit: minute, requests_per_unit: 6}}
  - {key: path, value: "/v*/users/*/orders", rate_limit: {unit: minute, requests_per_unit: 7}}
`)
	c := erlClient(t, "redis://"+redistest.StartServer(t).Addr, false, conf)
	ask := func(key, value string) (per, remaining uint32) {
		t.Helper()
		resp, err := c.ShouldRateLimit(context.Background(), request("wild", descriptor(key, value)))
		if err != nil {
			t.Fatal(err)
		}
		return resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit(), resp.Statuses[0].GetLimitRemaining()
	}
	for _, tc := range []struct {
		key, value string
		per, rem   uint32
	}{
		{"host", "api.us.example.com", 3, 2},   // the first wildcard that matches
		{"host", "api.us.example.com", 3, 1},   // its own count
		{"host", "api.jp.example.com", 3, 2},   // a count per value
		{"host", "api.us.example.org", 4, 3},   // the second
		{"host", "www.example.com", 5, 4},      // share_threshold: one count
		{"host", "cdn.example.com", 5, 3},      // … shared
		{"host", "api.eu.example.com", 6, 5},   // the exact value
		{"host", "web.example.org", 0, 0},      // none
		{"path", "/v2/users/7/orders", 7, 6},   // two "*" in one value
		{"path", "/v2/users/7/orders/1", 0, 0}, // anchored at the end
		{"path", "/x/v2/users/7/orders", 0, 0}, // and at the start
	} {
		if per, rem := ask(tc.key, tc.value); per != tc.per || rem != tc.rem {
			t.Errorf("%s=%s: %d per minute, %d remaining; want %d, %d", tc.key, tc.value, per, rem, tc.per, tc.rem)
		}
	}
}

// TestERLQuotaMode serves a quota_mode limit beside an ordinary one over gRPC on a
// real Redis: as ERL's service answers, a quota_mode limit over its count is OK with
// its limit and 0 remaining, and the request is not denied for it; the ordinary
// limit still denies.
func TestERLQuotaMode(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: quota
descriptors:
  - {key: tenant, quota_mode: true, rate_limit: {unit: hour, requests_per_unit: 2}}
  - {key: user, rate_limit: {unit: hour, requests_per_unit: 4}}
`)
	c := erlClient(t, "redis://"+redistest.StartServer(t).Addr, false, conf)
	for i := range 5 {
		resp, err := c.ShouldRateLimit(context.Background(), request("quota", descriptor("tenant", "acme"), descriptor("user", "bob")))
		if err != nil {
			t.Fatal(err)
		}
		code, quotaRem, userCode := rlsv3.RateLimitResponse_OK, uint32(max(0, 2-(i+1))), rlsv3.RateLimitResponse_OK
		if i == 4 {
			code, userCode = rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
		}
		if resp.OverallCode != code {
			t.Errorf("request %d: %v, want %v", i+1, resp.OverallCode, code)
		}
		if i < 4 {
			wantStatus(t, fmt.Sprintf("request %d tenant", i+1), resp.Statuses[0], rlsv3.RateLimitResponse_OK, 2, rlsv3.RateLimitResponse_RateLimit_HOUR, quotaRem)
		}
		if st := resp.Statuses[1]; st.GetCode() != userCode {
			t.Errorf("request %d user: %v, want %v", i+1, st, userCode)
		}
	}
}

// TestERLUnlimitedAndDenied checks two of ERL's answers: an unlimited descriptor has
// 4294967295 remaining and no limit, and a request denied for a cost above what
// remains (hits_addend 6 against 5 per second) reports 0 remaining, though tollgate
// charged nothing and 5 still remain for a smaller request.
func TestERLUnlimitedAndDenied(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: d
descriptors:
  - {key: k, value: free, rate_limit: {unlimited: true}}
  - {key: k, rate_limit: {unit: minute, requests_per_unit: 5}}
`)
	c := erlClient(t, "redis://"+redistest.StartServer(t).Addr, false, conf)
	ctx := context.Background()
	resp, err := c.ShouldRateLimit(ctx, request("d", descriptor("k", "free")))
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[0].LimitRemaining != 1<<32-1 {
		t.Errorf("unlimited: %v, %v; want OK, no limit, 4294967295 remaining", resp, err)
	}
	over := request("d", descriptor("k", "x"))
	over.HitsAddend = 6
	resp, err = c.ShouldRateLimit(ctx, over)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "hits_addend 6 of 5", resp.Statuses[0], rlsv3.RateLimitResponse_OVER_LIMIT, 5, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0)
	resp, err = c.ShouldRateLimit(ctx, request("d", descriptor("k", "x")))
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, "then hits_addend 1 (the denied request charged nothing)", resp.Statuses[0], rlsv3.RateLimitResponse_OK, 5, rlsv3.RateLimitResponse_RateLimit_MINUTE, 4)
}

// TestERLGlobalModes sets envoyproxy/ratelimit's global SHADOW_MODE and QUOTA_MODE
// (rls.ERLModes) on a service over gRPC on a real Redis: over the limit, shadow
// answers OK with the statuses as they are, quota also makes each status OK, and
// neither sends Retry-After.
func TestERLGlobalModes(t *testing.T) {
	t.Parallel()
	for env, want := range map[string][2]bool{"SHADOW_MODE=true": {true, false}, "QUOTA_MODE=1": {false, true}, "": {}} {
		k, v, _ := strings.Cut(env, "=")
		shadow, quota, err := rls.ERLModes(func(n string) string {
			if n == k {
				return v
			}
			return ""
		})
		if err != nil || shadow != want[0] || quota != want[1] {
			t.Errorf("ERLModes(%s) = %v, %v, %v; want %v", env, shadow, quota, err, want)
		}
	}
	if _, _, err := rls.ERLModes(func(n string) string { return map[string]string{"QUOTA_MODE": "maybe"}[n] }); err == nil || !strings.Contains(err.Error(), "QUOTA_MODE") {
		t.Errorf("ERLModes(QUOTA_MODE=maybe) = %v, want an error naming it", err)
	}
	conf := []byte("domain: g\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1}}\n")
	srv := redistest.StartServer(t)
	for _, mode := range []string{"none", "shadow", "quota"} {
		s := erlServer(t, "redis://"+srv.Addr, conf)
		s.OneQuota = algo.OneQuotaNames{Limit: "RateLimit-Limit"}
		s.Shadow, s.Quota = mode == "shadow", mode == "quota"
		c := serve(t, s)
		req := request("g", descriptor("k", mode))
		req.HitsAddend = 2
		resp, err := c.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		code, stCode := rlsv3.RateLimitResponse_OVER_LIMIT, rlsv3.RateLimitResponse_OVER_LIMIT
		switch mode {
		case "shadow":
			code = rlsv3.RateLimitResponse_OK
		case "quota":
			code, stCode = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK
		}
		retry := false
		for _, h := range resp.ResponseHeadersToAdd {
			retry = retry || h.Key == "Retry-After"
		}
		if resp.OverallCode != code || resp.Statuses[0].GetCode() != stCode || resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit() != 1 || retry != (mode == "none") {
			t.Errorf("%s: %v, want %v, status %v, Retry-After %v", mode, resp, code, stCode, mode == "none")
		}
	}
}

// TestERLUnlimitedReplaces sends a descriptor that reaches an unlimited limit which
// replaces another descriptor's limit, as ERL allows: the replaced limit applies to
// no descriptor of the request, and the unlimited one answers 4294967295 remaining.
func TestERLUnlimitedReplaces(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: repl
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 1, name: per-tenant}
  - key: plan
    value: unlimited
    rate_limit: {unlimited: true, name: free, replaces: [{name: per-tenant}]}
`)
	c := erlClient(t, "redis://"+redistest.StartServer(t).Addr, false, conf)
	for i := range 3 {
		resp, err := c.ShouldRateLimit(context.Background(), request("repl", descriptor("tenant", "acme"), descriptor("plan", "unlimited")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil || resp.Statuses[1].LimitRemaining != 1<<32-1 {
			t.Fatalf("request %d: %v, want OK, the tenant's limit replaced, the plan unlimited", i+1, resp)
		}
	}
	admitted := 0
	for range 3 {
		resp, err := c.ShouldRateLimit(context.Background(), request("repl", descriptor("tenant", "acme")))
		if err != nil {
			t.Fatal(err)
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_OK {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("the tenant alone: %d of 3 admitted, want its 1 per minute (the replaced requests charged nothing)", admitted)
	}
}
