// Package redisstore decides tollgate's meters on Redis: standalone, Sentinel or
// Cluster, through go-redis v9. A request of one fixed_window limit is counted with
// no script (count.go); every other request is one FCALL of tollgate's Lua library
// (EVALSHA of the same source where the server has no Redis Functions) per cluster
// slot it touches. go-redis retries are off, because a retried call could charge
// twice.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/breaker"
)

// Store decides meters on Redis. A Store is safe for simultaneous use.
type Store struct {
	client   redis.UniversalClient
	cluster  bool
	cc       *redis.ClusterClient // the client, when it is a cluster's
	node     string               // the node's name, when not a cluster
	breakers atomic.Pointer[breaker.Set]
	// batch sends together the requests that arrive while others are in flight (see
	// batch.go); nil when batching is off.
	batch *batcher
	// lua is the library; functions names each entry's function (FCALL; boxed
	// once), scripts each entry's script (EVALSHA, once noFunctions: a server had
	// no FUNCTION).
	lua         algo.Library
	functions   map[algo.Entry]any
	scripts     map[algo.Entry]*redis.Script
	noFunctions atomic.Bool
	// windows are the counted fixed windows known to exist with their expiry;
	// clockOffset is the server's clock minus this process's (counting is off while
	// it is too large); followUpsFailed counts the second round trips' commands that
	// failed (count.go).
	windows         windowSet
	clockOffset     atomic.Int64 // time.Duration
	followUpsFailed atomic.Int64
	// unreplicated counts the charges answered before the replicas they asked for
	// acknowledged them (algo.Replicas).
	unreplicated atomic.Int64
	// stopWatch and watchDone stop and await a Sentinel master's switch watch
	// (nil when the store has none).
	stopWatch context.CancelFunc
	watchDone chan struct{}
}

// Options are a store's own settings, beside its client's. The zero value sends every
// request on its own.
type Options struct {
	// BatchWait turns batching on (see batch.go): a request that finds a round trip
	// under way queues, and the queue goes out as one batch when that round trip
	// ends, when it holds MaxBatch requests, or once its first request has waited
	// BatchWait, whichever comes first. A request that finds nothing in flight never
	// waits. 0, the default, sends every request on its own; the decision service
	// batches with DefaultBatchWait. A standalone endpoint that is really a sharding
	// proxy (twemproxy, Envoy's Redis proxy) cannot run one script over several
	// clients' keys: do not batch behind one.
	BatchWait time.Duration
	// MaxBatch is the most requests sent in one batch (default DefaultMaxBatch). A
	// queue that reaches it goes out at once, even while another batch is in
	// flight. 1 sends every request on its own.
	MaxBatch int
}

// New returns a store on client that sends every request on its own (the zero
// Options). A *redis.ClusterClient is decided slot by slot; any other client runs
// every request in one call.
func New(client redis.UniversalClient) (*Store, error) {
	return NewWithOptions(client, Options{})
}

// NewWithOptions returns a store on client with o.
func NewWithOptions(client redis.UniversalClient, o Options) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	if o.BatchWait < 0 || o.MaxBatch < 0 {
		return nil, fmt.Errorf("redisstore: options %+v: BatchWait and MaxBatch must not be negative", o)
	}
	cc, cluster := client.(*redis.ClusterClient)
	s := &Store{
		client:    client,
		cluster:   cluster,
		cc:        cc,
		node:      "redis",
		lua:       algo.Lua(),
		functions: map[algo.Entry]any{},
		scripts:   map[algo.Entry]*redis.Script{},
	}
	for _, e := range algo.Entries {
		s.functions[e] = s.lua.Function(e)
		s.scripts[e] = redis.NewScript(s.lua.Script(e))
	}
	if c, ok := client.(*redis.Client); ok {
		s.node = c.Options().Addr
	}
	s.batch = newBatcher(s, o)
	s.UseBreakers(breaker.Settings{})
	return s, nil
}

// Client returns the store's Redis client.
func (s *Store) Client() redis.UniversalClient { return s.client }

// Close stops the watch of a Sentinel master's switches, if any, and closes the
// Redis client.
func (s *Store) Close() error {
	if s.stopWatch != nil {
		s.stopWatch()
		<-s.watchDone
	}
	return s.client.Close()
}

// A route is how a request goes to Redis.
type route int

