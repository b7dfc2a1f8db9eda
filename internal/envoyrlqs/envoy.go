// Package envoyrlqs is test support: a simulated Envoy whose
// envoy.filters.http.rate_limit_quota filter talks to a Rate Limit Quota
// Service (RLQS) the way Envoy's own filter does. It is written from Envoy's
// source (source/extensions/filters/http/rate_limit_quota/: filter.cc,
// global_client_impl.cc, filter_persistence.cc, matcher.cc, and
// source/common/common/token_bucket_impl.h) and the protos
// envoy/service/rate_limit_quota/v3/rlqs.proto and
// envoy/extensions/filters/http/rate_limit_quota/v3/rate_limit_quota.proto.
// Each comment that says "Envoy" states what that code does. The product
// never imports this package.
package envoyrlqs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// EnvoyReportInterval is how often Envoy reports usage: filter_persistence.cc
// hard-codes 5 s for every bucket whatever reporting_interval says (a TODO in
// Envoy's code).
const EnvoyReportInterval = 5 * time.Second

// A Value builds one entry of a bucket id, as a BucketIdBuilder's
// ValueBuilder does: a fixed string (string_value), or the value of a request
// header (custom_value with a request header input).
type Value struct {
	String string // used when Header is empty
	Header string // the request header whose value is the entry
}

// A Clock tells the time. Envoy reads a monotonic clock; tests may pass a
// fake one.
type Clock interface{ Now() time.Time }

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Config is one simulated Envoy's filter configuration and harness settings.
type Config struct {
	// Domain is sent in every usage report (RateLimitQuotaFilterConfig.domain).
	Domain string
	// Servers are the RLQS servers' gRPC addresses (host:port), in the order
	// the Envoy tries them: its first stream goes to Servers[0]; when a
	// stream breaks the next one is opened to the next server that accepts a
	// stream, as Envoy's gRPC cluster would pick another healthy host.
	Servers []string
	// Clients, instead of Servers, are RLQS clients the Envoy opens its
	// streams on, in the same order (e.g. a test's in-process client); Server
	// then names them "client 0", "client 1", and so on.
	Clients []rlqspb.RateLimitQuotaServiceClient
	// BucketID builds each request's bucket id (bucket_id_builder). A
	// request that lacks a header named here is allowed and never reported,
	// as Envoy fails open when it cannot build the id; a header whose value is
	// empty leaves its entry out of the id.
	BucketID map[string]Value
	// NoAssignment is no_assignment_behavior.fallback_rate_limit: what a
	// bucket does before its first assignment and after one expires. Nil:
	// ALLOW_ALL (Envoy's default). Envoy enforces blanket rules here; it has no
	// token bucket for this action (a token_bucket here crashes Envoy), so New
	// refuses one.
	NoAssignment *typev3.RateLimitStrategy
	// ExpiredFallback is expired_assignment_behavior.fallback_rate_limit: what
	// a bucket does for ExpiredFallbackTimeout (whole seconds, as Envoy reads
	// only the seconds) after its assignment's time to live ends, before it
	// falls back to NoAssignment. Nil: straight to NoAssignment.
	ExpiredFallback        *typev3.RateLimitStrategy
	ExpiredFallbackTimeout time.Duration
	// ReportInterval is the time between usage reports. Zero means
	// EnvoyReportInterval, which is what Envoy does; tests set a shorter one
	// to run faster. Negative: no timer; call Report to send one.
	ReportInterval time.Duration
	// Window is the length of the windows Stats counts admissions in,
	// aligned to the Unix epoch. Zero: one second.
	Window time.Duration
	// Clock tells the time; nil: the real clock.
	Clock Clock
	// ReplaceFull makes a changed token_bucket assignment start its new
	// bucket full, as Envoy did before PR 37624 (released in 1.33): since
	// then the new bucket starts with the old one's ratio of remaining to
	// maximum tokens, so an Envoy that spent its whole bucket starts the next
	// one empty. False: today's Envoy.
	ReplaceFull bool
	// OnResponse, if set, sees each response before the Envoy applies it
	// (for a test's log); it must not call the Envoy.
	OnResponse func(*rlqspb.RateLimitQuotaResponse)
}

