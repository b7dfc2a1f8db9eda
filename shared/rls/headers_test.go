package rls_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// TestOneQuotaHeaders: by default response_headers_to_add carries RateLimit and
// RateLimit-Policy alone, as envoyproxy/ratelimit adds no header unless told to; with
// ERL's LIMIT_RESPONSE_HEADERS_ENABLED (rls.ERLHeaders) it also carries the deciding
// limit's limit, remaining and reset under ERL's names, or the names its variables set.
func TestOneQuotaHeaders(t *testing.T) {
	eng := testEngine(t, "redis://"+redistest.StartServer(t).Addr, false)
	headers := func(names algo.OneQuotaNames, value string) map[string]string {
		t.Helper()
		srv := rls.New(eng, nil)
		srv.OneQuota = names
		resp, err := serve(t, srv).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "rl", Descriptors: []*rlv3.RateLimitDescriptor{descriptor("key1", value)}})
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("ShouldRateLimit = %v, %v; want OK", resp, err)
		}
		h := map[string]string{}
		for _, kv := range resp.ResponseHeadersToAdd {
			h[kv.Key] = kv.Value
		}
		return h
	}

	h := headers(algo.OneQuotaNames{}, "a")
	if len(h) != 2 || !strings.Contains(h["RateLimit-Policy"], `"per-key";q=20;w=60`) || !strings.Contains(h["RateLimit"], `"per-key";r=19;`) {
		t.Errorf("default headers = %v, want RateLimit-Policy and RateLimit alone", h)
	}

	for _, tc := range []struct {
		env  map[string]string
		want algo.OneQuotaNames
	}{
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}, algo.OneQuotaNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "1", "LIMIT_LIMIT_HEADER": "A-Limit", "LIMIT_REMAINING_HEADER": "A-Remaining", "LIMIT_RESET_HEADER": "A-Reset"}, algo.OneQuotaNames{Limit: "A-Limit", Remaining: "A-Remaining", Reset: "A-Reset"}},
		{map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "false", "LIMIT_LIMIT_HEADER": "A-Limit"}, algo.OneQuotaNames{}},
		{nil, algo.OneQuotaNames{}},
	} {
		names, err := rls.ERLHeaders(func(k string) string { return tc.env[k] })
		if err != nil || names != tc.want {
			t.Errorf("ERLHeaders(%v) = %+v, %v; want %+v", tc.env, names, err, tc.want)
		}
	}
	names, _ := rls.ERLHeaders(func(k string) string {
		return map[string]string{"LIMIT_RESPONSE_HEADERS_ENABLED": "true", "LIMIT_RESET_HEADER": "A-Reset"}[k]
	})
	h = headers(names, "b")
	if h["RateLimit-Limit"] != "20" || h["RateLimit-Remaining"] != "19" || h["A-Reset"] == "" || h["RateLimit-Reset"] != "" || len(h) != 5 {
		t.Errorf("headers with ERL's on = %v, want RateLimit-Limit 20, RateLimit-Remaining 19 and A-Reset beside the RateLimit headers", h)
	}

	for env, want := range map[string]string{
		"LIMIT_RESPONSE_HEADERS_ENABLED=sometimes": "LIMIT_RESPONSE_HEADERS_ENABLED",
		"LIMIT_LIMIT_HEADER=Bad Name":              "LIMIT_LIMIT_HEADER",
	} {
		k, v, _ := strings.Cut(env, "=")
		_, err := rls.ERLHeaders(func(n string) string {
			switch n {
			case k:
				return v
			case "LIMIT_RESPONSE_HEADERS_ENABLED":
				return "true"
			}
			return ""
		})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ERLHeaders with %s = %v, want an error naming %s", env, err, want)
		}
	}
}

// TestEveryDescriptorHeaders: with Server.EveryDescriptor (ERL's proposed
// LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED, read by rls.ERLEveryDescriptor) the
// one-quota headers come once per descriptor that has a limit, in order, in place of
// once for the deciding limit.
func TestEveryDescriptorHeaders(t *testing.T) {
	t.Parallel()
	conf := []byte(`domain: h
descriptors:
  - {key: a, rate_limit: {unit: second, requests_per_unit: 10}}
  - {key: b, rate_limit: {unit: minute, requests_per_unit: 1000}}
`)
	srv := redistest.StartServer(t)
	for env, want := range map[string]bool{"": false, "true": true, "0": false} {
		got, err := rls.ERLEveryDescriptor(func(k string) string {
			if k == "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED" {
				return env
			}
			return ""
		})
		if err != nil || got != want {
			t.Errorf("ERLEveryDescriptor(%q) = %v, %v; want %v", env, got, err, want)
		}
	}
	if _, err := rls.ERLEveryDescriptor(func(string) string { return "often" }); err == nil || !strings.Contains(err.Error(), "LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED") {
		t.Errorf("ERLEveryDescriptor(often) = %v, want an error naming the variable", err)
	}
	names := algo.OneQuotaNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
	for _, every := range []bool{false, true} {
		s := erlServer(t, "redis://"+srv.Addr, conf)
		s.OneQuota, s.EveryDescriptor = names, every
		resp, err := serve(t, s).ShouldRateLimit(context.Background(), request("h", descriptor("a", fmt.Sprint(every)), descriptor("b", fmt.Sprint(every)), descriptor("c", "z")))
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		resets := 0
		for _, kv := range resp.ResponseHeadersToAdd {
			switch kv.Key {
			case "RateLimit-Limit", "RateLimit-Remaining":
				got = append(got, kv.Key+"="+kv.Value)
			case "RateLimit-Reset":
				resets++
			}
		}
		// The deciding limit is the one with the least remaining: a's, 9 of 10.
		want, wantResets := "RateLimit-Limit=10 RateLimit-Remaining=9", 1
		if every {
			want, wantResets = "RateLimit-Limit=10 RateLimit-Remaining=9 RateLimit-Limit=1000 RateLimit-Remaining=999", 2
		}
		if g := strings.Join(got, " "); g != want || resets != wantResets {
			t.Errorf("EveryDescriptor %v: headers %s and %d RateLimit-Reset, want %s and %d", every, g, resets, want, wantResets)
		}
	}
}
