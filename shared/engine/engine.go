// Package engine decides requests: it applies a policy to a request's attributes,
// decides every matched limit together in the store (Redis) within the policy's
// timeout, and falls back to the policy's failure mode when the store fails, behind a
// circuit breaker. Denied keys are remembered in process until they can be retried, so
// a blocked client costs no store round trip. A limit the policy leases is served from
// a slice of its quota reserved in the store (see lease.go). A cost already spent is
// settled, charged and never refused, and an estimate may be reserved first and
// settled later (see settle.go).
package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/shared/breaker"
	"github.com/tollgate-dev/tollgate/shared/identity"
	"github.com/tollgate-dev/tollgate/shared/memstore"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// Store decides the meters of one request together, all-or-nothing. Decide must
// return once ctx is done and must not keep ctx after it returns.
type Store interface {
	Decide(ctx context.Context, c algo.Check) (algo.Outcome, error)
}

// NodeStore is a Store that keeps a circuit breaker per node (redisstore's Store),
// so that a failing node fails only the requests whose keys it holds. The engine hands it the policy's breaker settings and keeps no breaker of its own; a
// Store that is not a NodeStore is guarded by one breaker in the engine.
type NodeStore interface {
	Store
	// UseBreakers makes the store's breakers take st.
	UseBreakers(st breaker.Settings)
	// Breakers returns the state of each node's breaker, without I/O.
	Breakers() []breaker.Status
	// Health checks every node through its breaker (the check probes a breaker whose
	// wait is over) and returns each node's state and error.
	Health(ctx context.Context) []breaker.Status
}

// storeNode names the engine's own breaker, in front of a Store that is not a
// NodeStore.
const storeNode = "store"

// Errors of Check. A caller's mistake wraps ErrBadRequest.
var (
	ErrBadRequest    = errors.New("bad request")
	ErrUnknownDomain = fmt.Errorf("%w: unknown domain", ErrBadRequest)
)

// Reasons a Verdict gives for a denial.
const (
	ReasonOverLimit   = "over_limit"
	ReasonUnavailable = "unavailable"
)

// Request is one request to decide.
type Request struct {
	Domain     string
	Attributes map[string]string
	// Cost is the request's weight in units; 0 peeks without charging.
	Cost int64
	// Settle makes the request a settlement: its cost was spent already, and is
	// charged, never refused (see Engine.Settle).
	Settle bool
	// KeyHashed says the front door put the SHA-256 of the request's API key in its
	// key attribute (algo.HashValue), so the policy's plan table finds it by that
	// hash. Otherwise the value is the client's, and one that looks like a hash is
	// hashed again like any other.
	KeyHashed bool
}

// LimitResult is one limit's decision within a verdict.
type LimitResult struct {
	// Item is the index in the plan's Items of the item the limit belongs to.
	Item      int
	Rule      string
	Algorithm algo.Algorithm
	Shadow    bool
	// Quota names the limit in the RateLimit headers (policy.Rule.QuotaName).
	Quota string
	// Spec is the limit as the policy states it.
	Spec algo.Limit
	algo.Decision
}

// Stated returns the limit's quota and window as the RateLimit headers state them
// (algo.QuotaWindow): a limit with a burst states its burst over the time the rate
// refills it, so that remaining never exceeds the quota.
func (l LimitResult) Stated() (quota int64, window time.Duration) {
	if l.Spec.Count == 0 {
		return l.Decision.Limit, l.Period
	}
	return algo.QuotaWindow(l.Spec)
}

