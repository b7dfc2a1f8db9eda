package identity_test

import (
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/identity"
)

func TestAddress(t *testing.T) {
	t.Parallel()
	def := identity.Options{IPv6Prefix: 64}
	two := identity.Options{TrustedProxies: 2, IPv6Prefix: 64}
	tests := []struct {
		name string
		peer string
		xff  string
		id   identity.Options
		want string
	}{
		{"IPv4", "192.0.2.1", "", def, "192.0.2.1"},
		{"IPv4 with port", "192.0.2.1:5678", "", def, "192.0.2.1"},
		{"IPv4 with spaces", " 192.0.2.1 ", "", def, "192.0.2.1"},
		{"IPv6 aggregated to /64", "2001:db8:1:2:3:4:5:6", "", def, "2001:db8:1:2::/64"},
		{"IPv6 with port", "[2001:db8:1:2::7]:443", "", def, "2001:db8:1:2::/64"},
		{"IPv6 in brackets", "[2001:db8:1:2::7]", "", def, "2001:db8:1:2::/64"},
		{"IPv6 with zone", "fe80::1%eth0", "", def, "fe80::/64"},
		{"IPv6 /48", "2001:db8:1:2::7", "", identity.Options{IPv6Prefix: 48}, "2001:db8:1::/48"},
		{"IPv6 /128", "2001:db8::7", "", identity.Options{IPv6Prefix: 128}, "2001:db8::7/128"},
		{"IPv6 prefix out of range", "2001:db8:1:2::7", "", identity.Options{IPv6Prefix: 200}, "2001:db8:1:2::/64"},
		{"IPv6 prefix unset", "2001:db8:1:2::7", "", identity.Options{}, "2001:db8:1:2::/64"},
		{"IPv4-mapped IPv6", "::ffff:192.0.2.1", "", def, "192.0.2.1"},
		{"IPv4-mapped IPv6 with port", "[::ffff:192.0.2.1]:80", "", def, "192.0.2.1"},
		{"XFF ignored without trusted proxies", "192.0.2.1", "198.51.100.7", def, "192.0.2.1"},
		{"XFF one trusted hop", "10.0.0.1", "203.0.113.5, 198.51.100.7", identity.Options{TrustedProxies: 1}, "198.51.100.7"},
		{"XFF two trusted hops", "10.0.0.1", "203.0.113.5, 198.51.100.7, 10.0.0.2", two, "198.51.100.7"},
		{"XFF forged entries on the left", "10.0.0.1", "1.1.1.1, 2.2.2.2, 198.51.100.7, 10.0.0.2", two, "198.51.100.7"},
		{"XFF too short", "10.0.0.1", "198.51.100.7", two, "10.0.0.1"},
		{"XFF empty", "10.0.0.1:3000", "", two, "10.0.0.1"},
		{"XFF blank", "10.0.0.1", "  ", two, "10.0.0.1"},
		{"XFF without spaces", "10.0.0.1", "198.51.100.7,10.0.0.2", two, "198.51.100.7"},
		{"XFF IPv6 entry", "10.0.0.1", "[2001:db8:1:2::7]:1234, 10.0.0.2", two, "2001:db8:1:2::/64"},
		{"XFF garbage entry falls back to the peer", "10.0.0.1", "not an ip, 10.0.0.2", two, "10.0.0.1"},
		{"XFF empty entry falls back to the peer", "10.0.0.1", ",10.0.0.2", two, "10.0.0.1"},
		{"XFF blank last entry falls back to the peer", "192.0.2.9:5000", "203.0.113.5, ", identity.Options{TrustedProxies: 1}, "192.0.2.9"},
		{"XFF garbage peer stays as it is", "{x}", "203.0.113.5, ", identity.Options{TrustedProxies: 1}, "{x}"},
		{"garbage", "unknown", "", def, "unknown"},
		{"garbage with braces", "{x}:y", "", def, "{x}:y"},
		{"empty peer", "", "", def, ""},
		{"leading zeros are not an address", "01.2.3.4", "", def, "01.2.3.4"},
		{"an IPv6 prefix is kept", "2001:db8::/64", "", def, "2001:db8::/64"},
		{"port out of range", "192.0.2.1:70000", "", def, "192.0.2.1:70000"},
		{"long garbage is kept", strings.Repeat("x", 200), "", def, strings.Repeat("x", 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, _ := identity.Address(tt.peer, tt.xff, tt.id)
			if got != tt.want {
				t.Errorf("Address(%q, %q, %+v) = %q, want %q", tt.peer, tt.xff, tt.id, got, tt.want)
			}
		})
	}
}

