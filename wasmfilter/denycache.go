package main

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm"
	"github.com/proxy-wasm/proxy-wasm-go-sdk/proxywasm/types"
)

// The deny cache remembers clients the decision service denied, in Envoy's shared data
// (one store per vm_id, shared by every worker's VM), so that a blocked client is
// answered 429 locally until its retry time instead of costing a callout per request.
//
// Shared data has no expiry, no deletion and no listing, so the cache is a
// direct-mapped table: a client's identity hashes to one of max_entries slots, each a
// shared-data key holding one entry with its own expiry. A new denial overwrites its
// slot, which bounds the cache at max_entries keys; a client whose slot was taken by
// another only costs callouts again. Writes use the key's CAS, so two workers that
// race on one slot cannot lose the longer-lived entry of the same client.

// A denyEntry is one cached denial.
type denyEntry struct {
	identity string
	until    int64 // when the client may retry, Unix milliseconds
	stored   int64 // when the denial was cached, Unix milliseconds
	rule     string
	// The service's headers, as received.
	policy, limit, xLimit, xReset string
}

const denyEntryVersion = "tg1"

func (e denyEntry) encode() []byte {
	fields := []string{
		denyEntryVersion,
		strconv.FormatInt(e.until, 10),
		strconv.FormatInt(e.stored, 10),
		e.identity, e.rule, e.policy, e.limit, e.xLimit, e.xReset,
	}
	for i, f := range fields {
		fields[i] = strings.ReplaceAll(f, "\n", " ")
	}
	return []byte(strings.Join(fields, "\n"))
}

func decodeDenyEntry(b []byte) (denyEntry, bool) {
	f := strings.Split(string(b), "\n")
	if len(f) != 9 || f[0] != denyEntryVersion {
		return denyEntry{}, false
	}
	until, err1 := strconv.ParseInt(f[1], 10, 64)
	stored, err2 := strconv.ParseInt(f[2], 10, 64)
	if err1 != nil || err2 != nil {
		return denyEntry{}, false
	}
	return denyEntry{identity: f[3], until: until, stored: stored, rule: f[4], policy: f[5], limit: f[6], xLimit: f[7], xReset: f[8]}, true
}

// A denyCache reads and writes cached denials of one domain.
type denyCache struct {
	prefix string
	slots  uint64
}

func newDenyCache(domain string, entries int) *denyCache {
	return &denyCache{prefix: "tollgate.deny/" + domain + "/", slots: uint64(entries)}
}

func (c *denyCache) key(identity string) string {
	return c.prefix + strconv.FormatUint(fnv64a(identity)%c.slots, 10)
}

// lookup returns the live denial of identity at now, if one is cached.
func (c *denyCache) lookup(identity string, now time.Time) (denyEntry, bool) {
	b, _, err := proxywasm.GetSharedData(c.key(identity))
	if err != nil {
		return denyEntry{}, false
	}
	e, ok := decodeDenyEntry(b)
	if !ok || e.identity != identity || e.until <= now.UnixMilli() {
		return denyEntry{}, false
	}
	return e, true
}

// store caches e. It keeps a live entry of the same client that lasts longer, and
// retries once when another VM wrote the slot between the read and the write.
func (c *denyCache) store(e denyEntry) error {
	key := c.key(e.identity)
	for attempt := 0; ; attempt++ {
		b, cas, err := proxywasm.GetSharedData(key)
		switch {
		case errors.Is(err, types.ErrorStatusNotFound):
			cas = 0
		case err != nil:
			return err
		default:
			if old, ok := decodeDenyEntry(b); ok && old.identity == e.identity && old.until >= e.until {
				return nil
			}
		}
		err = proxywasm.SetSharedData(key, e.encode(), cas)
		if err == nil || !errors.Is(err, types.ErrorStatusCasMismatch) || attempt == 1 {
			return err
		}
	}
}

// headers returns the 429 headers of a cached denial at now: Retry-After counts down to
// the cached retry time, and the reset times of the service's headers are aged by the
// time the entry has been cached.
func (e denyEntry) headers(now time.Time) [][2]string {
	ms := now.UnixMilli()
	retry := (e.until - ms + 999) / 1000
	if retry < 1 {
		retry = 1
	}
	elapsed := max(0, (ms-e.stored)/1000)
	h := [][2]string{{"retry-after", strconv.FormatInt(retry, 10)}}
	if e.policy != "" {
		h = append(h, [2]string{"ratelimit-policy", e.policy})
	}
	if e.limit != "" {
		h = append(h, [2]string{"ratelimit", ageLimitHeader(e.limit, elapsed)})
	}
	if e.xLimit != "" {
		h = append(h, [2]string{"x-ratelimit-limit", e.xLimit}, [2]string{"x-ratelimit-remaining", "0"})
	}
	if e.xReset != "" {
		if n, err := strconv.ParseInt(e.xReset, 10, 64); err == nil {
			h = append(h, [2]string{"x-ratelimit-reset", strconv.FormatInt(max(0, n-elapsed), 10)})
		}
	}
	return h
}

// ageLimitHeader subtracts elapsed seconds from every t parameter of a RateLimit
// header value such as `"per-key";r=0;t=17`, stopping at zero.
func ageLimitHeader(v string, elapsed int64) string {
	if elapsed <= 0 {
		return v
	}
	var b strings.Builder
	for {
		i := strings.Index(v, ";t=")
		if i < 0 {
			b.WriteString(v)
			return b.String()
		}
		b.WriteString(v[:i+3])
		v = v[i+3:]
		j := 0
		for j < len(v) && v[j] >= '0' && v[j] <= '9' {
			j++
		}
		if n, err := strconv.ParseInt(v[:j], 10, 64); err == nil {
			b.WriteString(strconv.FormatInt(max(0, n-elapsed), 10))
		} else {
			b.WriteString(v[:j])
		}
		v = v[j:]
	}
}

// fnv64a is the 64-bit FNV-1a hash of s.
func fnv64a(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}
