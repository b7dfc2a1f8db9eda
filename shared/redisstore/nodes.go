package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/shared/breaker"
)

// A Store keeps a circuit breaker per Redis node: the one master of a standalone or
// Sentinel Redis, each master of a cluster (by its address). A request goes to a node
// only through that node's breaker, so a dead shard fails the requests whose keys it
// holds and no others; a request that spans a healthy and a failing node fails as a
// whole, since it cannot be decided all-or-nothing.
//
// On a cluster, every failure and every call an open breaker turns away asks go-redis
// to reload the slot map (ReloadState, which runs at most one reload per 200ms), so a
// failover is followed as soon as the cluster has promoted a replica, whether or not
// the dead node could answer MOVED. The reload continues while a breaker is open,
// because the calls it turns away keep asking for it.

// topologyNode names, in Health, a cluster whose slot map cannot be loaded at all.
const topologyNode = "cluster"

// UseBreakers replaces the store's breakers with new ones that take st. Call it before
// the store decides (the engine does, with the policy's breaker settings).
func (s *Store) UseBreakers(st breaker.Settings) {
	s.breakers.Store(breaker.NewSet(st))
}

// Breakers returns the state of the breaker of every node the store has called.
func (s *Store) Breakers() []breaker.Status {
	return s.breakers.Load().States()
}

// nodeOf returns the name of the node that holds key. It fails only while a
// cluster's slot map has never loaded (go-redis then loads it on each call).
func (s *Store) nodeOf(ctx context.Context, key string) (string, error) {
	if s.cc == nil {
		return s.node, nil
	}
	c, err := s.cc.MasterForKey(ctx, key)
	if err != nil {
		return "", fmt.Errorf("find the node of %q: %w", key, err)
	}
	return c.Options().Addr, nil
}