// Verdict is the answer to a Request: one result per limit of every item of its
// plan, on every path (the store, a lease, the deny cache, the failure mode), and a
// summary of them computed once, which every front door translates.
type Verdict struct {
	// Allowed reports whether the request may proceed (after Delay).
	Allowed bool
	// Reason is empty when allowed, else ReasonOverLimit or ReasonUnavailable.
	Reason string
	// Degraded reports that the store failed and the failure mode decided.
	Degraded bool
	// Cached reports that the deny cache answered without the store.
	Cached bool
	// Rule names the rule of the deciding limit ("" when no rule matched).
	Rule string
	// Decision is the deciding limit's decision: on a denial the non-shadow denial
	// with the longest retry; when allowed the limit with the least remaining
	// (algo.MostRestrictive).
	Decision algo.Decision
	// Quota and Window are the deciding limit's, as the headers state them
	// (LimitResult.Stated); 0 when no limit decided.
	Quota  int64
	Window time.Duration
	// Delay is how long to hold the request before forwarding it (leaky_bucket).
	Delay time.Duration
	// Limits holds every matched limit's decision, shadow ones included, in the
	// order of the plan's items.
	Limits []LimitResult
	// NowMicros is the time the verdict was decided at, Unix µs: the store's clock,
	// or this process's when a lease or the deny cache answered (0 in a failure
	// mode that decided nothing).
	NowMicros int64

	deciding int // the index in Limits of the deciding limit
}

// MostRestrictive returns the index in v.Limits of the most restrictive non-shadow
// limit among those in reports true for, or -1: for a front door that answers per
// group of limits (an Envoy descriptor).
func (v Verdict) MostRestrictive(in func(LimitResult) bool) int {
	return algo.MostRestrictive(len(v.Limits), func(i int) (algo.Decision, bool) {
		l := v.Limits[i]
		return l.Decision, !l.Shadow && in(l)
	})
}

// summarize computes the verdict's summary from its limits: the deciding limit, its
// rule, quota and window, and the delay. allowed is the store's all-or-nothing
// answer.
func (v *Verdict) summarize(allowed bool) {
	v.Allowed = allowed
	best := v.MostRestrictive(func(LimitResult) bool { return true })
	if best < 0 {
		// Only shadow limits matched: nothing to report in the headers.
		return
	}
	if allowed {
		for _, l := range v.Limits {
			if !l.Shadow {
				v.Delay = max(v.Delay, l.Delay)
			}
		}
	} else {
		v.Reason = ReasonOverLimit
	}
	d := v.Limits[best]
	v.deciding, v.Rule, v.Decision = best, d.Rule, d.Decision
	v.Quota, v.Window = d.Stated()
}

// Headers returns the response headers of the verdict (algo.Headers): every
// non-shadow limit in RateLimit-Policy and RateLimit, the deciding one in the
// X-RateLimit-* headers and, on a denial, Retry-After. None when no limit decided
// (nothing matched, only shadow limits, or the failure mode admitted), and only
// Retry-After when the failure mode denied. They are formatted on demand, so that a
// caller that sends none pays nothing for them.
func (v Verdict) Headers() [][2]string { return v.HeadersNamed(algo.XRateLimit) }

// HeadersNamed is Headers with the one-quota headers named by names (see
// algo.HeadersNamed).
func (v Verdict) HeadersNamed(names algo.OneQuotaNames) [][2]string {
	switch {
	case v.Reason == ReasonUnavailable:
		return [][2]string{{"Retry-After", strconv.FormatInt(algo.RetryAfterSeconds(v.Decision.RetryAfter), 10)}}
	case v.Rule == "":
		return nil
	}
	var qs []algo.Quota
	deciding := 0
	for i, l := range v.Limits {
		if l.Shadow {
			continue
		}
		if i == v.deciding {
			deciding = len(qs)
		}
		qs = append(qs, algo.Quota{Name: l.Quota, Limit: l.Spec, Decision: l.Decision})
	}
	return algo.HeadersNamed(qs, deciding, names)
}

