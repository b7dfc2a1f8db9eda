// Package rls answers Envoy's gRPC rate limit service,
// envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit, on tollgate's engine,
// so that Envoy's built-in envoy.filters.http.ratelimit (and what builds on it) can
// call tollgate where it would call envoyproxy/ratelimit.
//
// A request for a domain the service does not decide is answered OK with no limit,
// as envoyproxy/ratelimit answers it, counted (Register) and logged once per domain.
// Each descriptor's entries become the attributes of one request to the policy (entry
// key → attribute name: the key itself when it is one of tollgate's attribute names,
// else erl.AttrName's; an entry whose key an earlier entry has, erl.EntryAttribute's
// of its place), and every descriptor of a request is decided together,
// all-or-nothing: when one is over its limit, none is charged.
//
// A descriptor's status is envoyproxy/ratelimit's: its most restrictive limit, a
// shadow one when it has no other (OK even when over); remaining 0 when over;
// 4294967295 remaining and no limit when an unlimited rule of the domain reaches it. The cost is the request's hits_addend (1 when unset), or
// the descriptors' own hits_addend, which must then be the same for all.
//
// A request whose descriptors reach rules marked settle (policy rules[].settle, or
// package erl's settle extension) is a settlement: the cost Envoy's response-phase
// call reports (apply_on_stream_done, hits_addend from the response) was spent
// already, so it is charged, never refused (engine.Engine.Settle), and a request's
// hits_addend of 0 settles 0. Its statuses are OK, with 0 remaining while a limit is
// in debt. Descriptors of one request that disagree (some settle, some decide) are
// INVALID_ARGUMENT; a settlement the store does not take is UNAVAILABLE, logged,
// and counted by the engine's hooks, since Envoy ignores that answer.
//
// A descriptor that carries its own limit (Envoy's dynamic limit override,
// RateLimitDescriptor.limit) is decided by that limit alone, as envoyproxy/ratelimit
// does: a fixed window of requests_per_unit per unit × unit_multiplier, counted per
// descriptor (its entries) and per limit, so that two overrides never share a count.
// Its state is bounded like any other limit's: a key per descriptor and limit, which
// expires with its window.
package rls

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/net/http/httpguts"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/erl"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// MaxDescriptors bounds the descriptors of one request.
const MaxDescriptors = bounds.MaxAttributes

// Server is the RateLimitService on an engine.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	eng *engine.Engine // the one engine, or nil
	// domains holds what decides each domain, when there are several; SetDomain
	// replaces the map whole, so a request reads one version of it.
	domains   atomic.Pointer[map[string]Domain]
	domainsMu sync.Mutex // serializes SetDomain and SetDomains
	log       *slog.Logger
	// OneQuota names the headers that describe the deciding limit alone, which
	// response_headers_to_add carries beside RateLimit, RateLimit-Policy and
	// Retry-After. The zero value (the default) sends none of them, as
	// envoyproxy/ratelimit sends none unless LIMIT_RESPONSE_HEADERS_ENABLED is set
	// (see ERLHeaders). Set it before serving.
	OneQuota algo.OneQuotaNames
	// EveryDescriptor sends the OneQuota headers once per descriptor that has a
	// limit, in the order of the descriptors, in place of once for the deciding
	// limit (see ERLEveryDescriptor). Set it before serving.
	EveryDescriptor bool
	// Shadow answers OK every request a limit denies, its statuses as they are
	// (envoyproxy/ratelimit's global SHADOW_MODE); Quota also makes each status over
	// its limit OK (its global QUOTA_MODE). A request passed so was charged nothing,
	// as any denied request. See ERLModes. Set them before serving.
	Shadow, Quota bool

	unknown unknownDomains
}

// unknownDomains counts and logs the requests for domains the service does not
// decide: a series and a log line for each of the first maxUnknownDomains domains,
// then one series ("other") and one line for the rest, so that clients that send
// any domain cannot grow either without bound.
type unknownDomains struct {
	mu         sync.Mutex
	seen       map[string]bool // at most maxUnknownDomains, each counted under its name
	overflowed bool            // a domain past the cap has been logged
	counter    *prometheus.CounterVec
}

const maxUnknownDomains = 100

