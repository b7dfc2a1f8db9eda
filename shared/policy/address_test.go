package policy_test

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

func TestClientAddress(t *testing.T) {
	t.Parallel()
	def := policy.Identity{IPv6Prefix: 64}
	two := policy.Identity{TrustedProxies: 2, IPv6Prefix: 64}
	tests := []struct {
		name string
		peer string
		xff  string
		id   policy.Identity
		want string
	}{
		{"IPv4", "192.0.2.1", "", def, "192.0.2.1"},
		{"IPv4 with port", "192.0.2.1:5678", "", def, "192.0.2.1"},
		{"IPv4 with spaces", " 192.0.2.1 ", "", def, "192.0.2.1"},
		{"IPv6 aggregated to /64", "2001:db8:1:2:3:4:5:6", "", def, "2001:db8:1:2::/64"},
		{"IPv6 with port", "[2001:db8:1:2::7]:443", "", def, "2001:db8:1:2::/64"},
		{"IPv6 in brackets", "[2001:db8:1:2::7]", "", def, "2001:db8:1:2::/64"},
		{"IPv6 with zone", "fe80::1%eth0", "", def, "fe80::/64"},
		{"IPv6 /48", "2001:db8:1:2::7", "", policy.Identity{IPv6Prefix: 48}, "2001:db8:1::/48"},
		{"IPv6 /128", "2001:db8::7", "", policy.Identity{IPv6Prefix: 128}, "2001:db8::7/128"},
		{"IPv6 prefix out of range", "2001:db8:1:2::7", "", policy.Identity{IPv6Prefix: 200}, "2001:db8:1:2::/64"},
		{"IPv6 prefix unset", "2001:db8:1:2::7", "", policy.Identity{}, "2001:db8:1:2::/64"},
		{"IPv4-mapped IPv6", "::ffff:192.0.2.1", "", def, "192.0.2.1"},
		{"IPv4-mapped IPv6 with port", "[::ffff:192.0.2.1]:80", "", def, "192.0.2.1"},
		{"XFF ignored without trusted proxies", "192.0.2.1", "198.51.100.7", def, "192.0.2.1"},
		{"XFF one trusted hop", "10.0.0.1", "203.0.113.5, 198.51.100.7", policy.Identity{TrustedProxies: 1}, "198.51.100.7"},
		{"XFF two trusted hops", "10.0.0.1", "203.0.113.5, 198.51.100.7, 10.0.0.2", two, "198.51.100.7"},
		{"XFF forged entries on the left", "10.0.0.1", "1.1.1.1, 2.2.2.2, 198.51.100.7, 10.0.0.2", two, "198.51.100.7"},
		{"XFF too short", "10.0.0.1", "198.51.100.7", two, "10.0.0.1"},
		{"XFF empty", "10.0.0.1:3000", "", two, "10.0.0.1"},
		{"XFF blank", "10.0.0.1", "  ", two, "10.0.0.1"},
		{"XFF without spaces", "10.0.0.1", "198.51.100.7,10.0.0.2", two, "198.51.100.7"},
		{"XFF IPv6 entry", "10.0.0.1", "[2001:db8:1:2::7]:1234, 10.0.0.2", two, "2001:db8:1:2::/64"},
		{"XFF garbage entry", "10.0.0.1", "not an ip, 10.0.0.2", two, "not%20an%20ip"},
		{"XFF empty entry", "10.0.0.1", ",10.0.0.2", two, "%"},
		{"garbage", "unknown", "", def, "unknown"},
		{"garbage with braces", "{x}:y", "", def, "%7Bx%7D%3Ay"},
		{"empty peer", "", "", def, "%"},
		{"leading zeros are not an address", "01.2.3.4", "", def, "01.2.3.4"},
		{"a prefix is not an address", "2001:db8::/64", "", def, "2001%3Adb8%3A%3A/64"},
		{"port out of range", "192.0.2.1:70000", "", def, "192.0.2.1%3A70000"},
		{"long garbage is hashed", strings.Repeat("x", 200), "", def, algo.HashValue(strings.Repeat("x", 200))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := policy.ClientAddress(tt.peer, tt.xff, tt.id)
			if got != tt.want {
				t.Errorf("ClientAddress(%q, %q, %+v) = %q, want %q", tt.peer, tt.xff, tt.id, got, tt.want)
			}
		})
	}
}

// TestNormalizeAddressIdempotent checks that the engine's normalization keeps what the
// authorizer already normalized, and leaves non-addresses alone.
func TestNormalizeAddressIdempotent(t *testing.T) {
	id := policy.Identity{IPv6Prefix: 64}
	for _, peer := range []string{"192.0.2.1", "192.0.2.1:80", "[2001:db8::1]:443", "2001:db8:1:2:3:4:5:6", "::ffff:192.0.2.9"} {
		once := policy.ClientAddress(peer, "", id)
		if got := policy.NormalizeAddress(once, "", id); got != once {
			t.Errorf("NormalizeAddress(ClientAddress(%q) = %q) = %q, want it unchanged", peer, once, got)
		}
		if got := policy.NormalizeAddress(peer, "", id); got != once {
			t.Errorf("NormalizeAddress(%q) = %q, want %q as ClientAddress gives", peer, got, once)
		}
	}
	if got := policy.NormalizeAddress("not an {address}", "", id); got != "not an {address}" {
		t.Errorf("NormalizeAddress(garbage) = %q, want it unchanged", got)
	}
	if got := policy.NormalizeAddress("2001:db8:1:2:3::/80", "", id); got != "2001:db8:1:2::/64" {
		t.Errorf("NormalizeAddress(a /80) = %q, want the /64", got)
	}
}
