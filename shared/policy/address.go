package policy

import (
	"net/netip"
	"strings"

	"github.com/tollgate-dev/tollgate/shared/algo"
)

// ClientAddress returns the address a client is limited by, its remote_address
// attribute.
//
// peer is the address tollgate sees: the socket's remote address, or the source IP of
// an API Gateway event; it may carry a port ("192.0.2.1:5678", "[2001:db8::1]:443").
// xff is the X-Forwarded-For header, several headers joined with ','. With
// id.TrustedProxies = N > 0 the address is the N-th entry from the right of xff, the
// one the outermost trusted proxy saw; with N = 0 xff is ignored, since a client can
// write anything there. Where that entry is missing (xff has fewer than N entries),
// blank, or not an address, peer is used instead (see TrustedHop).
//
// An IPv4 address (IPv4-mapped IPv6 included) is returned as it is, without a port.
// An IPv6 address is aggregated to id.IPv6Prefix bits (64 if it is out of 1..128) and
// written in prefix form, "2001:db8:1:2::/64", because one client commonly holds a
// whole /64. Anything that is not an address is returned as algo.Escape makes it, so
// it can never pass for a valid address.
func ClientAddress(peer, xff string, id Identity) string {
	s := peer
	if hop, _ := TrustedHop(xff, id); hop != "" {
		s = hop
	}
	s = strings.TrimSpace(s)
	a, ok := parseAddr(s)
	if !ok {
		return algo.Escape(s)
	}
	if agg, ok := aggregate(a, id); ok {
		return agg
	}
	return algo.Escape(s)
}

// TrustedHop returns the X-Forwarded-For entry that stands for the client: with
// id.TrustedProxies = N > 0, the N-th entry from the right of xff, trimmed, when it is
// an IP address (with or without a port). It returns "" when the caller must use the
// socket or event address instead: xff is blank or N is 0 (no proxy to trust), or the
// entry at the trusted position is missing, blank or not an address. fellBack reports
// the second kind — a header was sent but its trusted entry is unusable, so clients
// behind a broken proxy would otherwise share one identity — for callers to count.
func TrustedHop(xff string, id Identity) (hop string, fellBack bool) {
	if id.TrustedProxies <= 0 || strings.TrimSpace(xff) == "" {
		return "", false
	}
	e, ok := fromRight(xff, id.TrustedProxies)
	if !ok {
		return "", true
	}
	e = strings.TrimSpace(e)
	if _, ok := parseAddr(e); !ok {
		return "", true
	}
	return e, false
}

// aggregate writes an address as the client it stands for: IPv4 (mapped IPv6
// included) as it is, IPv6 as its prefix of id.IPv6Prefix bits.
func aggregate(a netip.Addr, id Identity) (string, bool) {
	a = a.WithZone("").Unmap()
	if a.Is4() {
		return a.String(), true
	}
	p, err := a.Prefix(prefixBits(id))
	if err != nil {
		return "", false
	}
	return p.String(), true
}

// prefixBits is id.IPv6Prefix, or DefaultIPv6Prefix where it is out of 1..128.
func prefixBits(id Identity) int {
	if id.IPv6Prefix < 1 || id.IPv6Prefix > 128 {
		return DefaultIPv6Prefix
	}
	return id.IPv6Prefix
}

// NormalizeAddress returns the remote_address attribute a front door sent, in the form
// ClientAddress gives: the trusted X-Forwarded-For entry when TrustedHop finds one,
// else remote; then an IPv4 address without its port, and an IPv6 address aggregated
// to id.IPv6Prefix bits. A value already in that form (a prefix such as
// "2001:db8:1:2::/64") keeps it, so normalizing twice changes nothing; a value that is
// no address is returned unchanged (the key builder escapes it). fellBack is
// TrustedHop's: xff was sent but its trusted entry was unusable, so remote was used.
func NormalizeAddress(remote, xff string, id Identity) (addr string, fellBack bool) {
	s := remote
	hop, fellBack := TrustedHop(xff, id)
	if hop != "" {
		s = hop
	}
	if a, ok := parseAddr(strings.TrimSpace(s)); ok {
		if agg, ok := aggregate(a, id); ok {
			return agg, fellBack
		}
		return s, fellBack
	}
	if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
		bits := prefixBits(id)
		if p.Bits() > bits {
			p = netip.PrefixFrom(p.Addr(), bits)
		}
		return p.Masked().String(), fellBack
	}
	return s, fellBack
}

// fromRight returns the n-th (n >= 1) comma-separated entry of list counted from the
// right, or false if list has fewer entries.
func fromRight(list string, n int) (string, bool) {
	end := len(list)
	for i := 1; ; i++ {
		start := strings.LastIndexByte(list[:end], ',') + 1
		if i == n {
			return list[start:end], true
		}
		if start == 0 {
			return "", false
		}
		end = start - 1
	}
}

// parseAddr parses an IP address with or without a port or brackets.
func parseAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a, true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a, true
		}
	}
	return netip.Addr{}, false
}
