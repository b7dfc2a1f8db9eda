package engine_test

import (
	"context"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// TestClientAddressAggregated checks that the engine limits remote_address as the
// policy's identity options say, for every front door: IPv6 clients by their /64,
// ports dropped, and X-Forwarded-For only with trusted hops.
func TestClientAddressAggregated(t *testing.T) {
	for _, tc := range []struct {
		name     string
		identity string
		first    map[string]string
		second   map[string]string
		same     bool
	}{
		{"ipv6 in one /64", "", map[string]string{"remote_address": "2001:db8:1:2::1"}, map[string]string{"remote_address": "2001:db8:1:2:ffff::9"}, true},
		{"ipv6 in two /64s", "", map[string]string{"remote_address": "2001:db8:1:2::1"}, map[string]string{"remote_address": "2001:db8:1:3::1"}, false},
		{"prefix form as sent by the authorizer", "", map[string]string{"remote_address": "2001:db8:1:2::/64"}, map[string]string{"remote_address": "2001:db8:1:2::7"}, true},
		{"ipv4 with a port", "", map[string]string{"remote_address": "192.0.2.7:5555"}, map[string]string{"remote_address": "192.0.2.7"}, true},
		{"xff ignored by default", "", map[string]string{"remote_address": "10.0.0.1", "x-forwarded-for": "192.0.2.1"}, map[string]string{"remote_address": "10.0.0.1", "x-forwarded-for": "192.0.2.2"}, true},
		{"xff with one trusted hop", "identity: {trusted_proxies: 1}\n", map[string]string{"remote_address": "10.0.0.1", "x-forwarded-for": "192.0.2.1"}, map[string]string{"remote_address": "10.0.0.1", "x-forwarded-for": "192.0.2.2"}, false},
		{"ipv6 /48 by policy", "identity: {ipv6_prefix: 48}\n", map[string]string{"remote_address": "2001:db8:1:2::1"}, map[string]string{"remote_address": "2001:db8:1:9::1"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := policy.Parse([]byte("domain: d\n" + tc.identity + "rules:\n  - name: ip\n    match: {remote_address: \"*\"}\n    limits:\n      - {algorithm: fixed_window, rate: 1/min}\n"))
			if err != nil {
				t.Fatal(err)
			}
			eng, err := engine.New(engine.Config{Policy: p})
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if v, _ := eng.Check(ctx, engine.Request{Domain: "d", Attributes: tc.first, Cost: 1}); !v.Allowed {
				t.Fatalf("first request %v = %+v, want allowed", tc.first, v)
			}
			v, _ := eng.Check(ctx, engine.Request{Domain: "d", Attributes: tc.second, Cost: 1})
			if v.Allowed == tc.same {
				t.Errorf("second request %v allowed = %v, want %v (same client: %v)", tc.second, v.Allowed, !tc.same, tc.same)
			}
			if tc.first["remote_address"] == "" || tc.second["remote_address"] == "" {
				t.Fatal("the caller's attributes were modified")
			}
		})
	}
}
