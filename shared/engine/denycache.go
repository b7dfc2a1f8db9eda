package engine

import (
	"sync"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
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
	rule  string
	quota string     // the limit's name in the headers
	spec  algo.Limit // the limit that denied
	d     algo.Decision
}

func newDenyCache(max int) *denyCache {
	if max <= 0 {
		max = 100000
	}
	return &denyCache{entries: make(map[string]denial), max: max}
}

func (c *denyCache) get(key string, now int64) (denial, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	d, ok := c.entries[key]
	if !ok {
		return denial{}, false
	}
	if d.until <= now {
		delete(c.entries, key)
		return denial{}, false
	}
	return d, true
}

// denies returns the denial of key at now if a request of cost would meet it: the
// deny cache's entries answer requests that cost at least as much as the one denied.
// A nil cache knows nothing.
func (c *denyCache) denies(key string, cost, now int64) (denial, bool) {
	if c == nil {
		return denial{}, false
	}
	d, ok := c.get(key, now)
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
// is still denied.
func (e *Engine) fromDenyCache(p Plan, now int64) (Verdict, bool) {
	deny := p.cur.deny
	if deny == nil || p.Check.Cost == 0 {
		return Verdict{}, false
	}
	for i, k := range p.Check.Keys {
		if p.Rules[i].Shadow {
			continue
		}
		den, ok := deny.denies(k, p.Check.Cost, now)
		if !ok {
			continue
		}
		d := den.d
		left := time.Duration(den.until-now) * time.Microsecond
		d.RetryAfter = left
		d.ResetAfter = max(d.ResetAfter-(d.RetryAfter-left), left)
		if e.hooks.DenyCacheHit != nil {
			e.hooks.DenyCacheHit()
		}
		return Verdict{
			Reason:    ReasonOverLimit,
			Cached:    true,
			NowMicros: now,
			Rule:      den.rule,
			Decision:  d,
			Limits:    []LimitResult{{Rule: den.rule, Algorithm: den.spec.Algorithm, Quota: den.quota, Spec: den.spec, Decision: d}},
		}, true
	}
	return Verdict{}, false
}

// remember puts the keys that denied a request in the deny cache, until their retry.
func (e *Engine) remember(p Plan, out algo.Outcome, now int64) {
	e.rememberIn(p.cur.deny, p, out, now)
}

// rememberIn puts the keys that denied a request in deny (if not nil), until their
// retry.
func (e *Engine) rememberIn(deny *denyCache, p Plan, out algo.Outcome, now int64) {
	if deny == nil || out.Allowed {
		return
	}
	for i, ds := range out.Decisions {
		if p.Rules[i].Shadow {
			continue
		}
		for j, d := range ds {
			if d.Allowed || d.RetryAfter <= 0 || p.Check.Cost > p.Check.Meters[i].Limits[j].Capacity() {
				// A cost above the capacity is denied whatever the state: nothing to
				// remember about the key.
				continue
			}
			// The store's clock decided; count the retry from ours.
			l := p.Check.Meters[i].Limits[j]
			deny.put(p.Check.Keys[i], denial{until: now + int64(d.RetryAfter/time.Microsecond), cost: p.Check.Cost,
				rule: p.Rules[i].Name, quota: p.Rules[i].QuotaName(l), spec: l.In(now), d: d}, now)
			break
		}
	}
}