// Counts are requests admitted and denied. Unassigned counts the admitted
// requests that no assignment of the server's admitted: a new bucket's first
// request and those under no_assignment_behavior or
// expired_assignment_behavior.
type Counts struct{ Admitted, Denied, Unassigned int64 }

// bucketState is where a bucket is in Envoy's cascade of actions.
type bucketState int

const (
	stateDefault  bucketState = iota // no assignment: NoAssignment (or ALLOW_ALL)
	stateAssigned                    // the server's action, until its TTL
	stateFallback                    // ExpiredFallback, until its timeout
)

// bucket is one entry of Envoy's bucket cache (CachedBucket).
type bucket struct {
	id      map[string]string
	key     string
	state   bucketState
	action  *typev3.RateLimitStrategy // in force when state != stateDefault; nil: fail open
	tb      *tokenBucket              // for a token_bucket action
	expires time.Time                 // end of stateAssigned or stateFallback
	// Usage since the last report, and when that was (QuotaUsage).
	allowed, denied uint64
	lastReport      time.Time
}

// Envoy is one simulated Envoy process: one bucket cache and one RLQS stream
// per server and domain, shared by all its requests (Envoy keys its client by
// target and domain in filter_persistence.cc, so all workers share it). It is
// safe for concurrent use.
type Envoy struct {
	cfg   Config
	clock Clock
	epoch time.Time // the zero of the token buckets' seconds

	mu        sync.Mutex
	buckets   map[string]*bucket
	started   bool // the first bucket started the stream and the timer
	targets   []target
	server    int // index in targets of the server the stream is on
	stream    grpc.BidiStreamingClient[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]
	cancel    context.CancelFunc           // ends stream
	conns     []*grpc.ClientConn           // dialled for Servers, closed by Close
	stats     map[string]map[int64]*Counts // bucket key -> window index -> counts
	unmatched int64
	reports   Reports
	responses int
	changed   *sync.Cond // broadcast on each response processed and stream change
	closed    bool
	stop      chan struct{}
	done      sync.WaitGroup
}

// A target is one RLQS server the Envoy may open its stream to.
type target struct {
	name   string
	client rlqspb.RateLimitQuotaServiceClient
}

// Reports counts what the Envoy sent and lost.
type Reports struct {
	Sent    int // usage report messages sent on a stream
	Dropped int // reports due while no stream would open: their usage is lost
	Opened  int // streams opened
	Broken  int // streams that ended (the server closed or broke them)
}

// New returns a simulated Envoy. It opens no stream until its first request
// that makes a bucket, as Envoy opens its stream on the first bucket.
func New(cfg Config) (*Envoy, error) {
	if cfg.Domain == "" {
		return nil, errors.New("envoyrlqs: Config.Domain is empty; Envoy requires a domain")
	}
	if len(cfg.Servers) == 0 && len(cfg.Clients) == 0 {
		return nil, errors.New("envoyrlqs: Config.Servers and Config.Clients are empty; give at least one RLQS address or client")
	}
	if len(cfg.Servers) > 0 && len(cfg.Clients) > 0 {
		return nil, errors.New("envoyrlqs: both Config.Servers and Config.Clients are set; give one of them")
	}
	if len(cfg.BucketID) == 0 {
		return nil, errors.New("envoyrlqs: Config.BucketID is empty; Envoy ignores responses for an empty bucket id")
	}
	if cfg.NoAssignment.GetTokenBucket() != nil {
		return nil, errors.New("envoyrlqs: Config.NoAssignment is a token_bucket; Envoy builds no token bucket for its default action (it would crash), use a blanket_rule")
	}
	if cfg.ReportInterval == 0 {
		cfg.ReportInterval = EnvoyReportInterval
	}
	if cfg.Window <= 0 {
		cfg.Window = time.Second
	}
	clock := cfg.Clock
	if clock == nil {
		clock = realClock{}
	}
	e := &Envoy{
		cfg: cfg, clock: clock, epoch: clock.Now(),
		buckets: map[string]*bucket{},
		stats:   map[string]map[int64]*Counts{},
		stop:    make(chan struct{}),
	}
	for i, c := range cfg.Clients {
		e.targets = append(e.targets, target{fmt.Sprintf("client %d", i), c})
	}
	for _, addr := range cfg.Servers {
		// grpc.NewClient connects lazily: a server that is down fails the
		// stream's opening, not this.
		cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			e.closeConns()
			return nil, fmt.Errorf("envoyrlqs: Config.Servers: %q: %w", addr, err)
		}
		e.conns = append(e.conns, cc)
		e.targets = append(e.targets, target{addr, rlqspb.NewRateLimitQuotaServiceClient(cc)})
	}
	e.changed = sync.NewCond(&e.mu)
	return e, nil
}

