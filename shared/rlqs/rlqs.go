// Package rlqs implements Envoy's Rate Limit Quota Service
// (envoy.service.rate_limit_quota.v3.RateLimitQuotaService): the Envoys of a fleet
// report each bucket's usage on one stream each, and the service answers with
// assignments that Envoy enforces locally. A bucket id's entries are a request's
// attributes; the policy's rules with an rlqs block decide it (policy.RLQS).
//
// Every unit an Envoy may admit is first taken from the limit in the store through
// the engine (engine.Engine.Take), so a limit of N per window is shared by every
// Envoy connected to every instance on the same Redis, and the fleet admits at most
// N in a window (see share for the argument, and docs/rlqs.md for the bounds and
// the failure behaviours). Each Envoy's grant follows its reported demand.
package rlqs

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"sync"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-dev/tollgate/shared/engine"
)

// Defaults of Limits.
const (
	DefaultMaxStreams       = 10000
	DefaultMaxStreamBuckets = 1000
	DefaultMaxBuckets       = 100000
	DefaultMaxReportRate    = 2000
	DefaultMaxBucketBytes   = 128 << 20
	// MaxMessageBytes is the largest report a server built with ServerOptions
	// receives (gRPC's default, stated): a report of every bucket of a stream at
	// their largest fits.
	MaxMessageBytes = 4 << 20
	// unmatchedTTL is how long a bucket that no rlqs rule matches is allowed,
	// before Envoy asks again (a policy reload may have added a rule).
	unmatchedTTL = time.Minute
	// sweepEvery is how often the service starts the windows of its shares.
	sweepEvery = 50 * time.Millisecond
	// sweepWorkers bounds the shares pushed at once.
	sweepWorkers = 16
	// abandonAfter is how many reports in a row without a request make the
	// service abandon a bucket: a minute at Envoy's 5s.
	abandonAfter = 12
)

// Limits bound what a stream may make the service hold; the zero value of a field
// is its default.
type Limits struct {
	// MaxStreams is how many streams may be open at once (default 10000); one
	// more ends at once with RESOURCE_EXHAUSTED, and its Envoy tries again at its
	// next report tick.
	MaxStreams int
	// MaxStreamBuckets is how many buckets one stream may report (default 1000),
	// and how many usages one report may carry: the usage of further buckets is
	// dropped and counted, and Envoy applies its no_assignment_behavior to them.
	MaxStreamBuckets int
	// MaxBuckets is how many buckets all streams together may report (default
	// 100000), dropped likewise past it.
	MaxBuckets int
	// MaxReportRate is how many bucket usages a stream may send per second, with a
	// burst of twice as many (default 2000: a stream of 1000 buckets reports them
	// every 5s, and once more each as it is created). Reports past it are dropped
	// and counted.
	MaxReportRate int
	// MaxBucketBytes bounds the memory the buckets of all streams together hold
	// (default 128 MiB): each bucket is charged its id's keys and values (kept
	// once) and 1,280 bytes, each quota the buckets reach its store keys (kept
	// three times) and 2 KiB, from the heap measured. A new bucket past it is
	// dropped like one past MaxBuckets, and counted apart (reason=bytes). 128 MiB
	// holds about 100,000 buckets of small ids sharing quotas (MaxBuckets binds
	// first), 38,000 of small ids on quotas of their own.
	MaxBucketBytes int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxStreams <= 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	if l.MaxStreamBuckets <= 0 {
		l.MaxStreamBuckets = DefaultMaxStreamBuckets
	}
	if l.MaxBuckets <= 0 {
		l.MaxBuckets = DefaultMaxBuckets
	}
	if l.MaxReportRate <= 0 {
		l.MaxReportRate = DefaultMaxReportRate
	}
	if l.MaxBucketBytes <= 0 {
		l.MaxBucketBytes = DefaultMaxBucketBytes
	}
	return l
}

// Config configures a Server.
type Config struct {
	// Engine decides with the policy and the store; required.
	Engine *engine.Engine
	// Registerer receives the metrics; nil registers none.
	Registerer prometheus.Registerer
	// Logger receives warnings (default slog.Default()).
	Logger *slog.Logger
	// Limits bound the streams.
	Limits Limits
	// Clock reads the time (default time.Now).
	Clock func() time.Time
}