// Register registers the service's metric on reg:
// tollgate_rls_unknown_domain_requests_total, the requests for a domain the service
// does not decide (answered OK with no limit), by domain.
func (s *Server) Register(reg prometheus.Registerer) error {
	return reg.Register(s.unknown.counter)
}

func (u *unknownDomains) add(log *slog.Logger, domain string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	label := domain
	switch {
	case u.seen[domain]:
	case len(u.seen) < maxUnknownDomains:
		u.seen[domain] = true
		log.Warn("a request for a domain no configuration defines, answered OK with no limit (as envoyproxy/ratelimit answers it); this is logged once per domain", "domain", domain)
	default:
		// Past the cap a domain is never remembered, so it stays "other" for good.
		label = "other"
		if !u.overflowed {
			u.overflowed = true
			log.Warn("requests for more unknown domains; these are counted under domain \"other\" and not logged", "domain", domain)
		}
	}
	u.counter.WithLabelValues(label).Inc()
}

// ERLModes reads envoyproxy/ratelimit's global SHADOW_MODE and QUOTA_MODE through
// getenv, for Server.Shadow and Server.Quota.
func ERLModes(getenv func(string) string) (shadow, quota bool, err error) {
	for _, f := range []struct {
		env string
		dst *bool
	}{{"SHADOW_MODE", &shadow}, {"QUOTA_MODE", &quota}} {
		v := getenv(f.env)
		if v == "" {
			continue
		}
		if *f.dst, err = strconv.ParseBool(v); err != nil {
			return false, false, fmt.Errorf("%s=%.64q: want true or false", f.env, v)
		}
	}
	return shadow, quota, nil
}

// ERLEveryDescriptor reads LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED through getenv, the
// setting envoyproxy/ratelimit's proposal (its pull request 1190) names for headers
// of every descriptor: true sets Server.EveryDescriptor.
func ERLEveryDescriptor(getenv func(string) string) (bool, error) {
	v := getenv("LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED")
	if v == "" {
		return false, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("LIMIT_ALL_DESCRIPTORS_HEADERS_ENABLED=%q: want true or false", v)
	}
	return on, nil
}

// ERLHeaders reads envoyproxy/ratelimit's settings of its response headers through
// getenv, so that a service configured for ERL answers with the same headers:
// LIMIT_RESPONSE_HEADERS_ENABLED turns them on, and LIMIT_LIMIT_HEADER,
// LIMIT_REMAINING_HEADER and LIMIT_RESET_HEADER rename RateLimit-Limit,
// RateLimit-Remaining and RateLimit-Reset (ERL's defaults).
func ERLHeaders(getenv func(string) string) (algo.OneQuotaNames, error) {
	v := getenv("LIMIT_RESPONSE_HEADERS_ENABLED")
	if v == "" {
		return algo.OneQuotaNames{}, nil
	}
	on, err := strconv.ParseBool(v)
	if err != nil {
		return algo.OneQuotaNames{}, fmt.Errorf("LIMIT_RESPONSE_HEADERS_ENABLED=%q: want true or false", v)
	}
	if !on {
		return algo.OneQuotaNames{}, nil
	}
	names := algo.OneQuotaNames{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
	for _, f := range []struct {
		env  string
		name *string
	}{{"LIMIT_LIMIT_HEADER", &names.Limit}, {"LIMIT_REMAINING_HEADER", &names.Remaining}, {"LIMIT_RESET_HEADER", &names.Reset}} {
		v := getenv(f.env)
		if v == "" {
			continue
		}
		if !httpguts.ValidHeaderFieldName(v) {
			return algo.OneQuotaNames{}, fmt.Errorf("%s=%.64q: not a header name; use letters, digits and - (such as X-RateLimit-Limit)", f.env, v)
		}
		*f.name = v
	}
	return names, nil
}

// A Domain is one envoyproxy/ratelimit configuration file as the service decides it.
type Domain struct {
	Engine *engine.Engine
	// Replaces maps a rule to the rules it replaces across the descriptors of a
	// request (erl.Translation.Replaces).
	Replaces map[string][]string
	// Unlimited names the rules that are envoyproxy/ratelimit's unlimited limits
	// (erl.Translation.Unlimited): a descriptor one of them reaches answers
	// 4294967295 remaining.
	Unlimited []string
	// Names, when set, maps a rule to the name a status gives its limit
	// (erl.Translation.Names: the rate_limit's name in the file, or none); unset,
	// a status names a limit as the RateLimit headers do.
	Names map[string]string
}

// ERLDomain is the Domain of an envoyproxy/ratelimit configuration translated as tr
// (package erl), decided by eng, which runs tr's policy.
func ERLDomain(tr erl.Translation, eng *engine.Engine) Domain {
	return Domain{Engine: eng, Replaces: tr.Replaces, Unlimited: tr.Unlimited, Names: tr.Names}
}

// New returns the service on eng.
func New(eng *engine.Engine, log *slog.Logger) *Server {
	if log == nil {
		log = slog.Default()
	}
	s := &Server{eng: eng, log: log}
	s.unknown.seen = map[string]bool{}
	s.unknown.counter = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_rls_unknown_domain_requests_total",
		Help: "Rate limit service requests for a domain no configuration defines, answered OK with no limit, by domain (the first 100 domains; the rest as other).",
	}, []string{"domain"})
	return s
}