// seconds is t on the token buckets' clock.
func (e *Envoy) seconds(t time.Time) float64 { return t.Sub(e.epoch).Seconds() }

// bucketKey is a bucket id's key in the cache: its entries sorted (Envoy
// hashes the BucketId message).
func bucketKey(id map[string]string) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(id)) {
		fmt.Fprintf(&b, "%q=%q;", k, id[k])
	}
	return b.String()
}

// Key returns the key Stats uses for the bucket id id.
func Key(id map[string]string) string { return bucketKey(id) }

// A Decision is what the filter did with one request.
type Decision struct {
	Allowed bool
	// Bucket is the key of the request's bucket; empty when the request
	// matched no bucket (Envoy allows it and never reports it).
	Bucket string
}

// Request runs one request with the headers given through the filter.
func (e *Envoy) Request(headers map[string]string) Decision {
	id := map[string]string{}
	for k, v := range e.cfg.BucketID {
		if v.Header == "" {
			id[k] = v.String
			continue
		}
		hv, ok := headers[v.Header]
		if !ok {
			e.mu.Lock()
			e.unmatched++
			e.mu.Unlock()
			return Decision{Allowed: true}
		}
		if hv != "" {
			id[k] = hv
		}
	}
	key := bucketKey(id)
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock.Now()
	b, ok := e.buckets[key]
	var allowed bool
	if !ok {
		// A new bucket: its first request is allowed unless
		// no_assignment_behavior is a blanket DENY_ALL (filter.cc
		// noAssignmentBehaviorShouldAllow), counted in its usage, and reported
		// at once on its own with time_elapsed 0 (createBucketImpl).
		allowed = !(e.cfg.NoAssignment.GetStrategy() != nil && e.cfg.NoAssignment.GetBlanketRule() == typev3.RateLimitStrategy_DENY_ALL)
		b = &bucket{id: id, key: key, lastReport: now}
		if allowed {
			b.allowed = 1
		} else {
			b.denied = 1
		}
		e.buckets[key] = b
		e.count(key, now, allowed, allowed)
		e.startLocked()
		e.sendLocked(e.usageReports([]*bucket{b}, now))
		return Decision{Allowed: allowed, Bucket: key}
	}
	e.expireLocked(b, now)
	allowed = e.allowLocked(b, now)
	if allowed {
		b.allowed++
	} else {
		b.denied++
	}
	e.count(key, now, allowed, allowed && b.state != stateAssigned)
	return Decision{Allowed: allowed, Bucket: key}
}