// Hooks receive the engine's events for metrics; every field may be nil.
type Hooks struct {
	// Decided is called once per Check with the verdict and the time it took.
	Decided func(domain string, v Verdict, took time.Duration)
	// IdentityFallback is called when remote_address came with an X-Forwarded-For
	// whose trusted entry is missing, blank or not an address, so the address the
	// front door saw was used instead (see policy.TrustedHop).
	IdentityFallback func()
	// StoreCall is called after every store round trip with its latency and error.
	StoreCall func(took time.Duration, err error)
	// FailureMode is called when the failure mode decides a request.
	FailureMode func(mode policy.FailureMode)
	// DenyCacheHit is called when the deny cache answers.
	DenyCacheHit func()
	// Settled is called with the units of every settlement charged in the store
	// (Settle, and the part of SettleReserved above its estimate): the units
	// charged after the fact (tollgate_settled_units_total).
	Settled func(domain string, units int64)
	// SettleFailed is called with the units of a settlement the store failed to
	// take (or may have taken: a call that timed out): the units not known to be
	// charged, which the caller was told to send again.
	SettleFailed func(domain string, units int64, err error)
	// BreakerState is called with a node's name and its circuit breaker's new state
	// when the breaker changes state, with "closed" when it is created, and with ""
	// when the node has left the topology and its breaker is dropped.
	BreakerState func(node, state string)
}

// Config configures an Engine.
type Config struct {
	// Policy is required.
	Policy *policy.Policy
	// Store is the shared store (Redis). Nil decides everything in process.
	Store Store
	// Clock reads the time for the deny cache and the in-process store (default
	// time.Now). Store decisions use the store's own clock.
	Clock func() time.Time
	// Logger receives warnings about store failures (default slog.Default()).
	Logger *slog.Logger
	// Hooks receive metrics events.
	Hooks Hooks
	// Refunder gives back the unused units of leases (see Lease in lease.go).
	// Default: Store, if it is a Refunder, or the in-process store when Store is
	// nil. Without one, unused units stay charged until their window ends or their
	// bucket refills.
	Refunder Refunder
	// Reservations keeps the records of reservations (Reserve). Default: Store, if
	// it is a Reservations, or the in-process store.
	Reservations Reservations
	// KeepStoreBreakers leaves a NodeStore's circuit breakers as they are, for an
	// engine that shares its store with another whose policy sets them (the
	// engines of envoyproxy/ratelimit domains beside the service's policy). By
	// default New gives the store breakers with Policy's settings.
	KeepStoreBreakers bool
}

// Engine decides requests. It is safe for simultaneous use.
type Engine struct {
	cur      atomic.Pointer[current]
	store    Store
	local    *memstore.Store
	nodes    NodeStore        // the store, when it keeps a breaker per node
	breaker  *breaker.Breaker // in front of a store that is not a NodeStore
	clock    func() time.Time
	log      *slog.Logger
	hooks    Hooks
	refunder Refunder // nil: leases give nothing back
	// reservations keeps the reservations' records
	reservations Reservations
	keepBreakers bool // Config.KeepStoreBreakers
}

// current is the policy an engine decides with and what is derived from it. SetPolicy
// replaces it whole; a request keeps the one it was planned with.
type current struct {
	pol  *policy.Policy
	deny *denyCache // nil when the policy disables it
	// leases holds the leases of the policy's leased limits; nil when none leases.
	leases *leaseTable
	// known is what is known locally of denied keys: the deny cache or, when the
	// policy disables it and some limit leases, one that only leases consult.
	known *denyCache
}

func newCurrent(p *policy.Policy) *current {
	c := &current{pol: p}
	if p.DenyCache.Enabled {
		c.deny = newDenyCache(p.DenyCache.MaxEntries)
	}
	c.known = c.deny
	if p.Leasing() {
		c.leases = newLeaseTable()
		if c.known == nil {
			c.known = newDenyCache(maxLeases)
		}
	}
	return c
}

