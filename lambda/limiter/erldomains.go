package main

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"gopkg.in/yaml.v3"

	"github.com/tollgate-dev/tollgate/shared/algo"
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
	files  []string // the files it comes from: one, or several merged
}

// parseERLDir reads a directory's document (reload.Dir) into an erlSet. Every file is
// a configuration, as ERL reads every file of the directory. Two files of one domain
// are refused unless merge is set (ERL's MERGE_DOMAIN_CONFIG), which joins their
// descriptors in the order of the files' names. Any file's problem refuses the set,
// naming the file.
func parseERLDir(doc []byte, merge bool) (erlSet, error) {
	files, err := reload.DecodeDir(doc)
	if err != nil {
		return erlSet{}, err
	}
	type merged struct {
		root  *yaml.Node // the first file's mapping, gathering the descriptors
		descs *yaml.Node
		files []string
	}
	byDomain := map[string]*merged{}
	var order []string
	for _, f := range files {
		var d yaml.Node
		if err := yaml.Unmarshal(f.Data, &d); err != nil {
			return erlSet{}, fmt.Errorf("%s: %w", f.Name, err)
		}
		if len(d.Content) != 1 || d.Content[0].Kind != yaml.MappingNode {
			return erlSet{}, fmt.Errorf("%s: want a mapping with domain and descriptors, as envoyproxy/ratelimit's configuration files are", f.Name)
		}
		root := d.Content[0]
		var domain string
		var descs *yaml.Node
		for i := 0; i+1 < len(root.Content); i += 2 {
			switch root.Content[i].Value {
			case "domain":
				domain = root.Content[i+1].Value
			case "descriptors":
				descs = root.Content[i+1]
			}
		}
		if domain == "" {
			return erlSet{}, fmt.Errorf("%s: domain is empty; every file names its domain", f.Name)
		}
		m, dup := byDomain[domain]
		if !dup {
			byDomain[domain] = &merged{root: root, descs: descs, files: []string{f.Name}}
			order = append(order, domain)
			continue
		}
		if !merge {
			return erlSet{}, fmt.Errorf("%s: domain %s is in %s too; set MERGE_DOMAIN_CONFIG=true to join their descriptors, or keep each domain in one file", f.Name, domain, m.files[0])
		}
		m.files = append(m.files, f.Name)
		if descs == nil || descs.Kind != yaml.SequenceNode {
			continue
		}
		if m.descs == nil {
			m.descs = &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
			m.root.Content = append(m.root.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: "descriptors"}, m.descs)
		}
		m.descs.Content = append(m.descs.Content, descs.Content...)
	}
	set := erlSet{domains: map[string]erlDomain{}}
	for _, domain := range order {
		m := byDomain[domain]
		name := strings.Join(m.files, " + ")
		data, err := yaml.Marshal(m.root)
		if err != nil {
			return erlSet{}, fmt.Errorf("%s: %w", name, err)
		}
		tr, err := erl.Translate(data)
		if err != nil {
			return erlSet{}, fmt.Errorf("%s: %w", name, err)
		}
		p, err := policy.Parse(tr.Policy)
		if err != nil {
			return erlSet{}, fmt.Errorf("%s: %w", name, err)
		}
		set.domains[tr.Domain] = erlDomain{tr: tr, policy: p, files: m.files}
	}
	return set, nil
}

// erlDomains serves the domains of an ERL configuration directory over gRPC and
// POST /json, and applies its reloads: a domain kept keeps its engine (and the state
// of the limits it keeps), a new one gets an engine, a removed one is no longer
// served. The set of domains changes at once, between two requests.
type erlDomains struct {
	rlsv3.UnimplementedRateLimitServiceServer
	store    engine.Store
	hooks    engine.Hooks
	log      *slog.Logger
	oneQuota algo.OneQuotaNames
	// own is the engine of the service's own policy, which decides its domain
	// (ownDomain) even when a file names it too; nil when no policy was named.
	own       *engine.Engine
	ownDomain string

	mu      sync.Mutex // serializes apply
	engines map[string]*engine.Engine
	last    erlSet // the set serving now
	cur     atomic.Pointer[erlServing]
}

// erlServing is the set of domains serving now.
type erlServing struct {
	rls     *rls.Server
	json    http.Handler
	domains int // the directory's domains served
}

// apply makes set the domains served from the next request on.
func (d *erlDomains) apply(set erlSet) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	engines := map[string]*engine.Engine{}
	serve := map[string]rls.Domain{}
	// New engines first: an error leaves the running set as it is.
	for name, dom := range set.domains {
		if d.own != nil && name == d.ownDomain {
			d.log.Warn("envoyproxy/ratelimit domain decided by the policy instead", "domain", name, "files", dom.files)
			continue
		}
		eng, ok := d.engines[name]
		if !ok {
			var err error
			if eng, err = engine.New(engine.Config{Policy: dom.policy, Store: d.store, Logger: d.log, Hooks: d.hooks}); err != nil {
				return fmt.Errorf("%s: %w", strings.Join(dom.files, " + "), err)
			}
		}
		engines[name] = eng
	}
	for name, dom := range set.domains {
		if eng, ok := engines[name]; ok {
			if _, kept := d.engines[name]; kept {
				if err := eng.SetPolicy(dom.policy); err != nil {
					return err // engine.SetPolicy fails only on a nil policy
				}
			}
			serve[name] = rls.Domain{Engine: eng, Replaces: dom.tr.Replaces}
		}
	}
	if d.own != nil {
		serve[d.ownDomain] = rls.Domain{Engine: d.own}
	}
	for name, eng := range d.engines {
		if _, kept := engines[name]; !kept {
			// Give back what its leases hold, so the units serve elsewhere at once.
			go eng.EndLeases(context.Background())
		}
	}
	srv := rls.NewDomains(serve, d.log)
	srv.OneQuota = d.oneQuota
	d.engines, d.last = engines, set
	d.cur.Store(&erlServing{rls: srv, json: srv.JSONHandler(), domains: len(engines)})
	names := slices.Sorted(maps.Keys(set.domains))
	d.log.Info("envoyproxy/ratelimit configuration loaded", "domains", names)
	return nil
}

// ShouldRateLimit decides req with the domains serving now.
func (d *erlDomains) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return d.cur.Load().rls.ShouldRateLimit(ctx, req)
}

// ServeHTTP answers POST /json with the domains serving now.
func (d *erlDomains) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.cur.Load().json.ServeHTTP(w, r)
}

// loaded returns how many of the directory's domains are served.
func (d *erlDomains) loaded() int { return d.cur.Load().domains }

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

// describe lists the domains served now and their files, for the debug listener's
// /rlconfig.
func (d *erlDomains) describe(w http.ResponseWriter, _ *http.Request) {
	d.mu.Lock()
	names := slices.Sorted(maps.Keys(d.engines))
	d.mu.Unlock()
	for _, n := range names {
		fmt.Fprintln(w, n)
	}
}
