package engine

import (
	"sync"
	"time"
)

// denyCache remembers store keys that denied, until the time their request could be
// admitted again, so a blocked client's requests are answered without the store. An
// entry answers only requests that cost at least as much as the one denied: a cheaper
// request may still fit, and goes to the store. It
// holds at most max entries; when full, the expired entries of a bounded sample are
// dropped, and if none had expired the new entry is not kept (the store still decides
// correctly).
type denyCache struct {
	mu      sync.Mutex
	entries map[string]denial
	max     int
}

type denial struct {
	until int64 // Unix µs
	cost  int64 // the denied request's cost
	// seen is what the request denied at this key learned of every key it reached.
	seen *seen
}

// seen is what one denied request learned: every limit's result, by key, at the
// time it was decided (our clock). A denial charges nothing, so until a limit
// resets its result stands for the next request of the same keys, as far as this
// instance knows.
type seen struct {
	at     int64 // Unix µs
	byKey  map[string][]LimitResult
	denied string // the key of the deciding denial
}

func newDenyCache(max int) *denyCache {
	if max <= 0 {
		max = 100000
	}
	return &denyCache{entries: make(map[string]denial), max: max}
}

// denies returns the denial of key at now if a request of cost would meet it: the
// deny cache's entries answer requests that cost at least as much as the one denied.
// An expired entry is dropped. A nil cache knows nothing.
func (c *denyCache) denies(key string, cost, now int64) (denial, bool) {
	if c == nil {
		return denial{}, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.entries[key]
	if ok && d.until <= now {
		delete(c.entries, key)
		ok = false
	}
	if !ok || cost < d.cost {
		return denial{}, false
	}
	return d, true
}

func (c *denyCache) put(key string, d denial, now int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; !ok && len(c.entries) >= c.max {
		seen := 0
		for k, e := range c.entries {
			if seen++; seen > 64 {
				break
			}
			if e.until <= now {
				delete(c.entries, k)
			}
		}
		if len(c.entries) >= c.max {
			return
		}
	}
	c.entries[key] = d
}

func (c *denyCache) forget(keys []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, k := range keys {
		delete(c.entries, k)
	}
}

// fromDenyCache answers a request from the deny cache when one of its non-shadow keys
// is still denied and the cache knows every limit of the request: a result per
// limit, as the store would give it, with the denial's retry counted down. A request
// that reaches a key the denied one did not, or a limit that has reset since, goes
// to the store.
func (e *Engine) fromDenyCache(p Plan, now int64) (Verdict, bool) {
	deny := p.cur.deny
	if deny == nil || p.Cost == 0 {
		return Verdict{}, false
	}
	for _, it := range p.Items {
		if it.Rule.Shadow {
			continue
		}
		den, ok := deny.denies(it.Key, p.Cost, now)
		if !ok {
			continue
		}
		v, ok := den.verdict(p, now)
		if !ok {
			return Verdict{}, false
		}
		if e.hooks.DenyCacheHit != nil {
			e.hooks.DenyCacheHit()
		}
		return v, true
	}
	return Verdict{}, false
}

// verdict answers plan p at now from what the denial saw, or reports false when it
// did not see every item of p or one of them has reset since.
func (den denial) verdict(p Plan, now int64) (Verdict, bool) {
	s := den.seen
	left := time.Duration(den.until-now) * time.Microsecond
	since := time.Duration(now-s.at) * time.Microsecond
	v := Verdict{Cached: true, NowMicros: now, Limits: make([]LimitResult, 0, len(p.Items))}
	for i, it := range p.Items {
		rs, ok := s.byKey[it.Key]
		if !ok || len(rs) != len(it.Meter.Limits) {
			return Verdict{}, false
		}
		for _, r := range rs {
			if r.ResetAfter <= since && it.Key != s.denied {
				return Verdict{}, false
			}
			r.Item = i
			switch {
			case it.Key == s.denied && !r.Allowed:
				r.RetryAfter = left
				r.ResetAfter = max(r.ResetAfter-since, left)
			default:
				r.RetryAfter = max(0, r.RetryAfter-since)
				r.ResetAfter = max(0, r.ResetAfter-since)
			}
			v.Limits = append(v.Limits, r)
		}
	}
	v.summarize(false)
	return v, true
}

// remember puts the key whose limit denied verdict v of plan p in the cache (if not
// nil), until its retry, with what v says of every key of p.
func (c *denyCache) remember(p Plan, v Verdict, now int64) {
	if c == nil || v.Allowed {
		return
	}
	for _, l := range v.Limits {
		if l.Shadow || l.Allowed || l.RetryAfter <= 0 || p.Cost > l.Spec.Capacity() {
			// A cost above the capacity is denied whatever the state: nothing to
			// remember about the key.
			continue
		}
		key := p.Items[l.Item].Key
		s := &seen{at: now, byKey: make(map[string][]LimitResult, len(p.Items)), denied: key}
		for _, r := range v.Limits {
			k := p.Items[r.Item].Key
			s.byKey[k] = append(s.byKey[k], r)
		}
		// The store's clock decided; count the retry from ours.
		c.put(key, denial{until: now + int64(l.RetryAfter/time.Microsecond), cost: p.Cost, seen: s}, now)
		return
	}
}