// New returns an engine for cfg.
func New(cfg Config) (*Engine, error) {
	if cfg.Policy == nil {
		return nil, errors.New("engine: nil policy")
	}
	e := &Engine{
		store:    cfg.Store,
		clock:    cfg.Clock,
		log:      cfg.Logger,
		hooks:    cfg.Hooks,
		refunder: cfg.Refunder,
	}
	if e.clock == nil {
		e.clock = time.Now
	}
	if e.log == nil {
		e.log = slog.Default()
	}
	e.local = memstore.New(max(cfg.Policy.DenyCache.MaxEntries, memstore.DefaultMaxKeys), e.clock)
	if r, ok := cfg.Store.(Refunder); ok && e.refunder == nil {
		e.refunder = r
	}
	if cfg.Store == nil && e.refunder == nil {
		e.refunder = e.local
	}
	e.reservations = cfg.Reservations
	e.keepBreakers = cfg.KeepStoreBreakers
	if r, ok := cfg.Store.(Reservations); ok && e.reservations == nil {
		e.reservations = r
	}
	if e.reservations == nil {
		e.reservations = e.local
	}
	e.cur.Store(newCurrent(cfg.Policy))
	st := e.breakerSettings(cfg.Policy.Failure.Breaker)
	switch s := cfg.Store.(type) {
	case nil:
	case NodeStore:
		e.nodes = s
		if !cfg.KeepStoreBreakers {
			s.UseBreakers(st)
		}
	default:
		e.breaker = breaker.New(storeNode, st)
		st.OnChange(storeNode, breaker.Closed, breaker.Closed)
	}
	return e, nil
}

// breakerSettings are the settings of the store's circuit breakers under b.
func (e *Engine) breakerSettings(b policy.Breaker) breaker.Settings {
	return breaker.Settings{
		Failures: max(1, b.Failures),
		OpenFor:  b.OpenFor,
		OnChange: func(node string, from, to breaker.State) {
			if from != to {
				e.log.Warn("circuit breaker changed state", "node", node, "from", from.String(), "to", to.String())
			}
			if e.hooks.BreakerState != nil {
				e.hooks.BreakerState(node, to.String())
			}
		},
		OnRemove: func(node string) {
			if e.hooks.BreakerState != nil {
				e.hooks.BreakerState(node, "")
			}
		},
	}
}

// Policy returns the engine's policy.
func (e *Engine) Policy() *policy.Policy { return e.cur.Load().pol }

// SetPolicy makes the engine decide with p from its next request on; requests already
// planned finish under the policy they were planned with. Limits whose keys p keeps
// keep their state in the store (policy.Fresh); the others are logged. The
// deny cache starts empty, since p may have raised a limit that denied; the failure
// mode, timeout and identity options take effect at once, and a node store's
// circuit breakers start afresh when p changes their settings. The store's
// connection settings are read once, at start.
func (e *Engine) SetPolicy(p *policy.Policy) error {
	if p == nil {
		return errors.New("engine: nil policy")
	}
	old := e.cur.Swap(newCurrent(p))
	if fresh := policy.Fresh(old.pol, p); len(fresh) > 0 {
		e.log.Info("the new policy starts these limits afresh: their algorithm, period or key changed, so their state does not carry over", "limits", fresh)
	}
	if old.leases != nil {
		// The old policy's leases serve no more requests: give back their units.
		go e.returnLeases(context.Background(), old, true)
	}
	if old.pol.Failure.Breaker != p.Failure.Breaker && e.nodes != nil && !e.keepBreakers {
		e.nodes.UseBreakers(e.breakerSettings(p.Failure.Breaker))
	}
	return nil
}

// BreakerState returns the worst state of the circuit breakers: "closed",
// "half-open" or "open" ("closed" with no store).
func (e *Engine) BreakerState() string { return breaker.Worst(e.Breakers()).String() }

// Breakers returns the state of each circuit breaker: one per node the store has
// called, or the engine's own in front of a store without nodes, or none without a
// store.
func (e *Engine) Breakers() []breaker.Status {
	switch {
	case e.nodes != nil:
		return e.nodes.Breakers()
	case e.breaker != nil:
		return []breaker.Status{{Node: storeNode, State: e.breaker.State()}}
	}
	return nil
}

