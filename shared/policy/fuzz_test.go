package policy_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// FuzzParse checks that Parse never panics, that it returns either a policy or a
// *ValidationError with problems, and that every policy it accepts compiles to meters
// that algo accepts and keys that stay in their hash tag. The seed corpus is in
// testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := policy.Parse(data)
		if err != nil {
			if p != nil {
				t.Fatalf("Parse() = %v, %v; want a nil policy with the error", p, err)
			}
			ve, ok := errors.AsType[*policy.ValidationError](err)
			if !ok || len(ve.Problems) == 0 {
				t.Fatalf("Parse() error = %#v, want a *ValidationError with problems", err)
			}
			for _, pr := range ve.Problems {
				if pr.Msg == "" {
					t.Fatalf("Parse() problem %+v has no message", pr)
				}
			}
			return
		}
		if p == nil || p.Domain == "" || len(p.Rules) == 0 {
			t.Fatalf("Parse() = %+v, nil; want a policy with a domain and rules", p)
		}
		// A request that carries every attribute with the value each rule wants, and
		// one with hostile values.
		exact, wild := map[string]string{}, map[string]string{}
		for _, a := range p.Attributes() {
			wild[a] = "{x}:\n"
		}
		for _, r := range p.Rules {
			for _, m := range r.Meters {
				if err := m.Validate(); err != nil {
					t.Fatalf("rule %s: meter %v: Validate() = %v", r.Name, m, err)
				}
			}
			for a, v := range r.Match {
				exact[a] = v
			}
		}
		for _, attrs := range []map[string]string{exact, wild} {
			for _, m := range p.Match(attrs) {
				if len(m.Keys) != len(m.Meters) || len(m.Keys) != len(m.Rule.Meters) {
					t.Fatalf("Match(%q) rule %s: %d keys, %d meters, want %d each", attrs, m.Rule.Name, len(m.Keys), len(m.Meters), len(m.Rule.Meters))
				}
				for _, k := range m.Keys {
					tag := algo.HashTag(k)
					if !strings.HasPrefix(k, p.Prefix+"{"+tag+"}"+m.Rule.Name+":") {
						t.Fatalf("Match(%q) rule %s: key %q does not start with prefix, tag and rule", attrs, m.Rule.Name, k)
					}
				}
			}
		}
	})
}

// FuzzClientAddress checks that ClientAddress never panics and returns either a
// canonical IPv4 address, an IPv6 prefix of the configured length, or an escaped value
// that can be neither.
func FuzzClientAddress(f *testing.F) {
	f.Fuzz(func(t *testing.T, peer, xff string, trusted, bits int) {
		id := policy.Identity{TrustedProxies: trusted, IPv6Prefix: bits}
		got := policy.ClientAddress(peer, xff, id)
		if got == "" {
			t.Fatalf("ClientAddress(%q, %q, %+v) = %q, want an address", peer, xff, id, got)
		}
		if a, err := netip.ParseAddr(got); err == nil {
			if !a.Is4() || a.String() != got {
				t.Fatalf("ClientAddress(%q, %q, %+v) = %q, want a canonical IPv4 address", peer, xff, id, got)
			}
			return
		}
		if pfx, err := netip.ParsePrefix(got); err == nil {
			want := bits
			if want < 1 || want > 128 {
				want = 64
			}
			if !pfx.Addr().Is6() || pfx.Addr().Is4In6() || pfx.Bits() != want || pfx.Masked() != pfx || pfx.String() != got {
				t.Fatalf("ClientAddress(%q, %q, %+v) = %q, want a canonical IPv6 /%d prefix", peer, xff, id, got, want)
			}
			return
		}
		if strings.ContainsAny(got, ":{} \n") {
			t.Fatalf("ClientAddress(%q, %q, %+v) = %q, want an escaped value", peer, xff, id, got)
		}
	})
}

// FuzzNormalizeAddress checks that NormalizeAddress never panics, never turns a
// non-empty remote_address into an empty identity, reports a fallback exactly when
// the trusted X-Forwarded-For entry was unusable, and gives what ClientAddress gives
// for an address. The seed corpus is in testdata/fuzz/FuzzNormalizeAddress.
func FuzzNormalizeAddress(f *testing.F) {
	f.Fuzz(func(t *testing.T, remote, xff string, trusted, bits int) {
		id := policy.Identity{TrustedProxies: trusted, IPv6Prefix: bits}
		got, fellBack := policy.NormalizeAddress(remote, xff, id)
		if got == "" && strings.TrimSpace(remote) != "" {
			t.Fatalf("NormalizeAddress(%q, %q, %+v) = %q, want a non-empty identity", remote, xff, id, got)
		}
		hop, hopFellBack := policy.TrustedHop(xff, id)
		if fellBack != hopFellBack {
			t.Fatalf("NormalizeAddress(%q, %q, %+v) fell back = %v, want %v as TrustedHop says", remote, xff, id, fellBack, hopFellBack)
		}
		if hop != "" && fellBack {
			t.Fatalf("TrustedHop(%q, %+v) = %q, true, want no entry with a fallback", xff, id, hop)
		}
		if _, err := netip.ParseAddr(got); err == nil || isPrefix(got) {
			if want := policy.ClientAddress(remote, xff, id); want != got && !isPrefix(remote) {
				t.Fatalf("NormalizeAddress(%q, %q, %+v) = %q, want %q as ClientAddress gives", remote, xff, id, got, want)
			}
		}
	})
}

func isPrefix(s string) bool {
	_, err := netip.ParsePrefix(s)
	return err == nil
}