// allowLocked is filter.cc's shouldAllowRequest: the bucket's action in force,
// else its default action.
func (e *Envoy) allowLocked(b *bucket, now time.Time) bool {
	s := e.cfg.NoAssignment
	if b.state != stateDefault {
		s = b.action
	}
	switch s.GetStrategy().(type) {
	case *typev3.RateLimitStrategy_BlanketRule_:
		return s.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL
	case *typev3.RateLimitStrategy_TokenBucket:
		return b.tb.take(e.seconds(now))
	default:
		// requests_per_time_unit ("not yet supported"), an unset strategy,
		// or no action at all: allowed.
		return true
	}
}

// expireLocked applies, in order, the timers Envoy would have fired on b by
// now: the assignment's time to live (onActionExpirationTimer) and then the
// expired-assignment fallback's timeout (onFallbackExpirationTimer).
func (e *Envoy) expireLocked(b *bucket, now time.Time) {
	for b.state != stateDefault && !now.Before(b.expires) {
		at := b.expires
		if b.state == stateFallback || e.cfg.ExpiredFallback == nil {
			// Back to the default action; the token bucket is dropped.
			b.state, b.action, b.tb = stateDefault, nil, nil
			return
		}
		fb := e.cfg.ExpiredFallback
		if tb := fb.GetTokenBucket(); tb != nil {
			if b.action.GetTokenBucket() == nil || !sameTokenBucket(tb, b.action.GetTokenBucket()) {
				b.tb = newTokenBucket(tb, e.seconds(at), b.tb)
			} // else the running bucket carries over
		} else {
			b.tb = nil
		}
		b.state, b.action = stateFallback, fb
		b.expires = at.Add(e.cfg.ExpiredFallbackTimeout.Truncate(time.Second))
	}
}

// count adds one request to the Stats of bucket key; unassigned: admitted by
// no assignment of the server's.
func (e *Envoy) count(key string, now time.Time, allowed, unassigned bool) {
	w := now.UnixNano() / int64(e.cfg.Window)
	m := e.stats[key]
	if m == nil {
		m = map[int64]*Counts{}
		e.stats[key] = m
	}
	c := m[w]
	if c == nil {
		c = &Counts{}
		m[w] = c
	}
	if allowed {
		c.Admitted++
	} else {
		c.Denied++
	}
	if unassigned {
		c.Unassigned++
	}
}

// usageReports builds one message with the usage of bs, resetting their
// counters, with time_elapsed in whole seconds rounded down since each
// bucket's last report (getUsageFromBucket).
func (e *Envoy) usageReports(bs []*bucket, now time.Time) *rlqspb.RateLimitQuotaUsageReports {
	r := &rlqspb.RateLimitQuotaUsageReports{Domain: e.cfg.Domain}
	for _, b := range bs {
		elapsed := now.Sub(b.lastReport).Truncate(time.Second)
		r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:           &rlqspb.BucketId{Bucket: maps.Clone(b.id)},
			TimeElapsed:        durationpb.New(elapsed),
			NumRequestsAllowed: b.allowed,
			NumRequestsDenied:  b.denied,
		})
		b.allowed, b.denied, b.lastReport = 0, 0, now
	}
	return r
}

// startLocked starts the report timer and the stream on the first bucket
// (createBucketImpl: startSendReportsTimerImpl, then startStreamImpl; if the
// stream does not start, usage keeps being collected and the timer retries).
func (e *Envoy) startLocked() {
	if e.started {
		return
	}
	e.started = true
	if e.cfg.ReportInterval > 0 {
		e.done.Add(1)
		go e.tick()
	}
	e.openLocked(0)
}

func (e *Envoy) tick() {
	defer e.done.Done()
	t := time.NewTicker(e.cfg.ReportInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
			e.Report()
		}
	}
}

// Report does what Envoy's report timer does (onSendReportsTimer): build one
// message with every bucket's usage (resetting the counters; with no bucket
// left, a message with the domain alone), reopen the
// stream if it is closed — at once, with no backoff — and send it; when no
// stream opens, the usage is dropped.
func (e *Envoy) Report() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed || !e.started {
		return
	}
	now := e.clock.Now()
	bs := slices.Collect(maps.Values(e.buckets))
	r := e.usageReports(bs, now)
	if e.stream == nil {
		// Try the next server first: the one the stream was on broke it.
		if !e.openLocked(e.server + 1) {
			e.reports.Dropped++
			return
		}
	}
	e.sendLocked(r)
}

