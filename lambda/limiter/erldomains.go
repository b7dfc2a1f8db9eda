package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/reload"
	"github.com/tollgate-dev/tollgate/shared/rls"
)

// An erlSet is the envoyproxy/ratelimit (ERL) configuration of a directory: every
// file translated (package erl) and validated, one policy per domain. A reload
// applies a whole set or none of it.
type erlSet struct {
	domains map[string]erlDomain
}

// An erlDomain is one domain of an erlSet.
type erlDomain struct {
	tr     erl.Translation
	policy *policy.Policy
}

// parseERLDir reads a directory's document (reload.Dir) into an erlSet: its files
// translated together as ERL loads a directory (erl.TranslateFiles; merge is ERL's
// MERGE_DOMAIN_CONFIG). Any file's problem refuses the set, naming the file.
func parseERLDir(doc []byte, merge bool) (erlSet, error) {
	dir, err := reload.DecodeDir(doc)
	if err != nil {
		return erlSet{}, err
	}
	files := make([]erl.File, len(dir))
	for i, f := range dir {
		files[i] = erl.File{Name: f.Name, Data: f.Data}
	}
	trs, err := erl.TranslateFiles(files, merge)
	if err != nil {
		return erlSet{}, err
	}
	set := erlSet{domains: map[string]erlDomain{}}
	for _, tr := range trs {
		p, err := policy.Parse(tr.Policy)
		if err != nil {
			return erlSet{}, fmt.Errorf("domain %q: %w", tr.Domain, err)
		}
		set.domains[tr.Domain] = erlDomain{tr: tr, policy: p}
	}
	return set, nil
}

// erlDomains serves the domains of an ERL configuration directory over gRPC and
// POST /json, and applies its reloads. Each set gets engines of its own, built before
// it serves: the set of domains, each domain's limits and its translation of
// descriptors change together, at once, between two requests. The limits' state is
// in the store, keyed by what the limit is, so a domain that stays keeps the counts
// of the limits that stay. One rls.Server serves every set, so that its settings and
// its metric last across reloads.
type erlDomains struct {
	rlsv3.UnimplementedRateLimitServiceServer
	store engine.Store
	hooks engine.Hooks
	log   *slog.Logger
	rls   *rls.Server
	json  http.Handler // rls's POST /json
	// own is the engine of the service's own policy, which decides its domain
	// (ownDomain) even when a file names it too; nil when no policy was named.
	own       *engine.Engine
	ownDomain string

	mu      sync.Mutex // serializes apply
	engines map[string]*engine.Engine
	last    erlSet       // the set serving now
	served  atomic.Int64 // the directory's domains served
}

// newERLDomains returns the service of ERL domains on store, with none yet (apply
// gives it its first set). configure sets the rls.Server's fields before it serves.
func newERLDomains(store engine.Store, hooks engine.Hooks, log *slog.Logger, configure func(*rls.Server)) *erlDomains {
	srv := rls.NewDomains(nil, log)
	configure(srv)
	return &erlDomains{store: store, hooks: hooks, log: log, rls: srv, json: srv.JSONHandler()}
}

// apply makes set the domains served from the next request on, all at once: new
// engines for every domain of set, swapped in with their translations by one
// rls.SetDomains. An error leaves the running set as it is. The engines of the
// previous set then give back the units their leases hold; a request already
// deciding on one of them may still take a lease, whose units then stay charged
// until its window ends.
func (d *erlDomains) apply(set erlSet) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	engines := map[string]*engine.Engine{}
	serve := map[string]rls.Domain{}
	for name, dom := range set.domains {
		if d.own != nil && name == d.ownDomain {
			d.log.Warn("envoyproxy/ratelimit domain decided by the policy instead", "domain", name)
			continue
		}
		eng, err := engine.New(engine.Config{Policy: dom.policy, Store: d.store, Logger: d.log, Hooks: d.hooks, KeepStoreBreakers: true})
		if err != nil {
			return fmt.Errorf("domain %q: %w", name, err)
		}
		if old, ok := d.engines[name]; ok {
			if fresh := policy.Fresh(old.Policy(), dom.policy); len(fresh) > 0 {
				d.log.Info("the new configuration starts these limits afresh: their algorithm, period or key changed, so their state does not carry over", "domain", name, "limits", fresh)
			}
		}
		engines[name] = eng
		serve[name] = rls.ERLDomain(dom.tr, eng)
	}
	if d.own != nil {
		serve[d.ownDomain] = rls.Domain{Engine: d.own}
	}
	d.rls.SetDomains(serve)
	for _, eng := range d.engines {
		// Give back what its leases hold, so the units serve the new set at once.
		go eng.EndLeases(context.Background())
	}
	d.engines, d.last = engines, set
	d.served.Store(int64(len(engines)))
	names := slices.Sorted(maps.Keys(set.domains))
	d.log.Info("envoyproxy/ratelimit configuration loaded", "domains", names)
	return nil
}

// ShouldRateLimit decides req with the domains serving now.
func (d *erlDomains) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return d.rls.ShouldRateLimit(ctx, req)
}

// ServeHTTP answers POST /json with the domains serving now.
func (d *erlDomains) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.json.ServeHTTP(w, r)
}

// loaded returns how many of the directory's domains are served.
func (d *erlDomains) loaded() int { return int(d.served.Load()) }

// all returns the engines of the domains served now.
func (d *erlDomains) all() []*engine.Engine {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*engine.Engine, 0, len(d.engines))
	for _, name := range slices.Sorted(maps.Keys(d.engines)) {
		out = append(out, d.engines[name])
	}
	return out
}

// describe lists the domains served now, for the debug listener's
// /rlconfig.
func (d *erlDomains) describe(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	names := slices.Sorted(maps.Keys(d.engines))
	d.mu.Unlock()
	for _, n := range names {
		fmt.Fprintln(w, n)
	}
}