// NewDomains returns the service on an engine per domain (one per
// envoyproxy/ratelimit configuration file, see package erl).
func NewDomains(domains map[string]Domain, log *slog.Logger) *Server {
	s := New(nil, log)
	m := maps.Clone(domains)
	s.domains.Store(&m)
	return s
}

// SetDomain makes d decide domain name from the next request on (a reloaded
// envoyproxy/ratelimit file). It is safe while the service serves.
func (s *Server) SetDomain(name string, d Domain) {
	s.domainsMu.Lock()
	defer s.domainsMu.Unlock()
	var m map[string]Domain
	if cur := s.domains.Load(); cur != nil {
		m = maps.Clone(*cur)
	} else {
		m = map[string]Domain{}
	}
	m[name] = d
	s.domains.Store(&m)
}

// SetDomains makes domains the whole set of domains decided from the next request
// on: a domain it leaves out is unknown from then on (a reloaded
// envoyproxy/ratelimit directory). It is safe while the service serves.
func (s *Server) SetDomains(domains map[string]Domain) {
	s.domainsMu.Lock()
	defer s.domainsMu.Unlock()
	m := maps.Clone(domains)
	if m == nil {
		m = map[string]Domain{}
	}
	s.domains.Store(&m)
}

// ServerOptions are the options of the gRPC server the service runs on: requests run
// on a pool of goroutines that keep the stacks they have grown (a goroutine per
// request, grpc-go's default, spent a tenth of BenchmarkShouldRateLimit's CPU growing
// its stack), and on new ones when the pool is busy.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.NumStreamWorkers(uint32(32 * runtime.GOMAXPROCS(0)))}
}

// domain returns what decides a domain, and the domain to ask its engine for: a
// translated file's policy names its domain as tollgate's names allow
// (erl.DomainName, which leaves a valid name as it is), where Envoy sends the domain
// as the file spells it. The engine still checks that its policy decides that domain.
// ok is false for a domain the service does not decide.
func (s *Server) domain(name string) (d Domain, domain string, ok bool) {
	if s.eng != nil {
		return Domain{Engine: s.eng}, name, name == s.eng.Policy().Domain
	}
	if m := s.domains.Load(); m != nil {
		if d, ok := (*m)[name]; ok {
			if d.Engine.Policy().Domain == name {
				return d, name, true // the name was valid as it is: no need to fit it
			}
			return d, erl.DomainName(name), true
		}
	}
	return Domain{}, "", false
}