// Health checks the store's nodes through their breakers and returns each one's
// state and error (NodeStore.Health); for a store without nodes it returns the
// engine's breaker, and without a store nothing.
func (e *Engine) Health(ctx context.Context) []breaker.Status {
	if e.nodes != nil {
		return e.nodes.Health(ctx)
	}
	return e.Breakers()
}

// validate reports a caller's mistake in r, wrapping ErrBadRequest and naming the
// field: an unknown domain, or a request past the bounds of package bounds. It is
// the one check of a request's bounds, for every front door.
func validate(pol *policy.Policy, r Request) error {
	if r.Domain != pol.Domain {
		return fmt.Errorf("%w %q: this service decides domain %q", ErrUnknownDomain, r.Domain, pol.Domain)
	}
	if err := bounds.Check(r.Attributes, r.Cost); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return nil
}

// An Item is one meter of a plan: a store key with its limits (one, or a
// bucket_ring's windows), the rule it comes from, the lease it is served from, and
// the groups it belongs to.
type Item struct {
	Key   string
	Meter algo.Meter
	Rule  *policy.Rule
	// Lease is the lease the item is served from; the zero Lease for none.
	Lease policy.Lease
	// Groups has bit g set when the item belongs to group g: the request (bit 0) of
	// a plan from Plan, each plan's index in a plan from Join (an Envoy
	// descriptor). An item two groups reach is decided once.
	Groups uint64
}

// In reports whether the item belongs to group g.
func (it Item) In(g int) bool { return g < MaxGroups && it.Groups&(1<<g) != 0 }

// MaxGroups bounds the plans Join joins.
const MaxGroups = 64

// A Plan is a request matched against the policy: the items the store must decide
// together. Build it with Plan; decide it with Decide. Joining plans, dropping
// replaced rules and applying a descriptor's own limit are operations on its items.
type Plan struct {
	// Domain is the request's.
	Domain string
	// Cost is the request's weight in units; 0 peeks without charging.
	Cost int64
	// Settle makes Decide settle the plan (Engine.Settle) instead of deciding it.
	Settle bool
	// Items holds one item per store key.
	Items []Item
	// KeyRequired reports that only rules keyed on an API key could limit the request,
	// and it carries none (policy.KeyRequired): a front door that authenticates
	// answers it as unauthenticated rather than decide it.
	KeyRequired bool
	// Attributes are the request's attributes as the policy matched them: the
	// caller's, with remote_address identified. They must not be modified.
	Attributes map[string]string
	// Client is the client's address as identity.Address derived it from the
	// remote_address and x-forwarded-for attributes, or "" when the request has no
	// remote_address.
	Client string
	// AddressFellBack reports that the request's X-Forwarded-For was sent but its
	// trusted entry was unusable, so the address the front door saw identifies the
	// client (see identity.Address).
	AddressFellBack bool

	cur *current // the policy the plan was made with
}

// Check returns what the store decides for the plan: each item's key and meter, at
// the plan's cost.
func (p Plan) Check() algo.Check {
	c := algo.Check{Cost: p.Cost, Keys: make([]string, len(p.Items)), Meters: make([]algo.Meter, len(p.Items))}
	for i, it := range p.Items {
		c.Keys[i], c.Meters[i] = it.Key, it.Meter
	}
	return c
}

// Join returns one plan that decides ps together, all-or-nothing, with each store key
// once (two plans that reach the same limit of the same client charge it once); an
// item of ps[g] belongs to group g. The plans must share the domain and cost, and be
// at most MaxGroups; the joint plan needs a key if any does, and settles if the first
// does.
func Join(ps []Plan) Plan {
	if len(ps) == 0 {
		return Plan{}
	}
	j := Plan{Domain: ps[0].Domain, Cost: ps[0].Cost, Settle: ps[0].Settle, cur: ps[0].cur}
	at := map[string]int{}
	for g, p := range ps[:min(len(ps), MaxGroups)] {
		j.KeyRequired = j.KeyRequired || p.KeyRequired
		for _, it := range p.Items {
			n, seen := at[it.Key]
			if !seen {
				n = len(j.Items)
				at[it.Key] = n
				it.Groups = 0
				j.Items = append(j.Items, it)
			}
			j.Items[n].Groups |= 1 << g
		}
	}
	return j
}