const (
	alone   route = iota // one call on its own
	batched              // one call in the batch of the requests in flight with it
	bySlot               // one call per cluster slot, one after the other (decideSlots)
)

// routeOf says how c goes to Redis. It is the one place that says which requests may
// not join a batch (when batching is on):
//   - a request whose keys fall in several cluster slots: no script can run over
//     them (CROSSSLOT), so it is charged slot by slot with the undo data that
//     refunds the slots already charged when a later one denies;
//   - a charge that waits for replicas (algo.Replicas): its WAIT follows it on its
//     connection and covers every write made there so far, so in a batch it would
//     wait for, and vouch for, the other requests' writes.
func (s *Store) routeOf(c algo.Check) route {
	switch {
	case s.cluster && !oneSlot(c.Keys):
		return bySlot
	case s.batch == nil, c.Cost > 0 && c.Replicas().Count > 0:
		return alone
	}
	return batched
}

// Decide decides every meter of c together (or, when c.Settle, settles it: see
// settle). On one node (or when every key shares a
// cluster slot) it is one call, alone or in a batch: all meters are checked, then
// charged only if none denies. When the keys of a cluster request fall in several
// slots, the slots are charged one after the other; when a later slot denies, the
// slots already charged are refunded, so the request is never admitted in part.
// Between the charge and its refund, other requests see the charge (they may be
// denied where they would not have been); they are never admitted where they would
// not have been.
//
// A call goes to each node through the node's circuit breaker: a request for a node
// whose breaker is open fails at once. Decide returns when the outcome is known or
// ctx ends, whichever comes first; a request whose context ends after it was sent may
// still have been charged, as with any command that times out. c must not be
// modified until Decide returns.
func (s *Store) Decide(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	c = c.AtWindows(nowOr(c.NowMicros))
	if len(c.Keys) != len(c.Meters) {
		return algo.Outcome{}, fmt.Errorf("redisstore: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	if len(c.Meters) == 0 {
		return algo.Outcome{Allowed: true, NowMicros: c.NowMicros}, nil
	}
	if c.Settle {
		return s.settle(ctx, c)
	}
	r := s.routeOf(c)
	if r == bySlot {
		return s.decideSlots(ctx, c)
	}
	node, err := s.nodeOf(ctx, c.Keys[0])
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	var ps pass
	if err := s.enter(&ps, node); err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	var rep algo.Reply
	if r == batched {
		rep, err = s.batch.decide(ctx, c, node)
	} else {
		rep, err = s.decideOne(ctx, c)
	}
	ps.record(node, err)
	s.leave(&ps)
	return rep.Outcome(), err
}

// decideSlots decides c, whose keys fall in several cluster slots, one slot after the
// other (see Decide). Every node of the request must be let through before any slot
// is charged.
func (s *Store) decideSlots(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	groups := slotGroups(c.Keys)
	nodes := make([]string, len(groups))
	for gi, g := range groups {
		n, err := s.nodeOf(ctx, c.Keys[g[0]])
		if err != nil {
			return algo.Outcome{}, runError(c, err)
		}
		nodes[gi] = n
	}
	var ps pass
	if err := s.enter(&ps, nodes...); err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	defer s.leave(&ps)
	out := algo.Outcome{Allowed: true, Decisions: make([][]algo.Decision, len(c.Meters))}
	var done []charged
	for gi, g := range groups {
		sub := subCheck(c, g)
		if !out.Allowed {
			// A slot already denied: peek at the rest (cost 0 charges nothing) so the
			// caller still sees every limit's state.
			sub.Cost = 0
		}
		rep, err := s.call(ctx, sub, out.Allowed)
		ps.record(nodes[gi], err)
		if err != nil {
			s.refundAll(ctx, &ps, done, c.NowMicros)
			return algo.Outcome{}, err
		}
		if gi == 0 {
			out.NowMicros = rep.NowMicros
		}
		for i, mi := range g {
			out.Decisions[mi] = rep.Decisions[i]
		}
		if !out.Allowed {
			continue
		}
		if !rep.Allowed {
			out.Allowed = false
			if err := s.refundAll(ctx, &ps, done, c.NowMicros); err != nil {
				return algo.Outcome{}, err
			}
			continue
		}
		done = append(done, charged{sub, rep, nodes[gi]})
	}
	return out, nil
}

// charged is one slot's part of a request, charged with undo data on node.
type charged struct {
	sub   algo.Check
	reply algo.Reply
	node  string
}

// refundAll gives back the charges in done, on nodes let through with ps. now is the
// request's explicit time, or 0 for the server's clock, as the refund's own time.
func (s *Store) refundAll(ctx context.Context, ps *pass, done []charged, now int64) error {
	var errs []error
	for _, d := range done {
		if len(d.reply.Undo) == 0 {
			continue
		}
		// The refund must run even if the request's deadline has passed: a lost refund
		// leaves units charged for a request that was denied.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		err := s.refund(rctx, d.sub, d.reply.Undo, d.reply.NowMicros, now)
		cancel()
		ps.record(d.node, err)
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// refund runs the library's refund entry for the charges of c described by undo,
// made at charged (Unix µs); now is the refund's own time, or 0 for the server's
// clock.
func (s *Store) refund(ctx context.Context, c algo.Check, undo []algo.Undo, charged, now int64) error {
	keys, args := algo.RefundCall(c.Meters, c.Keys, undo, charged, now, c.Cost)
	sc := entryCall(algo.EntryRefund, keys, args)
	s.exec(ctx, sc)
	if err := sc.cmd.Err(); err != nil {
		return fmt.Errorf("redisstore: refund %q: %w", keys[0], err)
	}
	return nil
}

// call runs the decide entry for c, with undo data or not, and decodes its reply.
func (s *Store) call(ctx context.Context, c algo.Check, undo bool) (algo.Reply, error) {
	sc := decideCall(c, undo)
	s.exec(ctx, sc)
	if _, moved := redis.IsMovedError(sc.cmd.Err()); moved {
		// The slot moved (resharding, failover): the call did not run. Learn the new
		// map and send it once more; any other error is final, since a call that
		// timed out may have run, and running it again could charge twice.
		if s.cc != nil {
			s.cc.ReloadState(ctx)
			s.exec(ctx, sc)
		}
	}
	rep, err := sc.answer(c)
	if err == nil && rep.Allowed {
		// The charge is made on the master whether the replicas acknowledged it in
		// time or not, and the decision stands either way: denying a request that was
		// charged would count it against the limit without admitting it, and a failed
		// WAIT says nothing about the charge. The shortfall is counted (Unreplicated).
		s.waited(sc)
	}
	return rep, err
}

// Unreplicated returns how many admitted decisions that asked for replicas
// (algo.Replicas) were answered before that many replicas acknowledged their charge:
// the charges a failover could still lose. A rising count means a replica is down,
// lagging, or slower than the limit's timeout.
func (s *Store) Unreplicated() int64 { return s.unreplicated.Load() }

// slotGroups returns the indexes of keys grouped by cluster slot, in order of first
// appearance.
func slotGroups(keys []string) [][]int {
	var groups [][]int
	slots := map[int]int{}
	for i, k := range keys {
		sl := algo.Slot(k)
		g, ok := slots[sl]
		if !ok {
			g = len(groups)
			slots[sl] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// oneSlot reports whether every key hashes to the same cluster slot.
func oneSlot(keys []string) bool {
	if len(keys) < 2 {
		return true
	}
	tag := algo.HashTag(keys[0])
	for _, k := range keys[1:] {
		if algo.HashTag(k) != tag && algo.Slot(k) != algo.Slot(keys[0]) {
			return false
		}
	}
	return true
}

// subCheck is the part of c on the meters at idx; only those meters' replicas
// (algo.Replicas) are waited for.
func subCheck(c algo.Check, idx []int) algo.Check {
	sub := algo.Check{Cost: c.Cost, NowMicros: c.NowMicros}
	for _, i := range idx {
		sub.Keys = append(sub.Keys, c.Keys[i])
		sub.Meters = append(sub.Meters, c.Meters[i])
	}
	return sub
}

// IsCluster reports whether the store decides slot by slot.
func (s *Store) IsCluster() bool { return s.cluster }

// nowOr is now, or this process's clock when now is 0 (the server's clock decides):
// the time calendar windows are chosen at. Near a window's edge the server's clock
// may place the request in the next window, which the script then takes.
func nowOr(now int64) int64 {
	if now != 0 {
		return now
	}
	return time.Now().UnixMicro()
}