// ShouldRateLimit decides every descriptor of req together. A caller's mistake is
// INVALID_ARGUMENT; a Redis failure under the failure mode closed is UNAVAILABLE, so
// that Envoy's failure_mode_deny decides, and under open or local an answer.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	dom, domain, known := s.domain(req.GetDomain())
	if !known {
		if err := shape(req); err != nil {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		s.unknown.add(s.log, req.GetDomain())
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.Descriptors))}
		for i := range resp.Statuses {
			resp.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		}
		return resp, nil
	}
	eng := dom.Engine
	plans, unlimited, err := plan(eng, domain, dom.Unlimited, req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	joint := engine.Join(plans)
	joint.Replace(dom.Replaces)
	// An unlimited rule has no items for Replace to find: what it replaces goes here.
	var gone []string
	for _, u := range unlimited {
		if u != "" {
			gone = append(gone, dom.Replaces[u]...)
		}
	}
	if len(gone) > 0 {
		joint.Items = slices.DeleteFunc(joint.Items, func(it engine.Item) bool { return slices.Contains(gone, it.Rule.Name) })
	}
	var v engine.Verdict
	if joint.Settle {
		if v, err = eng.Settle(ctx, joint); err != nil {
			return nil, s.settleFailed(req, joint, err)
		}
	} else if v = eng.Decide(ctx, joint); v.Reason == engine.ReasonUnavailable {
		return nil, status.Error(codes.Unavailable, "tollgate: Redis is unavailable and the policy's failure mode is closed")
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(plans))}
	if !v.Allowed {
		resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	for g := range plans {
		resp.Statuses[g] = descriptorStatus(v, joint, g, unlimited[g] != "", dom.Names)
	}
	names := s.OneQuota
	if s.EveryDescriptor {
		names = algo.OneQuotaNames{}
	}
	for _, kv := range v.HeadersNamed(names) {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &commonv3.HeaderValue{Key: kv[0], Value: kv[1]})
	}
	if s.EveryDescriptor {
		resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, everyDescriptor(resp.Statuses, s.OneQuota)...)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT && (s.Shadow || s.Quota) {
		// Passed: no Retry-After on an answer that lets the request through.
		resp.OverallCode = rlsv3.RateLimitResponse_OK
		resp.ResponseHeadersToAdd = slices.DeleteFunc(resp.ResponseHeadersToAdd, func(h *commonv3.HeaderValue) bool { return h.Key == "Retry-After" })
		for _, st := range resp.Statuses {
			if s.Quota && st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
				st.Code = rlsv3.RateLimitResponse_OK
			}
		}
	}
	return resp, nil
}

// settleFailed answers a settlement the engine did not make: INVALID_ARGUMENT for a
// caller's mistake, else UNAVAILABLE. Envoy ignores the answer of a call made when
// the stream is done (apply_on_stream_done) and does not send it again, so the
// failure is logged here and its units counted by the engine's hooks
// (tollgate_settle_failed_units_total): they are the signal.
func (s *Server) settleFailed(req *rlsv3.RateLimitRequest, p engine.Plan, err error) error {
	if errors.Is(err, engine.ErrBadRequest) {
		return status.Error(codes.InvalidArgument, err.Error())
	}
	s.log.Error("a settlement (a cost already spent) was not charged; Envoy does not send a response-phase call again, so these units are lost to the count", "domain", req.GetDomain(), "units", p.Cost, "err", err)
	return status.Error(codes.Unavailable, "tollgate: the settlement was not charged: "+err.Error())
}

// everyDescriptor returns the one-quota headers named by names for each status that
// has a limit, in order: its requests per unit, its remaining and the seconds until
// its reset.
func everyDescriptor(sts []*rlsv3.RateLimitResponse_DescriptorStatus, names algo.OneQuotaNames) []*commonv3.HeaderValue {
	var out []*commonv3.HeaderValue
	for _, st := range sts {
		if st.GetCurrentLimit() == nil {
			continue
		}
		for _, f := range []struct {
			name  string
			value int64
		}{{names.Limit, int64(st.CurrentLimit.GetRequestsPerUnit())}, {names.Remaining, int64(st.GetLimitRemaining())}, {names.Reset, algo.Seconds(st.GetDurationUntilReset().AsDuration())}} {
			if f.name != "" {
				out = append(out, &commonv3.HeaderValue{Key: f.name, Value: strconv.FormatInt(f.value, 10)})
			}
		}
	}
	return out
}

// shape checks what every request must be, whatever its domain: one descriptor at
// least, at most MaxDescriptors.
func shape(req *rlsv3.RateLimitRequest) error {
	switch n := len(req.GetDescriptors()); {
	case n == 0:
		return errors.New("no descriptors; send at least one")
	case n > MaxDescriptors:
		return fmt.Errorf("%d descriptors; at most %d", n, MaxDescriptors)
	}
	return nil
}