// Replace drops the items of every rule that the rule of another item (or the same)
// names in replaces, as envoyproxy/ratelimit drops a descriptor's limit when any
// descriptor of the request reaches a limit that replaces it.
func (p *Plan) Replace(replaces map[string][]string) {
	if len(replaces) == 0 {
		return
	}
	gone := map[string]bool{}
	for _, it := range p.Items {
		for _, n := range replaces[it.Rule.Name] {
			gone[n] = true
		}
	}
	if len(gone) > 0 {
		p.Items = slices.DeleteFunc(p.Items, func(it Item) bool { return gone[it.Rule.Name] })
	}
}

// Only makes the plan decide one item, in place of what the policy matched: a limit
// the request carries itself (an Envoy descriptor's own limit). The item is served
// from no lease, whatever the policy leases.
func (p *Plan) Only(it Item) {
	it.Lease = policy.Lease{}
	if it.Groups == 0 {
		it.Groups = 1
	}
	p.Items = []Item{it}
	p.KeyRequired = false
}

// RemoteAddress and ForwardedFor are the attributes of the client's address: front
// doors send the address they saw and the X-Forwarded-For header as they are, and
// the engine alone turns them into the client's identity (identity.Address).
const (
	RemoteAddress = "remote_address"
	ForwardedFor  = "x-forwarded-for"
)

// Plan validates r, identifies its client and matches it against the policy: the one
// place a request's attributes become the limits to decide.
func (e *Engine) Plan(r Request) (Plan, error) {
	cur := e.cur.Load()
	pol := cur.pol
	if err := validate(pol, r); err != nil {
		return Plan{}, err
	}
	attrs, own := r.Attributes, false
	edit := func() { // attrs becomes the engine's own copy: the caller's map is never modified
		if !own {
			attrs, own = maps.Clone(attrs), true
			if attrs == nil {
				attrs = map[string]string{}
			}
		}
	}
	p := Plan{Domain: r.Domain, Cost: r.Cost, Settle: r.Settle, cur: cur}
	if ra, ok := attrs[RemoteAddress]; ok {
		p.Client, p.AddressFellBack = identity.Address(ra, attrs[ForwardedFor], pol.Identity)
		if p.AddressFellBack && e.hooks.IdentityFallback != nil {
			e.hooks.IdentityFallback()
		}
		if p.Client != ra {
			edit()
			attrs[RemoteAddress] = p.Client
		}
	}
	if pl := pol.Plans; pl != nil {
		plan := "" // no key, no plan
		if key, ok := attrs[pl.From]; ok {
			plan = pl.Plan(key, r.KeyHashed)
		}
		// Only the table says a key's plan: a value the request carried goes.
		if have, has := attrs[pl.Attribute]; have != plan || has && plan == "" {
			edit()
			if plan == "" {
				delete(attrs, pl.Attribute)
			} else {
				attrs[pl.Attribute] = plan
			}
		}
	}
	p.Attributes = attrs
	matches := pol.Match(attrs)
	p.KeyRequired = pol.KeyRequired(attrs, matches)
	var settling, deciding string // a rule of each kind that matched
	for _, mt := range matches {
		for _, mm := range mt.Meters {
			p.Items = append(p.Items, Item{Key: mm.Key, Meter: mm.Meter, Rule: mt.Rule, Lease: mm.Lease, Groups: 1})
		}
		if len(mt.Meters) == 0 {
			continue
		}
		if mt.Rule.Settle {
			settling = mt.Rule.Name
		} else {
			deciding = mt.Rule.Name
		}
	}
	if settling != "" {
		if deciding != "" {
			return Plan{}, fmt.Errorf("%w: rule %q settles and rule %q decides, and both match this request: match the response-phase call (the cost already spent) only with settling rules, e.g. on an attribute only that call sends", ErrBadRequest, settling, deciding)
		}
		p.Settle = true
	}
	return p, nil
}