// Server is the Rate Limit Quota Service. It is safe for simultaneous use. Run
// starts the windows of its quotas; without it, grants start at reports only.
type Server struct {
	rlqspb.UnimplementedRateLimitQuotaServiceServer

	eng     *engine.Engine
	log     *slog.Logger
	limits  Limits
	clock   func() time.Time
	metrics *metrics

	mu      sync.Mutex
	shares  map[string]*share
	pushers chan struct{} // a slot per share being pushed (sweepWorkers)
	buckets int           // buckets of every stream
	bytes   int64         // what the buckets and shares are charged (Limits.MaxBucketBytes)
	streams int           // streams open

	done chan struct{} // closed by Shutdown
	stop sync.Once
}

// New returns a Server for cfg.
func New(cfg Config) (*Server, error) {
	if cfg.Engine == nil {
		return nil, errors.New("rlqs: nil engine")
	}
	s := &Server{
		eng:     cfg.Engine,
		log:     cfg.Logger,
		limits:  cfg.Limits.withDefaults(),
		clock:   cfg.Clock,
		metrics: newMetrics(cfg.Registerer),
		shares:  map[string]*share{},
		pushers: make(chan struct{}, sweepWorkers),
		done:    make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	return s, nil
}

// ServerOptions are the gRPC server options the service needs: its largest message.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageBytes)}
}

// Run starts each quota's windows as they come, pushing the new window's grants to
// every Envoy with demand, until ctx is done; and drops the quotas no stream
// reports any more.
func (s *Server) Run(ctx context.Context) {
	tick := time.NewTicker(sweepEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			s.sweep(ctx, s.clock())
		}
	}
}

// sweep pushes the grants of the shares whose window has ended.
func (s *Server) sweep(ctx context.Context, now time.Time) {
	s.mu.Lock()
	list := make([]*share, 0, len(s.shares))
	for k, sh := range s.shares {
		if sh.members.Load() == 0 && now.UnixNano() > sh.idle.Load() {
			delete(s.shares, k)
			s.bytes -= sh.cost
			continue
		}
		list = append(list, sh)
	}
	s.mu.Unlock()
	// Windows aligned to the epoch end together for every quota of a period: push
	// them side by side, each share's calls in turn. A sweep waits for none of
	// them: a share whose store calls hang (its Redis node stalled) holds a slot
	// until they time out, and is not pushed again meanwhile; the others go on.
	// A share left out when every slot is taken is pushed by a later sweep.
	for _, sh := range list {
		if !sh.pushing.CompareAndSwap(false, true) {
			continue
		}
		select {
		case s.pushers <- struct{}{}:
		default:
			sh.pushing.Store(false)
			continue
		}
		go func() {
			defer func() {
				<-s.pushers
				sh.pushing.Store(false)
			}()
			for st, ds := range sh.push(ctx, now) {
				st.send(ds)
			}
		}()
	}
}

// StreamRateLimitQuotas serves one Envoy's stream: each report is answered at once
// with the assignments that changed; the start of a window pushes new ones. When the
// stream ends, what its buckets hold beyond what their Envoy reported and may still
// admit goes back to the store, and, when Envoy closed the stream itself (its side
// ended cleanly: it is going away), everything it did not report admitting.
func (s *Server) StreamRateLimitQuotas(srv grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]) error {
	s.mu.Lock()
	if s.streams >= s.limits.MaxStreams {
		s.mu.Unlock()
		s.metrics.rejected.WithLabelValues(codes.ResourceExhausted.String()).Inc()
		return status.Errorf(codes.ResourceExhausted, "rlqs: %d streams open, the most this instance serves; report to another instance", s.limits.MaxStreams)
	}
	s.streams++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.streams--
		s.mu.Unlock()
	}()
	st := &stream{s: s, srv: srv, buckets: map[string]*ledger{}, tokens: float64(2 * s.limits.MaxReportRate), last: s.clock()}
	s.metrics.streams.Inc()
	defer s.metrics.streams.Dec()
	ctx := srv.Context()
	reports := make(chan *rlqspb.RateLimitQuotaUsageReports)
	ended := make(chan error, 1)
	go func() {
		for {
			r, err := srv.Recv()
			if err != nil {
				ended <- err
				return
			}
			select {
			case reports <- r:
			case <-ctx.Done():
				return
			}
		}
	}()
	for {
		select {
		case <-s.done:
			st.close(false)
			return status.Error(codes.Unavailable, "rlqs: this instance is shutting down; report to another")
		case err := <-ended:
			st.close(err == io.EOF)
			if err == io.EOF {
				return nil
			}
			return err
		case r := <-reports:
			if err := st.report(ctx, r); err != nil {
				s.metrics.rejected.WithLabelValues(status.Code(err).String()).Inc()
				st.close(false)
				return err
			}
		}
	}
}