// openLocked opens a stream to the first server, from index from on (round
// the list), that accepts one.
func (e *Envoy) openLocked(from int) bool {
	for i := range e.targets {
		idx := (from + i) % len(e.targets)
		client := e.targets[idx].client
		ctx, cancel := context.WithCancel(context.Background())
		// Fail fast (gRPC's default): a server that does not answer makes
		// NewStream fail once the connection attempt does; the timer bounds
		// a connection attempt that hangs.
		opened := make(chan error, 1)
		var s grpc.BidiStreamingClient[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]
		go func() {
			var err error
			s, err = client.StreamRateLimitQuotas(ctx)
			opened <- err
		}()
		var err error
		select {
		case err = <-opened:
		case <-time.After(2 * time.Second):
			cancel()
			err = <-opened
		}
		if err != nil {
			cancel()
			continue
		}
		e.stream, e.cancel, e.server = s, cancel, idx
		e.reports.Opened++
		e.done.Add(1)
		go e.receive(s)
		e.changed.Broadcast()
		return true
	}
	return false
}

// sendLocked sends r on the stream, if there is one (sendUsageReportImpl: with
// no stream the message is dropped).
func (e *Envoy) sendLocked(r *rlqspb.RateLimitQuotaUsageReports) {
	if e.stream == nil {
		e.reports.Dropped++
		return
	}
	if err := e.stream.Send(r); err != nil {
		// The stream is broken; its receive loop sees the error and closes
		// it. The report is lost, as a message Envoy writes to a dead stream.
		e.reports.Dropped++
		return
	}
	e.reports.Sent++
}

// receive reads responses on s until it ends, then marks the stream closed
// (onRemoteClose) so that the next report reopens one.
func (e *Envoy) receive(s grpc.BidiStreamingClient[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) {
	defer e.done.Done()
	for {
		resp, err := s.Recv()
		if err != nil {
			e.mu.Lock()
			if e.stream == s {
				e.stream = nil
				e.cancel()
				if !e.closed {
					e.reports.Broken++
				}
				e.changed.Broadcast()
			}
			e.mu.Unlock()
			return
		}
		if e.cfg.OnResponse != nil {
			e.cfg.OnResponse(resp)
		}
		e.Apply(resp)
	}
}

// Apply processes one response from the server, as onQuotaResponseImpl does.
// The receive loop calls it; tests may call it to inject a response.
func (e *Envoy) Apply(resp *rlqspb.RateLimitQuotaResponse) {
	e.mu.Lock()
	defer e.mu.Unlock()
	now := e.clock.Now()
	for _, a := range resp.GetBucketAction() {
		// An action without a bucket id, or for a bucket not in the cache,
		// is logged and skipped.
		if len(a.GetBucketId().GetBucket()) == 0 {
			continue
		}
		b := e.buckets[bucketKey(a.GetBucketId().GetBucket())]
		if b == nil {
			continue
		}
		e.expireLocked(b, now)
		if a.GetAbandonAction() != nil {
			// Abandon erases the bucket and its unreported usage; the next
			// request makes it anew (a first request, reported at once).
			delete(e.buckets, b.key)
			continue
		}
		qa := a.GetQuotaAssignmentAction()
		s := qa.GetRateLimitStrategy()
		if qa != nil {
			switch s.GetStrategy().(type) {
			case *typev3.RateLimitStrategy_BlanketRule_:
				b.tb = nil
			case *typev3.RateLimitStrategy_TokenBucket:
				// A new or different token bucket replaces the running one
				// (starting with its fill ratio); an equal one keeps it.
				var cur *typev3.TokenBucket
				if b.state != stateDefault {
					cur = b.action.GetTokenBucket()
				}
				if cur == nil || !sameTokenBucket(s.GetTokenBucket(), cur) {
					prev := b.tb
					if e.cfg.ReplaceFull {
						prev = nil
					}
					b.tb = newTokenBucket(s.GetTokenBucket(), e.seconds(now), prev)
				}
			default:
				// requests_per_time_unit ("not yet supported") or no
				// strategy: skipped; the bucket keeps its action and timers.
				continue
			}
		} else {
			// Neither assignment nor abandon: Envoy caches the empty action
			// (which fails open) with a time to live of 0.
			b.tb = nil
		}
		b.state, b.action = stateAssigned, s
		// The time to live counts whole seconds (only .seconds is read);
		// unset or under 1 s expires at once.
		b.expires = now.Add(time.Duration(qa.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
	}
	e.responses++
	e.changed.Broadcast()
}

// WaitResponses waits until the Envoy has processed at least n responses in
// all, or ctx ends.
func (e *Envoy) WaitResponses(ctx context.Context, n int) error {
	stop := context.AfterFunc(ctx, func() {
		e.mu.Lock()
		e.changed.Broadcast()
		e.mu.Unlock()
	})
	defer stop()
	e.mu.Lock()
	defer e.mu.Unlock()
	for e.responses < n {
		if ctx.Err() != nil {
			return fmt.Errorf("envoyrlqs: %d responses processed, want %d: %w", e.responses, n, ctx.Err())
		}
		e.changed.Wait()
	}
	return nil
}

// Responses returns how many responses the Envoy has processed.
func (e *Envoy) Responses() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.responses
}

// Server returns the address the stream is open to (with Config.Clients,
// "client N"), or "" when none is.
func (e *Envoy) Server() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stream == nil {
		return ""
	}
	return e.targets[e.server].name
}

// ReportCounts returns what the Envoy has sent and lost.
func (e *Envoy) ReportCounts() Reports {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.reports
}

// Unmatched returns how many requests matched no bucket (allowed, unreported).
func (e *Envoy) Unmatched() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unmatched
}

