// Package redisstore decides tollgate's meters on Redis: standalone, Sentinel or
// Cluster, through go-redis v9. Every request is one EVALSHA of the decision script per
// cluster slot it touches; go-redis retries are off, because a retried script could
// charge twice.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/breaker"
)

// Store decides meters on Redis. A Store is safe for simultaneous use.
type Store struct {
	client   redis.UniversalClient
	decide   *redis.Script
	refund   *redis.Script
	many     *redis.Script // several requests in one call (the batcher, standalone)
	manyHash any           // its SHA-1, boxed once
	cluster  bool
	cc       *redis.ClusterClient // the client, when it is a cluster's
	node     string               // the node's name, when not a cluster
	breakers atomic.Pointer[breaker.Set]
	args     argCache // precomputed script arguments of the policy's meters
	// stopWatch and watchDone stop and await a Sentinel master's switch watch
	// (nil when the store has none).
	stopWatch context.CancelFunc
	watchDone chan struct{}
	// sets holds, per set of algorithms, the decision script with only their Lua.
	sets [algo.AllAlgorithms + 1]atomic.Pointer[setScript]
}

// setScript is the decision script of one set of algorithms.
type setScript struct {
	script *redis.Script
	hash   any // boxed once
}

// scriptFor returns the decision script for the algorithms of meters.
func (s *Store) scriptFor(meters []algo.Meter) *setScript {
	set := algo.SetOf(meters)
	if sc := s.sets[set].Load(); sc != nil {
		return sc
	}
	sc := &setScript{script: redis.NewScript(algo.DecideScriptFor(set))}
	sc.hash = sc.script.Hash()
	if !s.sets[set].CompareAndSwap(nil, sc) {
		return s.sets[set].Load()
	}
	return sc
}

// load loads the scripts on one node: the full decision script, the refund script,
// the many-request script and the decision script of each algorithm alone.
func (s *Store) load(ctx context.Context, c redis.Scripter) error {
	scripts := []*redis.Script{s.decide, s.refund, s.many}
	for _, a := range algo.Algorithms {
		scripts = append(scripts, s.scriptFor([]algo.Meter{{Limits: []algo.Limit{{Algorithm: a}}}}).script)
	}
	for _, sc := range scripts {
		if err := sc.Load(ctx, c).Err(); err != nil {
			return fmt.Errorf("redisstore: load script: %w", err)
		}
	}
	return nil
}

// New returns a store on client. A *redis.ClusterClient is decided slot by slot; any
// other client runs every request in one script.
func New(client redis.UniversalClient) (*Store, error) {
	if client == nil {
		return nil, errors.New("redisstore: nil client")
	}
	cc, cluster := client.(*redis.ClusterClient)
	s := &Store{
		client:  client,
		decide:  redis.NewScript(algo.DecideScript()),
		refund:  redis.NewScript(algo.RefundScript()),
		many:    redis.NewScript(algo.DecideManyScript()),
		cluster: cluster,
		cc:      cc,
		node:    "redis",
	}
	if c, ok := client.(*redis.Client); ok {
		s.node = c.Options().Addr
	}
	s.manyHash = s.many.Hash()
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

// Preload loads the scripts on every node (every master of a cluster), so the first
// decisions run EVALSHA without a NOSCRIPT round trip.
func (s *Store) Preload(ctx context.Context) error {
	load := s.load
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, s.client)
}

// Decide decides every meter of c together. On one node (or when every key shares a
// cluster slot) it is one script: all meters are checked, then charged only if none
// denies. When the keys of a cluster request fall in several slots, the slots are
// charged one after the other; when a later slot denies, the slots already charged are
// refunded, so the request is never admitted in part. Between the charge and its
// refund, other requests see the charge (they may be denied where they would not have
// been); they are never admitted where they would not have been.
func (s *Store) Decide(ctx context.Context, c algo.Check) (algo.Outcome, error) {
	c = c.AtWindows(nowOr(c.NowMicros))
	if len(c.Keys) != len(c.Meters) {
		return algo.Outcome{}, fmt.Errorf("redisstore: %d keys for %d meters", len(c.Keys), len(c.Meters))
	}
	if len(c.Meters) == 0 {
		return algo.Outcome{Allowed: true, NowMicros: c.NowMicros}, nil
	}
	var groups [][]int
	if s.cluster {
		groups = slotGroups(c.Keys)
	}
	if len(groups) <= 1 {
		p, err := s.allowKey(ctx, c.Keys[0])
		if err != nil {
			return algo.Outcome{}, runError(c, err)
		}
		out, err := s.run(ctx, c, false)
		s.done(p, err)
		return out, err
	}
	// Every node of the request must be let through before any slot is charged.
	nodes := make([]string, len(groups))
	for gi, g := range groups {
		n, err := s.nodeOf(ctx, c.Keys[g[0]])
		if err != nil {
			return algo.Outcome{}, runError(c, err)
		}
		nodes[gi] = n
	}
	np, err := s.allowAll(nodes)
	if err != nil {
		return algo.Outcome{}, runError(c, err)
	}
	defer np.finish(s)
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
		np.record(nodes[gi], err)
		if err != nil {
			s.refundAll(ctx, done, c.NowMicros)
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
			if err := s.refundAll(ctx, done, c.NowMicros); err != nil {
				return algo.Outcome{}, err
			}
			continue
		}
		done = append(done, charged{sub, rep})
	}
	return out, nil
}