// plan turns each descriptor into a plan of eng for domain, and names for each the
// rule of those named unlimitedRules that reaches it, if any. A descriptor entry's key is the
// attribute erl.AttrName names, which is the key itself when it is one of tollgate's
// attribute names, or erl.EntryAttribute's of its place when an earlier entry has the
// same key.
func plan(eng *engine.Engine, domain string, unlimitedRules []string, req *rlsv3.RateLimitRequest) ([]engine.Plan, []string, error) {
	if err := shape(req); err != nil {
		return nil, nil, err
	}
	// As in ERL, a descriptor's hits_addend takes the place of the request's, which is
	// 1 when unset (0) for a check; a descriptor's own 0 checks without charging. A
	// settlement is the cost Envoy read after the response: a request's 0 settles 0.
	cost := func(d *rlv3.RateLimitDescriptor, settle bool) int64 {
		if h := d.GetHitsAddend(); h != nil {
			return int64(h.GetValue())
		}
		if settle {
			return int64(req.GetHitsAddend())
		}
		return int64(max(1, req.GetHitsAddend()))
	}
	plans := make([]engine.Plan, 0, len(req.Descriptors))
	unlimited := make([]string, len(req.Descriptors))
	for i, d := range req.Descriptors {
		if err := supported(d); err != nil {
			return nil, nil, fmt.Errorf("descriptors[%d]: %w", i, err)
		}
		attrs := make(map[string]string, len(d.GetEntries())+1)
		keys := make([]string, 0, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			name := erl.AttrName(e.GetKey())
			if _, dup := attrs[name]; dup {
				// A descriptor is an ordered list: a key may repeat.
				name = erl.EntryAttribute(j)
			}
			attrs[name] = e.GetValue()
			keys = append(keys, e.GetKey())
		}
		// Rules translated from envoyproxy/ratelimit's configuration match on it.
		attrs[erl.KeysAttribute] = strings.Join(keys, ",")
		p, err := eng.Plan(engine.Request{Domain: domain, Attributes: attrs, Cost: cost(d, false)})
		switch {
		case err == nil && d.GetLimit() != nil:
			err = override(&p, eng.Policy(), d)
		case err == nil && len(unlimitedRules) > 0:
			unlimited[i] = reaches(eng.Policy(), unlimitedRules, p.Attributes)
		}
		if err != nil {
			return nil, nil, fmt.Errorf("descriptors[%d]: %w", i, err)
		}
		plans = append(plans, p)
	}
	settle, err := settles(plans)
	if err != nil {
		return nil, nil, err
	}
	for i, d := range req.Descriptors {
		plans[i].Settle = settle
		plans[i].Cost = cost(d, settle)
		if c, c0 := plans[i].Cost, plans[0].Cost; c != c0 {
			return nil, nil, fmt.Errorf("descriptors[%d]: a cost (hits_addend) of %d where descriptors[0] has %d; tollgate decides every descriptor of a request together at one cost, so send one hits_addend", i, c, c0)
		}
	}
	return plans, unlimited, nil
}

// settles reports whether the descriptors planned in plans are a settlement (their
// rules are marked settle: Envoy's response-phase call), refusing a request whose
// descriptors disagree. A descriptor that reaches no limit has no say.
func settles(plans []engine.Plan) (bool, error) {
	first := -1
	for i, p := range plans {
		if len(p.Items) == 0 {
			continue
		}
		if first < 0 {
			first = i
			continue
		}
		if p.Settle != plans[first].Settle {
			s, d := i, first
			if plans[first].Settle {
				s, d = first, i
			}
			return false, fmt.Errorf("descriptors[%d] reaches rule %q, which settles (a cost already spent), and descriptors[%d] reaches rule %q, which decides; a request is one or the other: send the response-phase descriptors (those that settle) in a rate limit of their own, with apply_on_stream_done, and mark only them (e.g. a generic_key entry that only they carry)", s, settlingRule(plans[s]), d, plans[d].Items[0].Rule.Name)
		}
	}
	return first >= 0 && plans[first].Settle, nil
}

