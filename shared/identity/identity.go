// Package identity turns the address a front door saw into the client a limit is
// keyed by: the trusted X-Forwarded-For hop instead of a proxy's address, an IPv4
// address without its port, an IPv6 address aggregated to its prefix. The engine
// does it, once, for every front door; front doors pass what they saw as it is.
package identity

import (
	"net/netip"
	"strings"
)

// DefaultIPv6Prefix is the prefix length IPv6 clients are aggregated to when Options
// names none: one client commonly holds a whole /64.
const DefaultIPv6Prefix = 64

// Options says how a client's address is derived.
type Options struct {
	// TrustedProxies is how many proxy hops in front of tollgate append to
	// X-Forwarded-For and can be trusted. Default 0: the socket or event address wins.
	TrustedProxies int
	// IPv6Prefix is the prefix length IPv6 client addresses are aggregated to, 1 to
	// 128. Default (or out of range) DefaultIPv6Prefix.
	IPv6Prefix int
}

// Address returns the client address a request is limited by, from remote (the
// socket's peer or an API Gateway event's source IP, with or without a port:
// "192.0.2.1:5678", "[2001:db8::1]:443") and xff (the X-Forwarded-For header, several
// headers joined with ',').
//
// With o.TrustedProxies = N > 0 the address is the N-th entry from the right of xff,
// the one the outermost trusted proxy saw; with N = 0 xff is ignored, since a client
// can write anything there. Where that entry is missing, blank or not an address,
// remote is used instead and fellBack is true — a header was sent but is unusable, so
// clients behind a broken proxy would share one identity — for callers to count.
//
// An IPv4 address (IPv4-mapped IPv6 included) is returned without a port. An IPv6
// address is aggregated to o.IPv6Prefix bits and written in prefix form,
// "2001:db8:1:2::/64". A value already in that form keeps it, so a client of the
// decision API may send either. Anything else is returned as it is: the key builder
// escapes it, so it can never pass for a valid address.
func Address(remote, xff string, o Options) (addr string, fellBack bool) {
	s := remote
	hop, fellBack := trustedHop(xff, o)
	if hop != "" {
		s = hop
	}
	if a, ok := parseAddr(strings.TrimSpace(s)); ok {
		a = a.WithZone("").Unmap()
		if a.Is4() {
			return a.String(), fellBack
		}
		if p, err := a.Prefix(prefixBits(o)); err == nil {
			return p.String(), fellBack
		}
		return s, fellBack
	}
	if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is6() && !p.Addr().Is4In6() {
		bits := prefixBits(o)
		if p.Bits() > bits {
			p = netip.PrefixFrom(p.Addr(), bits)
		}
		return p.Masked().String(), fellBack
	}
	return s, fellBack
}

// trustedHop returns the X-Forwarded-For entry that stands for the client, trimmed,
// or "" when remote must be used: xff is blank or there is no proxy to trust
// (fellBack false), or the entry at the trusted position is missing, blank or not an
// address (fellBack true).
func trustedHop(xff string, o Options) (hop string, fellBack bool) {
	if o.TrustedProxies <= 0 || strings.TrimSpace(xff) == "" {
		return "", false
	}
	e, ok := fromRight(xff, o.TrustedProxies)
	if !ok {
		return "", true
	}
	e = strings.TrimSpace(e)
	if _, ok := parseAddr(e); !ok {
		return "", true
	}
	return e, false
}

// prefixBits is o.IPv6Prefix, or DefaultIPv6Prefix where it is out of 1..128.
func prefixBits(o Options) int {
	if o.IPv6Prefix < 1 || o.IPv6Prefix > 128 {
		return DefaultIPv6Prefix
	}
	return o.IPv6Prefix
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