// charged is one slot's part of a request, charged with undo data.
type charged struct {
	sub   algo.Check
	reply algo.Reply
}

// refundAll gives back the charges in done. now is the request's explicit time, or 0
// for the server's clock, as the refund's own time.
func (s *Store) refundAll(ctx context.Context, done []charged, now int64) error {
	var errs []error
	for _, d := range done {
		if len(d.reply.Undo) == 0 {
			continue
		}
		keys, args := algo.RefundCall(d.sub.Meters, d.sub.Keys, d.reply.Undo, d.reply.NowMicros, now, d.sub.Cost)
		// The refund must run even if the request's deadline has passed: a lost refund
		// leaves units charged for a request that was denied.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		err := s.refund.Run(rctx, s.client, keys, args...).Err()
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("redisstore: refund %q: %w", keys[0], err))
		}
	}
	return errors.Join(errs...)
}

func (s *Store) run(ctx context.Context, c algo.Check, undo bool) (algo.Outcome, error) {
	rep, err := s.call(ctx, c, undo)
	if err != nil {
		return algo.Outcome{}, err
	}
	return rep.Outcome(), nil
}

func (s *Store) call(ctx context.Context, c algo.Check, undo bool) (algo.Reply, error) {
	rep, err := s.send(ctx, c, undo)
	if _, moved := redis.IsMovedError(err); moved {
		// The slot moved (resharding, failover): the script did not run. Learn the new
		// map and send it once more; any other error is final, since a script that
		// timed out may have run, and running it again could charge twice.
		if cc, ok := s.client.(*redis.ClusterClient); ok {
			cc.ReloadState(ctx)
			rep, err = s.send(ctx, c, undo)
		}
	}
	if err != nil {
		return algo.Reply{}, runError(c, err)
	}
	return rep, nil
}

// send runs the decision script for the algorithms of c once: an EVALSHA with mostly
// precomputed arguments, read as integers, in the common case (no undo), and an EVAL,
// which also loads the script, when the server does not know it (NOSCRIPT, once per
// cache flush).
func (s *Store) send(ctx context.Context, c algo.Check, undo bool) (algo.Reply, error) {
	sc := s.scriptFor(c.Meters)
	var v any
	var err error
	if !undo {
		var vals []int64
		vals, err = evalsha(ctx, s.client, &s.args, sc.hash, c)
		if !isNoScript(err) {
			if err != nil {
				return algo.Reply{}, err
			}
			return algo.ParseDecideInts(vals, c.Meters)
		}
		v, err = sc.script.Eval(ctx, s.client, c.Keys, algo.DecideArgs(c.Meters, c.Cost, c.NowMicros, undo)...).Result()
	} else {
		v, err = sc.script.Run(ctx, s.client, c.Keys, algo.DecideArgs(c.Meters, c.Cost, c.NowMicros, undo)...).Result()
	}
	if err != nil {
		return algo.Reply{}, err
	}
	return algo.ParseDecideReply(v, c.Meters)
}

// evalsha runs the decision script (hash) for c, without undo data, on client and
// returns its reply as integers: one allocation for the reply where a generic
// command boxes every element.
func evalsha(ctx context.Context, client redis.UniversalClient, ac *argCache, hash any, c algo.Check) ([]int64, error) {
	buf := getArgs()
	*buf = ac.command(*buf, hash, c)
	cmd := redis.NewIntSliceCmd(ctx, *buf...)
	cmd.SetFirstKeyPos(3)
	_ = client.Process(ctx, cmd)
	putArgs(buf)
	return cmd.Result()
}

// argBufs holds the argument slices of EVALSHA commands between decisions.
var argBufs = sync.Pool{New: func() any { b := make([]any, 0, 32); return &b }}

func getArgs() *[]any { return argBufs.Get().(*[]any) }

// putArgs returns an argument slice whose command has completed.
func putArgs(b *[]any) {
	clear(*b)
	*b = (*b)[:0]
	argBufs.Put(b)
}

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
