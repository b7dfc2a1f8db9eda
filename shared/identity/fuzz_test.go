package identity_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/identity"
)

// FuzzAddress checks that Address never panics, never turns a non-empty remote
// address into an empty identity, reports a fallback only when a trusted proxy is
// configured and a header was sent, and returns what it changed in one canonical
// form: an IPv4 address, or an IPv6 prefix of at most the configured length. Its seed corpus is in
// testdata/fuzz/FuzzAddress.
func FuzzAddress(f *testing.F) {
	f.Add("192.0.2.1:5678", "203.0.113.5, 198.51.100.7", 1, 64)
	f.Add("[2001:db8:1:2::7]:443", "", 0, 48)
	f.Fuzz(func(t *testing.T, remote, xff string, trusted, bits int) {
		o := identity.Options{TrustedProxies: trusted, IPv6Prefix: bits}
		got, fellBack := identity.Address(remote, xff, o)
		if got == "" && strings.TrimSpace(remote) != "" {
			t.Fatalf("Address(%q, %q, %+v) = %q, want a non-empty identity", remote, xff, o, got)
		}
		if fellBack && (trusted <= 0 || strings.TrimSpace(xff) == "") {
			t.Fatalf("Address(%q, %q, %+v) fell back without a trusted header", remote, xff, o)
		}
		if again, _ := identity.Address(got, "", o); again != got && canonical(got, bits) {
			t.Fatalf("Address(%q) = %q, want a normalized address unchanged", got, again)
		}
		// A value that is no address comes back as it is; one that changed was
		// normalized and must be in canonical form.
		if got != remote && !canonical(got, bits) {
			t.Fatalf("Address(%q, %q, %+v) = %q, want a canonical IPv4 address or IPv6 prefix of at most /%d", remote, xff, o, got, want(bits))
		}
	})
}

func want(bits int) int {
	if bits < 1 || bits > 128 {
		return identity.DefaultIPv6Prefix
	}
	return bits
}

// canonical reports whether s is what Address returns for an address: a canonical
// IPv4 address or a masked IPv6 prefix of at most want(bits) bits.
func canonical(s string, bits int) bool {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Is4() && a.String() == s
	}
	p, err := netip.ParsePrefix(s)
	return err == nil && p.Addr().Is6() && !p.Addr().Is4In6() && p.Bits() <= want(bits) && p.Masked() == p && p.String() == s
}