// Shutdown ends every stream with UNAVAILABLE, so that its Envoy reports to another
// instance at its next report tick (a gRPC server's graceful stop waits for streams,
// which Envoy never ends). Grants in force stay charged: their Envoys keep them until
// they expire. Streams opened afterwards end at once.
func (s *Server) Shutdown() {
	s.stop.Do(func() { close(s.done) })
}

// stream is one Envoy's stream.
type stream struct {
	s   *Server
	srv grpc.BidiStreamingServer[rlqspb.RateLimitQuotaUsageReports, rlqspb.RateLimitQuotaResponse]

	sendMu sync.Mutex
	broken bool               // a send failed: the stream is ending
	sent   map[*ledger]uint32 // the newest assignment number sent per bucket

	// Owned by the receiving goroutine.
	domain   string
	buckets  map[string]*ledger
	warnedID bool    // a refused bucket id has been logged (dropID)
	tokens   float64 // bucket usages the stream may still send now
	last     time.Time
}

// admit reports whether a report of n bucket usages is within the stream's rate.
func (st *stream) admit(n int, now time.Time) bool {
	rate := float64(st.s.limits.MaxReportRate)
	st.tokens = min(2*rate, st.tokens+now.Sub(st.last).Seconds()*rate)
	st.last = now
	if float64(n) > st.tokens {
		return false
	}
	st.tokens -= float64(n)
	return true
}

// report answers one report.
func (st *stream) report(ctx context.Context, r *rlqspb.RateLimitQuotaUsageReports) error {
	s := st.s
	pol := s.eng.Policy()
	if r.GetDomain() != pol.Domain {
		// Unlike a refused bucket id, a wrong domain refuses every bucket of every
		// report: the filter's configuration is wrong, and the stream's status says
		// so where Envoy logs it.
		return status.Errorf(codes.InvalidArgument, "rlqs: domain %q: this service decides domain %q; set the filter's domain to it", clip(r.GetDomain()), pol.Domain)
	}
	if st.domain == "" {
		st.domain = r.GetDomain()
	}
	now := s.clock()
	usages := r.GetBucketQuotaUsages()
	if n := s.limits.MaxStreamBuckets; len(usages) > n {
		// More buckets than a stream may have: the rest cannot all be new or
		// known ones, and are dropped unread.
		s.metrics.dropped.WithLabelValues("buckets").Add(float64(len(usages) - n))
		usages = usages[:n]
	}
	if !st.admit(len(usages), now) {
		s.metrics.dropped.WithLabelValues("rate").Inc()
		return nil
	}
	var out []decision
	for _, u := range usages {
		if d := st.usage(ctx, u, now); d.action != nil {
			out = append(out, d)
		}
	}
	if len(out) > 0 {
		st.send(out)
	}
	return nil
}