// Check decides r: Plan, then Decide (or, for a settlement, Settle). Being over a
// limit is a Verdict, not an error; the error is ErrBadRequest (wrapped) for a
// caller's mistake. A store failure is not an error for a decision (the policy's
// failure mode decides and the verdict says Degraded); for a settlement it is one,
// wrapping ErrSettleFailed, since no failure mode can stand in for a charge.
func (e *Engine) Check(ctx context.Context, r Request) (Verdict, error) {
	p, err := e.Plan(r)
	if err != nil {
		return Verdict{}, err
	}
	if p.Settle {
		return e.Settle(ctx, p)
	}
	return e.Decide(ctx, p), nil
}

// Decide decides a plan: from the deny cache when it knows a key is denied, else in
// the store, else (the store failed) by the policy's failure mode. A plan that
// settles is settled (Settle); when the settlement fails, or cannot be made, the
// verdict is not allowed, ReasonUnavailable, so that a front door that reads only
// the verdict answers "try again" (Settle returns the error itself).
func (e *Engine) Decide(ctx context.Context, p Plan) Verdict {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if p.Settle {
		v, err := e.Settle(ctx, p)
		if err != nil {
			v = Verdict{Reason: ReasonUnavailable, Degraded: true}
			v.Decision = algo.Decision{RetryAfter: time.Second}
		}
		return v
	}
	start := e.clock()
	v := e.decide(ctx, p, start)
	if e.hooks.Decided != nil {
		e.hooks.Decided(p.Domain, v, e.clock().Sub(start))
	}
	return v
}

func (e *Engine) decide(ctx context.Context, p Plan, start time.Time) Verdict {
	if len(p.Items) == 0 {
		return Verdict{Allowed: true}
	}
	now := start.UnixMicro()
	if v, ok := e.fromDenyCache(p, now); ok {
		return v
	}
	if p.Cost > 0 && p.leased() {
		if v, ok := e.decideLeased(ctx, p, now); ok {
			return v
		}
	}
	out, err := e.decideInStore(ctx, p.cur.pol, p.Check())
	if err != nil {
		return e.failureMode(ctx, p, now, err)
	}
	v := e.verdict(p, out)
	p.cur.deny.remember(p, v, now)
	return v
}

// decideInStore runs the check in the store, within the policy's timeout and behind
// the circuit breaker (the store's, per node, or the engine's own). A call a breaker
// turns away is no store round trip: StoreCall does not see it.
func (e *Engine) decideInStore(ctx context.Context, pol *policy.Policy, c algo.Check) (algo.Outcome, error) {
	if e.store == nil {
		return e.local.Decide(ctx, c)
	}
	var p breaker.Permit
	if e.breaker != nil {
		var err error
		if p, err = e.breaker.Allow(); err != nil {
			return algo.Outcome{}, fmt.Errorf("engine: store: %w", err)
		}
	}
	t0 := time.Now()
	// The store call ends at the policy's timeout, or at the caller's deadline if that
	// comes first. It does not end when the caller goes away: a charge that completes
	// for a caller that has left does no harm, and one cut short may have run anyway.
	deadline := t0.Add(pol.Failure.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	sctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), deadline)
	out, err := e.store.Decide(sctx, c)
	cancel()
	p.Done(breaker.ResultOf(err))
	if e.hooks.StoreCall != nil && !errors.Is(err, breaker.ErrOpen) {
		e.hooks.StoreCall(time.Since(t0), err)
	}
	return out, err
}