// TestAddressIdempotent checks that an address already normalized (by a client of
// the decision API) keeps its form, and that non-addresses are left alone.
func TestAddressIdempotent(t *testing.T) {
	id := identity.Options{IPv6Prefix: 64}
	for _, peer := range []string{"192.0.2.1", "192.0.2.1:80", "[2001:db8::1]:443", "2001:db8:1:2:3:4:5:6", "::ffff:192.0.2.9"} {
		once, _ := identity.Address(peer, "", id)
		if got, _ := identity.Address(once, "", id); got != once {
			t.Errorf("Address(Address(%q) = %q) = %q, want it unchanged", peer, once, got)
		}
	}
	if got, _ := identity.Address("not an {address}", "", id); got != "not an {address}" {
		t.Errorf("Address(garbage) = %q, want it unchanged", got)
	}
	if got, _ := identity.Address("2001:db8:1:2:3::/80", "", id); got != "2001:db8:1:2::/64" {
		t.Errorf("Address(a /80) = %q, want the /64", got)
	}
}

// TestNormalizeAddressForwarded checks the X-Forwarded-For entry at the trusted
// position: an address is used, and anything else — blank, whitespace, garbage, a port
// alone, a missing entry — falls back to remote_address and says so, never to an
// empty identity that every such client would share.
func TestAddressForwarded(t *testing.T) {
	t.Parallel()
	one := identity.Options{TrustedProxies: 1, IPv6Prefix: 64}
	two := identity.Options{TrustedProxies: 2, IPv6Prefix: 64}
	tests := []struct {
		name         string
		remote, xff  string
		id           identity.Options
		want         string
		wantFellBack bool
	}{
		{"address", "10.0.0.1", "203.0.113.5, 198.51.100.7", one, "198.51.100.7", false},
		{"address with port", "10.0.0.1", "198.51.100.7:4711", one, "198.51.100.7", false},
		{"IPv6 aggregated", "10.0.0.1", "2001:db8:1:2::7", one, "2001:db8:1:2::/64", false},
		{"IPv6 in brackets with port", "10.0.0.1", "[2001:db8:1:2::7]:443", one, "2001:db8:1:2::/64", false},
		{"second from the right", "10.0.0.1", "198.51.100.7, 10.0.0.2", two, "198.51.100.7", false},
		{"no header", "192.0.2.1", "", one, "192.0.2.1", false},
		{"blank header", "192.0.2.1", " \t", one, "192.0.2.1", false},
		{"untrusted header ignored", "192.0.2.1", "198.51.100.7", identity.Options{IPv6Prefix: 64}, "192.0.2.1", false},
		{"blank last entry", "192.0.2.1", "198.51.100.7, ", one, "192.0.2.1", true},
		{"empty last entry", "192.0.2.1", "198.51.100.7,", one, "192.0.2.1", true},
		{"whitespace entry", "192.0.2.1", "198.51.100.7,  \t, 10.0.0.2", two, "192.0.2.1", true},
		{"garbage entry", "192.0.2.1", "unknown", one, "192.0.2.1", true},
		{"port only", "192.0.2.1", ":8080", one, "192.0.2.1", true},
		{"obfuscated identifier", "192.0.2.1", "_hidden", one, "192.0.2.1", true},
		{"a prefix is not an entry", "192.0.2.1", "2001:db8::/32", one, "192.0.2.1", true},
		{"too few entries", "192.0.2.1", "198.51.100.7", two, "192.0.2.1", true},
		{"fallback keeps remote's port stripped", "192.0.2.1:5000", "198.51.100.7, ", one, "192.0.2.1", true},
		{"fallback to an IPv6 remote", "[2001:db8:9:9::1]:443", "x", one, "2001:db8:9:9::/64", true},
		{"fallback to garbage remote keeps it", "not-an-ip", "x", one, "not-an-ip", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, fellBack := identity.Address(tt.remote, tt.xff, tt.id)
			if got != tt.want || fellBack != tt.wantFellBack {
				t.Errorf("Address(%q, %q, %+v) = %q, %v, want %q, %v", tt.remote, tt.xff, tt.id, got, fellBack, tt.want, tt.wantFellBack)
			}
		})
	}
}