// settlingRule names the first rule of p that settles.
func settlingRule(p engine.Plan) string {
	for _, it := range p.Items {
		if it.Rule.Settle {
			return it.Rule.Name
		}
	}
	return p.Items[0].Rule.Name
}

// reaches returns the first of the rules of pol named names that applies to attrs and
// is not replaced, or "": an unlimited rule has no items in a plan to say so.
func reaches(pol *policy.Policy, names []string, attrs map[string]string) string {
	for _, r := range pol.Rules {
		if !r.Unlimited || !slices.Contains(names, r.Name) {
			continue
		}
		if r.WhyNot(attrs) == "" && r.ReplacedBy(attrs) == "" {
			return r.Name
		}
	}
	return ""
}

// descriptorStatus is the status of descriptor g of the joint plan p, as
// envoyproxy/ratelimit states it: its most restrictive non-shadow limit in the
// verdict v, else its most restrictive shadow limit (OK, even when over), else OK with
// no limit, and 4294967295 remaining when an unlimited rule reaches it. An
// over-limit status has 0 remaining (tollgate charged nothing, so the count may still
// have room for a smaller request; ERL reports 0).
func descriptorStatus(v engine.Verdict, p engine.Plan, g int, unlimited bool, names map[string]string) *rlsv3.RateLimitResponse_DescriptorStatus {
	st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	in := func(l engine.LimitResult) bool { return p.Items[l.Item].In(g) }
	i := v.MostRestrictive(in)
	if i < 0 {
		i = algo.MostRestrictive(len(v.Limits), func(i int) (algo.Decision, bool) {
			return v.Limits[i].Decision, v.Limits[i].Shadow && in(v.Limits[i])
		})
	}
	if i < 0 {
		if unlimited {
			st.LimitRemaining = 1<<32 - 1
		}
		return st
	}
	pick := v.Limits[i]
	if !pick.Allowed && !pick.Shadow {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	q, w := pick.Stated()
	unit, per := unitOf(w, q)
	if u, ok := calendarUnits[pick.Spec.Calendar.Unit]; ok {
		unit, per = u, uint32(min(q, 1<<32-1))
	}
	name := pick.Quota
	if names != nil {
		name = names[pick.Rule]
	}
	st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: per, Unit: unit}
	if pick.Allowed {
		st.LimitRemaining = uint32(min(max(0, pick.Remaining), 1<<32-1))
	}
	st.DurationUntilReset = durationpb.New(pick.ResetAfter)
	return st
}

// supported refuses what tollgate does not decide yet rather than decide it wrongly.
func supported(d *rlv3.RateLimitDescriptor) error {
	if d.GetIsNegativeHits() {
		return errors.New("negative hits are not supported")
	}
	return nil
}

// OverrideRule names the rule of a descriptor's own limit in keys, headers and
// statuses.
const OverrideRule = "descriptor-limit"

// override replaces what the policy matched for descriptor d (planned in p) with the
// limit d carries, keyed by the descriptor's entries and the limit.
func override(p *engine.Plan, pol *policy.Policy, d *rlv3.RateLimitDescriptor) error {
	o := d.GetLimit()
	if o.GetRequestsPerUnit() == 0 {
		return errors.New("limit.requests_per_unit is 0; send at least 1 (or leave limit unset to use the policy's)")
	}
	mult := int64(1)
	if m := o.GetUnitMultiplier(); m != nil {
		if m.GetValue() == 0 {
			return errors.New("limit.unit_multiplier is 0; send at least 1, or leave it unset for 1")
		}
		mult = int64(m.GetValue())
	}
	var l algo.Limit
	// Envoy's units are ERL's, month and year counted as ERL counts them.
	switch u, ok := erl.UnitPeriod(o.GetUnit().String()); {
	case ok:
		if mult > int64(algo.MaxPeriod/u) {
			return fmt.Errorf("limit: %d × %v is longer than %v; send a shorter window", mult, o.GetUnit(), algo.MaxPeriod)
		}
		l = algo.Limit{Algorithm: algo.FixedWindow, Count: int64(o.GetRequestsPerUnit()), Period: time.Duration(mult) * u}
	default:
		return fmt.Errorf("limit.unit %v is not a unit; use SECOND, MINUTE, HOUR, DAY, MONTH or YEAR", o.GetUnit())
	}
	if err := l.Validate(); err != nil {
		return fmt.Errorf("limit: %w", err)
	}
	m := algo.Meter{Limits: []algo.Limit{l}}
	esc := make([]string, 0, len(d.GetEntries()))
	for _, e := range d.GetEntries() {
		esc = append(esc, algo.Escape(e.GetKey())+"="+algo.Escape(e.GetValue()))
	}
	identity := strings.Join(esc, ":")
	// The count is in the key: two overrides of one descriptor never share a count
	// (algo.MeterID leaves it out, so that a policy's limit keeps its state).
	id := algo.MeterID(0, m) + "." + strconv.FormatInt(l.Count, 10)
	key := algo.Key(pol.Prefix, OverrideRule+":"+identity, OverrideRule, identity, id)
	p.Only(engine.Item{Key: key, Meter: m, Rule: &policy.Rule{Name: OverrideRule, Limits: []policy.RuleLimit{{Limit: l}}, Meters: []policy.RuleMeter{{Meter: m, ID: id}}}})
	return nil
}

