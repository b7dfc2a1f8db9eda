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

// allow lets a call to node through its breaker, or returns an error wrapping
// breaker.ErrOpen (and asks for a topology reload: the node may have been replaced).
func (s *Store) allow(node string) (breaker.Permit, error) {
	p, err := s.breakers.Load().Get(node).Allow()
	if err != nil {
		s.reload()
		return p, fmt.Errorf("node %s: %w", node, err)
	}
	return p, nil
}

// allowKey lets a call for key through the breaker of its node.
func (s *Store) allowKey(ctx context.Context, key string) (breaker.Permit, error) {
	node, err := s.nodeOf(ctx, key)
	if err != nil {
		return breaker.Permit{}, err
	}
	return s.allow(node)
}

// done reports the result of a call let through with p, and asks for a topology
// reload when it failed or was redirected.
func (s *Store) done(p breaker.Permit, err error) {
	r := result(err)
	p.Done(r)
	if _, moved := redis.IsMovedError(err); moved || r == breaker.Failure {
		s.reload()
	}
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

// nodePermits are the permits of the nodes one request touches.
type nodePermits struct {
	nodes []string
	ps    []breaker.Permit
	errs  []error
	ran   []bool
}

// allowAll lets a call to every node of nodes through its breaker, or none: on a
// refusal the permits already taken are handed back unused.
func (s *Store) allowAll(nodes []string) (*nodePermits, error) {
	np := &nodePermits{}
	for _, n := range nodes {
		if slices.Contains(np.nodes, n) {
			continue
		}
		p, err := s.allow(n)
		if err != nil {
			np.finish(s)
			return nil, err
		}
		np.nodes = append(np.nodes, n)
		np.ps = append(np.ps, p)
		np.errs = append(np.errs, nil)
		np.ran = append(np.ran, false)
	}
	return np, nil
}

// record notes the result of a call to node.
func (np *nodePermits) record(node string, err error) {
	i := slices.Index(np.nodes, node)
	np.ran[i] = true
	if np.errs[i] == nil {
		np.errs[i] = err
	}
}

// finish reports every node's result; a node not called reports nothing.
func (np *nodePermits) finish(s *Store) {
	for i, p := range np.ps {
		if !np.ran[i] {
			p.Done(breaker.Ignore)
			continue
		}
		s.done(p, np.errs[i])
	}
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
	p, err := s.allow(node)
	if err == nil {
		err = s.ping(ctx, c)
		s.done(p, err)
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