// usage applies one bucket's usage and returns the action to send for it, or none.
// The usage of a bucket whose id the service refuses is dropped (see dropID): the
// rest of the report and the stream go on.
func (st *stream) usage(ctx context.Context, u *rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage, now time.Time) decision {
	s := st.s
	id, key, err := bucketKey(u.GetBucketId())
	if err != nil {
		st.dropID(err)
		return decision{}
	}
	// time_elapsed is whole seconds, 0 on a bucket's first report: Envoy's own
	// reports fail the proto's gt 0s rule, so reports are not validated by it.
	elapsed := max(0, u.GetTimeElapsed().AsDuration())
	allowed, denied := u.GetNumRequestsAllowed(), u.GetNumRequestsDenied()
	l := st.buckets[key]
	if l != nil && l.pol != s.eng.Policy() {
		// The policy changed: the bucket may reach other limits now.
		pol := s.eng.Policy()
		p, err := s.eng.Plan(engine.Request{Domain: st.domain, Attributes: l.id.GetBucket()})
		if err != nil {
			// The new policy refuses the bucket: it leaves its share as when the
			// policy moves it to other limits, and its usage is dropped.
			l.sh.leave(ctx, l, now, false)
			st.forget(l)
			st.dropID(err)
			return decision{}
		}
		if sh, ok := s.shareFor(p); ok && sh == l.sh {
			l.sh.mu.Lock()
			l.pol, l.reshape = pol, true
			l.sh.mu.Unlock()
		} else {
			// What Envoy may still admit under its grant stays charged to the
			// old limits, which the new policy no longer decides.
			l.sh.leave(ctx, l, now, false)
			st.forget(l)
			l = nil
		}
	}
	if l == nil {
		cost := bucketOverhead + int64(len(key))
		if len(st.buckets) >= s.limits.MaxStreamBuckets {
			s.metrics.dropped.WithLabelValues("buckets").Inc()
			return decision{}
		}
		if reason := s.addBucket(cost); reason != "" {
			s.metrics.dropped.WithLabelValues(reason).Inc()
			return decision{}
		}
		pol := s.eng.Policy()
		p, err := s.eng.Plan(engine.Request{Domain: st.domain, Attributes: id.GetBucket()})
		if err != nil {
			s.dropBucket(cost)
			st.dropID(err)
			return decision{}
		}
		sh, ok := s.shareFor(p)
		if !ok {
			s.dropBucket(cost)
			s.metrics.dropped.WithLabelValues("bytes").Inc()
			return decision{}
		}
		if sh == nil {
			s.dropBucket(cost)
			return decision{action: blanket(u.GetBucketId(), typev3.RateLimitStrategy_ALLOW_ALL, unmatchedTTL)}
		}
		l = &ledger{st: st, sh: sh, id: id, key: key, pol: pol, cost: cost}
		sh.mu.Lock()
		sh.ledgers[l] = struct{}{}
		sh.members.Add(1)
		sh.mu.Unlock()
		st.buckets[key] = l
		s.metrics.buckets.Inc()
	}
	d := l.sh.report(ctx, l, allowed, denied, elapsed, now)
	if l.reports >= abandonAfter {
		// No request for a while: Envoy forgets the bucket, and so does the
		// service, until a request makes it anew.
		l.sh.leave(ctx, l, now, true)
		st.forget(l)
		return decision{action: &rlqspb.RateLimitQuotaResponse_BucketAction{
			BucketId:     l.id,
			BucketAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction_{AbandonAction: &rlqspb.RateLimitQuotaResponse_BucketAction_AbandonAction{}},
		}}
	}
	return d
}

// dropID drops the usage of a bucket whose id the service refuses (past a bound of
// bucket.go, or refused by the engine as a request's attributes would be): it is
// counted, and logged once per stream, since every report repeats it. No action
// answers it, so Envoy applies its no_assignment_behavior to the bucket. A refused
// id is the filter's bucket_id_builder's doing, not the stream's: ending the stream
// would cost every other bucket its assignments, again at every report.
func (st *stream) dropID(err error) {
	st.s.metrics.dropped.WithLabelValues("bucket_id").Inc()
	if !st.warnedID {
		st.warnedID = true
		st.s.log.Warn("rlqs: a bucket's usage is dropped, its bucket_id refused; Envoy applies its no_assignment_behavior to that bucket. "+
			"Make the filter's bucket_id_builder build ids within the bounds (logged once per stream; tollgate_rlqs_dropped_total{reason=\"bucket_id\"} counts every one)", "err", err)
	}
}

// forget drops ledger l from the stream, which has left its share.
func (st *stream) forget(l *ledger) {
	st.sendMu.Lock()
	delete(st.sent, l)
	st.sendMu.Unlock()
	delete(st.buckets, l.key)
	st.s.dropBucket(l.cost)
	st.s.metrics.buckets.Dec()
}

// addBucket counts a new bucket of cost bytes in, or returns the reason it is
// dropped: the service holds MaxBuckets already (buckets), or cost more would pass
// MaxBucketBytes (bytes).
func (s *Server) addBucket(cost int64) (reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.buckets >= s.limits.MaxBuckets {
		return "buckets"
	}
	if s.bytes+cost > s.limits.MaxBucketBytes {
		return "bytes"
	}
	s.buckets++
	s.bytes += cost
	return ""
}

