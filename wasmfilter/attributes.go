package main

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/jsonv"
)

// A value is one attribute of a request: its name and value.
type value struct {
	name, value string
}

// requestInfo is what the attributes are read from: the request headers (lower-case
// names, pseudo-headers included) and the client address.
type requestInfo struct {
	headers [][2]string
	// sourceAddress is Envoy's source.address property, host and port.
	sourceAddress string
}

func (r requestInfo) header(name string) (string, bool) {
	for _, h := range r.headers {
		if h[0] == name {
			return h[1], true
		}
	}
	return "", false
}

// buildAttributes reads the configured attributes of a request. Attributes the request
// does not carry are left out. An oversize value is truncated, or, when the
// configuration says reject, its name is returned as tooLong and attrs is nil.
func buildAttributes(c *config, r requestInfo) (attrs []value, tooLong string) {
	attrs = make([]value, 0, len(c.attributes))
	for _, a := range c.attributes {
		var v string
		var ok bool
		switch a.from {
		case fromHeader:
			v, ok = r.header(a.header)
		case fromSourceAddress:
			v, ok = hostOnly(r.sourceAddress), r.sourceAddress != ""
		case fromPath:
			v, ok = r.header(":path")
			if i := strings.IndexAny(v, "?#"); i >= 0 {
				v = v[:i]
			}
		case fromPathWithQuery:
			v, ok = r.header(":path")
		case fromMethod:
			v, ok = r.header(":method")
		}
		if !ok || v == "" {
			continue
		}
		if len(v) > c.maxAttributeBytes {
			if c.oversize == oversizeReject {
				return nil, a.name
			}
			v = truncateUTF8(v, c.maxAttributeBytes)
		}
		attrs = append(attrs, value{a.name, v})
	}
	return attrs, ""
}

// hostOnly strips the port from an address such as "10.0.0.1:5678" or "[::1]:80".
// An address without a port is returned as it is.
func hostOnly(addr string) string {
	if strings.HasPrefix(addr, "[") {
		if i := strings.IndexByte(addr, ']'); i > 0 {
			return addr[1:i]
		}
		return addr
	}
	if i := strings.LastIndexByte(addr, ':'); i >= 0 && strings.IndexByte(addr, ':') == i {
		return addr[:i]
	}
	return addr
}

// truncateUTF8 cuts s to at most n bytes without splitting a UTF-8 sequence.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	i := n
	for i > 0 && i > n-utf8.UTFMax+1 && !utf8.RuneStart(s[i]) {
		i--
	}
	return s[:i]
}

// lookup returns the value of the named attribute.
func lookup(attrs []value, name string) (string, bool) {
	for _, a := range attrs {
		if a.name == name {
			return a.value, true
		}
	}
	return "", false
}

// pickAll returns the attributes named in names, in that order, or false when attrs
// lacks one of them.
func pickAll(attrs []value, names []string) ([]value, bool) {
	kv := make([]value, 0, len(names))
	for _, name := range names {
		v, found := lookup(attrs, name)
		if !found {
			return nil, false
		}
		kv = append(kv, value{name, v})
	}
	return kv, true
}

// checkBody writes the decision request:
// {"domain": D, "attributes": {NAME: VALUE, ...}, "cost": N}.
func checkBody(domain string, attrs []value, cost int64) []byte {
	return checkRequest{domain: domain, attrs: attrs, cost: cost}.body()
}

// A checkRequest is one POST /v1/check: a decision, a reservation (reserveID), or a
// settlement (settle, with reserveID when it settles a reservation).
type checkRequest struct {
	domain     string
	attrs      []value
	cost       int64
	settle     bool
	reserveID  string
	reserveTTL time.Duration // with a reservation; 0: the service's default
}

// body writes the request as JSON: {"domain": D, "attributes": {NAME: VALUE, ...},
// "cost": N}, then "settle": true, "reserve_id" and "reserve_ttl_ms" when set.
func (r checkRequest) body() []byte {
	n := 48 + len(r.domain) + len(r.reserveID)
	for _, a := range r.attrs {
		n += len(a.name) + len(a.value) + 8
	}
	if r.settle || r.reserveID != "" {
		n += 64
	}
	b := make([]byte, 0, n)
	b = append(b, `{"domain":`...)
	b = jsonv.AppendString(b, r.domain, false)
	b = append(b, `,"attributes":`...)
	b = appendJSONObject(b, r.attrs)
	b = append(b, `,"cost":`...)
	b = strconv.AppendInt(b, r.cost, 10)
	if r.settle {
		b = append(b, `,"settle":true`...)
	}
	if r.reserveID != "" {
		b = append(b, `,"reserve_id":`...)
		b = jsonv.AppendString(b, r.reserveID, false)
		if !r.settle && r.reserveTTL > 0 {
			b = append(b, `,"reserve_ttl_ms":`...)
			b = strconv.AppendInt(b, r.reserveTTL.Milliseconds(), 10)
		}
	}
	return append(b, '}')
}

// appendJSONObject appends attrs as a JSON object of strings, in order.
func appendJSONObject(b []byte, attrs []value) []byte {
	b = append(b, '{')
	for i, a := range attrs {
		if i > 0 {
			b = append(b, ',')
		}
		b = jsonv.AppendString(b, a.name, false)
		b = append(b, ':')
		b = jsonv.AppendString(b, a.value, false)
	}
	return append(b, '}')
}