// Stats returns the admissions and denials of every bucket (by Key) in every
// window (by index: Unix time / Config.Window).
func (e *Envoy) Stats() map[string]map[int64]Counts {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make(map[string]map[int64]Counts, len(e.stats))
	for k, m := range e.stats {
		o := make(map[int64]Counts, len(m))
		for w, c := range m {
			o[w] = *c
		}
		out[k] = o
	}
	return out
}

// Totals returns the admissions and denials over all buckets and windows.
func (e *Envoy) Totals() Counts {
	var t Counts
	for _, m := range e.Stats() {
		for _, c := range m {
			t.Admitted += c.Admitted
			t.Denied += c.Denied
			t.Unassigned += c.Unassigned
		}
	}
	return t
}

// Tokens returns the tokens left in the token bucket of the bucket with id, and
// false when that bucket has none (no bucket, or another action in force).
func (e *Envoy) Tokens(id map[string]string) (float64, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	b := e.buckets[bucketKey(id)]
	if b == nil {
		return 0, false
	}
	now := e.clock.Now()
	e.expireLocked(b, now)
	if b.state == stateDefault || b.tb == nil {
		return 0, false
	}
	return b.tb.remaining(e.seconds(now)), true
}

// HasBucket reports whether the bucket with id is in the cache.
func (e *Envoy) HasBucket(id map[string]string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.buckets[bucketKey(id)] != nil
}

// Close ends the stream and the timer, as an Envoy that shuts down. Its
// counters stay readable.
func (e *Envoy) Close() {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return
	}
	e.closed = true
	close(e.stop)
	if e.stream != nil {
		e.cancel()
	}
	e.mu.Unlock()
	e.done.Wait()
	e.closeConns()
}

// closeConns closes the connections dialled for Config.Servers.
func (e *Envoy) closeConns() {
	for _, cc := range e.conns {
		cc.Close()
	}
}