// calendarUnits are Envoy's units for calendar limits, whose windows vary in length.
var calendarUnits = map[algo.CalendarUnit]rlsv3.RateLimitResponse_RateLimit_Unit{
	algo.CalendarDay:   rlsv3.RateLimitResponse_RateLimit_DAY,
	algo.CalendarWeek:  rlsv3.RateLimitResponse_RateLimit_WEEK,
	algo.CalendarMonth: rlsv3.RateLimitResponse_RateLimit_MONTH,
}

// unitOf states a quota of q units per window w in Envoy's units: the largest unit
// the window is a whole number of, with requests_per_unit scaled down to it (a
// window that is no whole number of seconds is stated per second).
func unitOf(w time.Duration, q int64) (rlsv3.RateLimitResponse_RateLimit_Unit, uint32) {
	const day = 24 * time.Hour
	units := []struct {
		d time.Duration
		u rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		// envoyproxy/ratelimit's year, month and week: 365, 30 and 7 days.
		{365 * day, rlsv3.RateLimitResponse_RateLimit_YEAR},
		{30 * day, rlsv3.RateLimitResponse_RateLimit_MONTH},
		{7 * day, rlsv3.RateLimitResponse_RateLimit_WEEK},
		{day, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
	}
	for _, u := range units {
		if w >= u.d && w%u.d == 0 {
			return u.u, uint32(min(max(1, q/int64(w/u.d)), 1<<32-1))
		}
	}
	secs := max(1, int64(w/time.Second))
	return rlsv3.RateLimitResponse_RateLimit_SECOND, uint32(min(max(1, q/secs), 1<<32-1))
}

// JSONHandler answers envoyproxy/ratelimit's HTTP endpoint, POST /json: the
// RateLimitRequest and RateLimitResponse in protobuf's JSON form, 200 when OK, 429
// when over the limit, 400 with {"error": …} for a request it cannot decide, 503
// when Redis is down and the failure mode is closed.
func (s *Server) JSONHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, bounds.MaxBody+1))
		if err != nil || len(body) > bounds.MaxBody {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("the body must be a RateLimitRequest of at most %d bytes", bounds.MaxBody))
			return
		}
		var req rlsv3.RateLimitRequest
		if err := protojson.Unmarshal(body, &req); err != nil {
			writeError(w, http.StatusBadRequest, "not a RateLimitRequest in JSON: "+err.Error())
			return
		}
		resp, err := s.ShouldRateLimit(r.Context(), &req)
		if err != nil {
			code := http.StatusBadRequest
			if status.Code(err) == codes.Unavailable {
				code = http.StatusServiceUnavailable
			}
			writeError(w, code, status.Convert(err).Message())
			return
		}
		out, err := protojson.Marshal(resp)
		if err != nil {
			s.log.Error("encoding a RateLimitResponse", "err", err)
			writeError(w, http.StatusInternalServerError, "internal error")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		w.Write(out)
	})
}

func writeError(w http.ResponseWriter, code int, msg string) {
	b, _ := json.Marshal(map[string]string{"error": msg})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}
