package main

import (
	"context"
	"strconv"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/memstore"
)

// A localVerdict is the answer of the local limits to one request.
type localVerdict struct {
	allowed bool
	// name and decision are the most restrictive limit's (algo.MostRestrictive, the
	// fold the decision service's verdict comes from). Empty name: no limit applied.
	name     string
	decision algo.Decision
	// quotas are every limit's decision, for the RateLimit headers; deciding is the
	// index of the most restrictive.
	quotas   []algo.Quota
	deciding int
	delay    time.Duration
}

// localLimiter decides the local limits with the Go models of shared/algo, in the VM's
// memory: each Envoy worker has its own VM and so its own counts.
type localLimiter struct {
	limits []localLimit
	store  *memstore.Store
}

func newLocalLimiter(c *config, clock func() time.Time) *localLimiter {
	if len(c.localLimits) == 0 {
		return nil
	}
	return &localLimiter{limits: c.localLimits, store: memstore.New(c.localMaxKeys, clock)}
}

// decide charges cost on every local limit whose key attributes the request carries,
// all or nothing.
func (l *localLimiter) decide(attrs []value, cost int64, now time.Time) localVerdict {
	check := algo.Check{Cost: cost, NowMicros: now.UnixMicro()}
	var applied []localLimit
	for _, lim := range l.limits {
		key, ok := localKey(lim, attrs)
		if !ok {
			continue
		}
		check.Keys = append(check.Keys, key)
		check.Meters = append(check.Meters, lim.meter)
		applied = append(applied, lim)
	}
	if len(applied) == 0 {
		return localVerdict{allowed: true}
	}
	out, err := l.store.Decide(context.Background(), check)
	if err != nil {
		// Only a malformed check fails, and decide builds none: admit.
		return localVerdict{allowed: true}
	}
	v := localVerdict{allowed: out.Allowed}
	var owner []string // the name of the limit of each quota
	for i, ds := range out.Decisions {
		for j, d := range ds {
			v.delay = max(v.delay, d.Delay)
			name := applied[i].name
			if len(ds) > 1 {
				name += "." + strconv.Itoa(j+1)
			}
			v.quotas = append(v.quotas, algo.Quota{Name: name, Limit: applied[i].meter.Limits[j], Decision: d})
			owner = append(owner, applied[i].name)
		}
	}
	if k := algo.MostRestrictive(len(v.quotas), func(k int) (algo.Decision, bool) { return v.quotas[k].Decision, true }); k >= 0 {
		v.name, v.decision, v.deciding = owner[k], v.quotas[k].Decision, k
	}
	if !out.Allowed {
		v.delay = 0
	}
	return v
}

// localKey is the store key of limit lim for a request: the limit's name and the
// values of its key attributes. ok is false when the request lacks one of them.
func localKey(lim localLimit, attrs []value) (key string, ok bool) {
	kv, ok := pickAll(attrs, lim.key)
	if !ok {
		return "", false
	}
	b := append([]byte(lim.name), ':')
	return string(appendJSONObject(b, kv)), true
}