// sickReplies are the prefixes of the error replies of a node that cannot decide now
// (still loading, busy with a script, a replica since a failover, a cluster without
// the slot, out of memory).
var sickReplies = []string{"LOADING", "BUSY", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN", "READONLY", "NOREPLICAS", "OOM"}

// result is what a call's error says of its node's health. A node that answered with
// an error reply is up (MOVED, NOSCRIPT, a request's own WRONGTYPE), unless the reply
// says it cannot decide now.
func result(err error) breaker.Result {
	if err == nil {
		return breaker.Success
	}
	return errorResult(err)
}

// errorResult is result for an error; apart, so that a success allocates nothing.
func errorResult(err error) breaker.Result {
	var reply redis.Error
	if !errors.As(err, &reply) {
		return breaker.ResultOf(err)
	}
	for _, p := range sickReplies {
		if redis.HasErrorPrefix(err, p) {
			return breaker.Failure
		}
	}
	return breaker.Success
}

// reload asks go-redis to reload a cluster's slot map; go-redis coalesces the calls.
func (s *Store) reload() {
	if s.cc != nil {
		s.cc.ReloadState(context.Background())
	}
}

// A pass holds the breaker permits of the nodes one call goes to. Every path to Redis
// takes and completes its permits through one, the same way: s.enter takes the
// permit of every node or of none, the call notes each node's result with record,
// and s.leave hands every permit its node's result. The paths are a decision (alone,
// in a batch, or slot by slot with its refunds), a lease's refund, and a health check.
type pass struct {
	n     int    // nodes let through
	first gate   // the first node's: a call to one node allocates nothing
	more  []gate // the others'
}

// A gate is one node's permit in a pass, and what the call found there.
type gate struct {
	node   string
	permit breaker.Permit
	err    error // the first error of a call to node
	called bool
}

// at returns the gate of the i-th node let through.
func (ps *pass) at(i int) *gate {
	if i == 0 {
		return &ps.first
	}
	return &ps.more[i-1]
}

// find returns the gate of node, or nil.
func (ps *pass) find(node string) *gate {
	for i := range ps.n {
		if g := ps.at(i); g.node == node {
			return g
		}
	}
	return nil
}

// enter lets a call to every node of nodes through its breaker, or none: on a
// refusal it hands back the permits already taken, unused, and returns an error
// wrapping breaker.ErrOpen (and asks for a topology reload: the node may have been
// replaced).
func (s *Store) enter(ps *pass, nodes ...string) error {
	set := s.breakers.Load()
	for _, n := range nodes {
		if ps.find(n) != nil {
			continue
		}
		p, err := set.Get(n).Allow()
		if err != nil {
			s.reload()
			s.leave(ps)
			return fmt.Errorf("node %s: %w", n, err)
		}
		g := gate{node: n, permit: p}
		if ps.n == 0 {
			ps.first = g
		} else {
			ps.more = append(ps.more, g)
		}
		ps.n++
	}
	return nil
}

// record notes the result of a call to node, which ps let through.
func (ps *pass) record(node string, err error) {
	g := ps.find(node)
	g.called = true
	if g.err == nil {
		g.err = err
	}
}

// leave reports every node's result to its breaker, and asks for a topology reload
// when a call failed or was redirected; a node not called reports nothing.
func (s *Store) leave(ps *pass) {
	for i := range ps.n {
		g := ps.at(i)
		if !g.called {
			g.permit.Done(breaker.Ignore)
			continue
		}
		r := result(g.err)
		g.permit.Done(r)
		if _, moved := redis.IsMovedError(g.err); moved || r == breaker.Failure {
			s.reload()
		}
	}
	ps.n, ps.more = 0, nil
}

// Health checks every node through its breaker and returns each node's state: the
// check is the probe of a breaker whose wait is over, so a node recovers even when
// no request reaches it, and a node that fails it counts a failure. A breaker still
// waiting is not called. On a cluster the slot map is reloaded first, and the
// breakers of nodes no longer masters are dropped.
func (s *Store) Health(ctx context.Context) []breaker.Status {
	set := s.breakers.Load()
	if s.cc == nil {
		return []breaker.Status{s.checkNode(ctx, s.node, s.client)}
	}
	var mu sync.Mutex
	var out []breaker.Status
	err := s.cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		st := s.checkNode(ctx, c.Options().Addr, c)
		mu.Lock()
		out = append(out, st)
		mu.Unlock()
		return nil
	})
	if err != nil {
		return []breaker.Status{{Node: topologyNode, State: breaker.Open, Err: fmt.Errorf("redisstore: load the cluster's slot map: %w", err)}}
	}
	slices.SortFunc(out, func(a, b breaker.Status) int { return strings.Compare(a.Node, b.Node) })
	keep := make([]string, len(out))
	for i, st := range out {
		keep[i] = st.Node
	}
	set.Retain(keep)
	return out
}

// checkNode checks one node through its breaker.
func (s *Store) checkNode(ctx context.Context, node string, c redis.Cmdable) breaker.Status {
	var ps pass
	err := s.enter(&ps, node)
	if err == nil {
		err = s.ping(ctx, c)
		ps.record(node, err)
		s.leave(&ps)
	}
	return breaker.Status{Node: node, State: s.breakers.Load().Get(node).State(), Err: err}
}

// Ping checks that Redis can decide: that at least one node answers with the Lua
// library loaded (it loads the library on a node that lost it). Health
// says which nodes cannot.
func (s *Store) Ping(ctx context.Context) error {
	var errs []error
	sts := s.Health(ctx)
	for _, st := range sts {
		if st.Err == nil {
			return nil
		}
		errs = append(errs, st.Err)
	}
	switch len(errs) {
	case 0:
		return errors.New("redisstore: ping: no node")
	case 1:
		return errs[0]
	}
	return fmt.Errorf("redisstore: ping: no node can decide: %w", errors.Join(errs...))
}

// ping checks that one node answers with the Lua library loaded, and loads it on a
// node that lost it (a restart, FUNCTION FLUSH, SCRIPT FLUSH), so that readiness
// recovers by itself.
func (s *Store) ping(ctx context.Context, c redis.Cmdable) error {
	// load asks the node first and sends the library only where it is missing.
	if err := s.load(ctx, c); err != nil {
		return fmt.Errorf("redisstore: ping: %w", err)
	}
	return nil
}