// failureMode decides a request whose store decision failed.
func (e *Engine) failureMode(ctx context.Context, p Plan, now int64, cause error) Verdict {
	pol := p.cur.pol
	mode := pol.Failure.Mode
	if !errors.Is(cause, breaker.ErrOpen) {
		e.log.Warn("store decision failed; applying the failure mode", "mode", string(mode), "err", cause)
	}
	if e.hooks.FailureMode != nil {
		e.hooks.FailureMode(mode)
	}
	switch mode {
	case policy.FailClosed:
		v := Verdict{Reason: ReasonUnavailable, Degraded: true}
		v.Decision = algo.Decision{RetryAfter: time.Second}
		return v
	case policy.FailLocal:
		local := p
		local.Items = slices.Clone(p.Items)
		for i := range local.Items {
			local.Items[i].Meter = policy.Scale(local.Items[i].Meter, pol.Failure.ExpectedInstances)
		}
		c := local.Check()
		c.NowMicros = now
		out, err := e.local.Decide(ctx, c)
		if err != nil {
			// The in-process store fails only on a malformed check; admit, as open does.
			e.log.Error("in-process decision failed", "err", err)
			return Verdict{Allowed: true, Degraded: true}
		}
		v := e.verdict(local, out)
		v.Degraded = true
		return v
	default:
		return Verdict{Allowed: true, Degraded: true}
	}
}

// verdict turns a store outcome into a verdict: one result per limit of every item,
// and the summary.
func (e *Engine) verdict(p Plan, out algo.Outcome) Verdict {
	var v Verdict
	n := 0
	for _, ds := range out.Decisions {
		n += len(ds)
	}
	v.Limits = make([]LimitResult, 0, n)
	at := out.NowMicros // the store's time, for calendar windows
	if at == 0 {
		at = e.clock().UnixMicro()
	}
	v.NowMicros = at
	for i, ds := range out.Decisions {
		it := &p.Items[i]
		for j, d := range ds {
			l := it.Meter.Limits[j]
			if !out.Allowed && d.Allowed && p.Cost > 0 {
				// The store's check counted this request, but a denial elsewhere
				// charged nothing.
				d.Remaining += p.Cost
			}
			// A calendar limit is stated with the window it was decided in.
			v.Limits = append(v.Limits, LimitResult{Item: i, Rule: it.Rule.Name, Algorithm: l.Algorithm, Shadow: it.Rule.Shadow, Quota: it.Rule.QuotaName(l), Spec: l.In(at), Decision: d})
		}
	}
	v.summarize(out.Allowed)
	return v
}

// Peek returns the current decisions of a plan's limits without charging anything
// (whatever the plan's cost), from the store, not the deny cache.
func (e *Engine) Peek(ctx context.Context, p Plan) (Verdict, error) {
	if p.cur == nil {
		p.cur = e.cur.Load()
	}
	if len(p.Items) == 0 {
		return Verdict{Allowed: true}, nil
	}
	p.Cost = 0
	out, err := e.decideInStore(ctx, p.cur.pol, p.Check())
	if err != nil {
		return Verdict{}, fmt.Errorf("engine: peek: %w", err)
	}
	return e.verdict(p, out), nil
}

// Keys returns the store keys and meters a request with attrs touches.
func (e *Engine) Keys(domain string, attrs map[string]string) ([]string, []algo.Meter, error) {
	p, err := e.Plan(Request{Domain: domain, Attributes: attrs})
	if err != nil {
		return nil, nil, err
	}
	c := p.Check()
	return c.Keys, c.Meters, nil
}

// Forget drops keys from the deny cache, the leases and the in-process store (after
// an admin reset: a lease's units were charged to the state the reset deleted, so
// they are not spent after it).
func (e *Engine) Forget(keys []string) {
	cur := e.cur.Load()
	if cur.deny != nil {
		cur.deny.forget(keys)
	}
	if cur.known != nil && cur.known != cur.deny {
		cur.known.forget(keys)
	}
	if cur.leases != nil {
		cur.leases.forget(keys)
	}
	e.local.Reset(keys...)
}