// dropBucket counts out a bucket of cost bytes.
func (s *Server) dropBucket(cost int64) {
	s.mu.Lock()
	s.buckets--
	s.bytes -= cost
	s.mu.Unlock()
}

// shareFor returns the share of the rlqs items of plan p, or nil when no rlqs
// rule matched; ok is false when the share is new and its bytes would pass
// MaxBucketBytes.
func (s *Server) shareFor(p engine.Plan) (sh *share, ok bool) {
	var items []engine.Item
	var key string
	for _, it := range p.Items {
		if it.Rule.RLQS != nil {
			items = append(items, it)
			key += it.Key + "\x00"
		}
	}
	if len(items) == 0 {
		return nil, true
	}
	p.Items = items
	count, period, interval := int64(math.MaxInt64), time.Duration(0), time.Duration(0)
	for _, it := range items {
		for _, l := range it.Meter.Limits {
			if l.Count < count {
				count, period = l.Count, l.Period
			}
		}
		interval = max(interval, it.Rule.RLQS.ReportingInterval)
	}
	now := s.clock()
	s.mu.Lock()
	sh = s.shares[key]
	if sh == nil {
		// The share keeps its key (the shares' map's, and its own), its plan's keys
		// and its demand counter's key: the key's bytes three times, and a little.
		cost := shareOverhead + 3*int64(len(key)+len(demandSuffix))
		if s.bytes+cost > s.limits.MaxBucketBytes {
			s.mu.Unlock()
			return nil, false
		}
		s.bytes += cost
		sh = &share{srv: s, key: key, cost: cost, ledgers: map[*ledger]struct{}{}}
		s.shares[key] = sh
	}
	sh.idle.Store(now.Add(period).UnixNano()) // kept from the sweep's clean up until its bucket joins
	s.mu.Unlock()
	// The share's lock may be held across a store call: it is taken after the
	// server's is let go, never under it.
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.plan = p
	sh.count, sh.period, sh.interval = count, period, interval
	if sh.board == nil || sh.board.period != demandPeriod(sh.interval, sh.period) {
		sh.board = newBoard(items[0].Key, sh.interval, sh.period)
	}
	sh.failure = s.eng.Policy().Failure
	return sh, true
}

// send sends actions to the stream's Envoy, one response. A grant's time to live is
// cut to the whole seconds left until it must expire; one with less than a second
// left is not sent (its units stay charged, unused, until its window ends).
func (st *stream) send(ds []decision) {
	st.sendMu.Lock()
	defer st.sendMu.Unlock()
	if st.broken {
		return
	}
	now := st.s.clock()
	out := make([]action, 0, len(ds))
	for _, d := range ds {
		if d.l != nil {
			if g, ok := st.sent[d.l]; ok && d.gen < g {
				continue // decided before an assignment already sent
			}
			if st.sent == nil {
				st.sent = map[*ledger]uint32{}
			}
			st.sent[d.l] = d.gen
		}
		a := d.action
		if !d.by.IsZero() {
			left := d.by.Sub(now).Truncate(time.Second)
			if left < time.Second {
				continue
			}
			if a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() > left {
				a = proto.Clone(a).(action) // the share keeps the grant as decided
				a.GetQuotaAssignmentAction().AssignmentTimeToLive = durationpb.New(left)
			}
		}
		if d.fresh {
			out = append(out, blanket(a.GetBucketId(), typev3.RateLimitStrategy_DENY_ALL, a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration()))
		}
		out = append(out, a)
	}
	if len(out) == 0 {
		return
	}
	if err := st.srv.Send(&rlqspb.RateLimitQuotaResponse{BucketAction: out}); err != nil {
		st.broken = true
	}
}

// close gives back what the stream's buckets hold: beyond what their Envoy
// reported and may still admit, or with all, everything not reported admitted.
func (st *stream) close(all bool) {
	st.sendMu.Lock()
	st.broken = true
	st.sendMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	now := st.s.clock()
	for _, l := range st.buckets {
		l.sh.leave(ctx, l, now, all)
		st.forget(l)
	}
}
