package redistest

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A ClusterOption changes how StartCluster runs its cluster.
type ClusterOption func(*clusterOptions)

type clusterOptions struct {
	replicas int
	args     []string
}

// WithReplicas gives every master n replicas (default 0), so that a test can
// kill a master and watch its replica take over.
func WithReplicas(n int) ClusterOption {
	return func(o *clusterOptions) { o.replicas = n }
}

// WithNodeTimeout sets cluster-node-timeout (redistest's default is 2s,
// Redis's 15s): how long a node may be unreachable before the others count
// it as failing, and so most of the time a master's failover takes.
func WithNodeTimeout(d time.Duration) ClusterOption {
	return func(o *clusterOptions) {
		o.args = append(o.args, "--cluster-node-timeout", strconv.FormatInt(d.Milliseconds(), 10))
	}
}

// WithFullCoverage sets cluster-require-full-coverage (Redis's default is
// yes). With yes, every node answers CLUSTERDOWN to every query while any
// slot has no live master, for instance from the moment a dead master is
// marked failed until its replica is promoted; with no, the other masters go
// on serving their own slots.
func WithFullCoverage(required bool) ClusterOption {
	v := "no"
	if required {
		v = "yes"
	}
	return func(o *clusterOptions) { o.args = append(o.args, "--cluster-require-full-coverage", v) }
}

// A ClusterNode is one node as a line of CLUSTER NODES describes it.
type ClusterNode struct {
	ID string
	// Addr is the node's "IP:PORT", without the bus port.
	Addr string
	// Flags are "myself", "master", "slave", "fail?", "fail", "handshake", …
	Flags []string
	// MasterID is the master a replica follows; "" for a master.
	MasterID string
	// Slots are the slot ranges the node serves, first and last included.
	Slots [][2]int
}

// Has reports whether the node carries flag.
func (n ClusterNode) Has(flag string) bool {
	for _, f := range n.Flags {
		if f == flag {
			return true
		}
	}
	return false
}

// Serves reports whether the node serves slot.
func (n ClusterNode) Serves(slot int) bool {
	for _, r := range n.Slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// parseClusterNodes parses a CLUSTER NODES reply:
// "<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv>
// <config-epoch> <link-state> <slot> <slot> ...". Slots being imported or
// migrated ("[slot->-id]") are left out.
func parseClusterNodes(text string) ([]ClusterNode, error) {
	var nodes []ClusterNode
	for _, line := range strings.Split(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			return nil, fmt.Errorf("CLUSTER NODES line %q: want at least 8 fields", line)
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := ClusterNode{ID: f[0], Addr: addr, Flags: strings.Split(f[2], ",")}
		if f[3] != "-" {
			n.MasterID = f[3]
		}
		for _, s := range f[8:] {
			if strings.HasPrefix(s, "[") {
				continue
			}
			lo, hi, isRange := strings.Cut(s, "-")
			if !isRange {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 != nil || err2 != nil || a > b {
				return nil, fmt.Errorf("CLUSTER NODES line %q: bad slot range %q", line, s)
			}
			n.Slots = append(n.Slots, [2]int{a, b})
		}
		nodes = append(nodes, n)
	}
	return nodes, nil
}

// ClusterNodes returns the cluster as the node s sees it (CLUSTER NODES).
func (s *Server) ClusterNodes() ([]ClusterNode, error) {
	replies, err := roundTrip(s.Addr, []string{"CLUSTER", "NODES"})
	if err != nil {
		return nil, fmt.Errorf("CLUSTER NODES on %s: %w", s.Addr, err)
	}
	return parseClusterNodes(replies[0])
}

// myself returns the line of CLUSTER NODES that describes s itself.
func (s *Server) myself() (ClusterNode, error) {
	nodes, err := s.ClusterNodes()
	if err != nil {
		return ClusterNode{}, err
	}
	for _, n := range nodes {
		if n.Has("myself") {
			return n, nil
		}
	}
	return ClusterNode{}, fmt.Errorf("CLUSTER NODES on %s: no line flagged myself", s.Addr)
}

// learnRoles waits until the first node sees every other as a master with
// slots or a replica, sorts them into masters (in slot order) and replicas,
// and waits until every replica's link to its master is up.
func (c *Cluster) learnRoles(ctx context.Context) error {
	err := waitFor(ctx, func() error {
		nodes, err := c.all[0].ClusterNodes()
		if err != nil {
			return err
		}
		var masters []ClusterNode
		c.nodes, c.replicas, c.Addrs = nil, nil, nil
		for _, n := range nodes {
			if c.server(n.Addr) == nil {
				return fmt.Errorf("CLUSTER NODES names %q, not a node of the cluster", n.Addr)
			}
			switch {
			case n.Has("master") && len(n.Slots) > 0:
				masters = append(masters, n)
			case n.Has("slave"):
				c.replicas = append(c.replicas, c.server(n.Addr))
			}
		}
		if len(masters) != clusterSize || len(masters)+len(c.replicas) != len(c.all) {
			return fmt.Errorf("%d masters with slots and %d replicas in CLUSTER NODES, want %d and %d",
				len(masters), len(c.replicas), clusterSize, len(c.all)-clusterSize)
		}
		sort.Slice(masters, func(i, j int) bool { return masters[i].Slots[0][0] < masters[j].Slots[0][0] })
		for _, m := range masters {
			c.nodes = append(c.nodes, c.server(m.Addr))
			c.Addrs = append(c.Addrs, m.Addr)
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, r := range c.replicas {
		err := waitFor(ctx, func() error {
			return checkInfo(r.Addr, "replication", map[string]string{"role": "slave", "master_link_status": "up"})
		})
		if err != nil {
			return fmt.Errorf("replica %s: %w", r.Addr, err)
		}
	}
	return nil
}

// checkInfo returns an error unless INFO section on addr has every field of
// want.
func checkInfo(addr, section string, want map[string]string) error {
	replies, err := roundTrip(addr, []string{"INFO", section})
	if err != nil {
		return err
	}
	for name, value := range want {
		if got, _ := infoField(replies[0], name); got != value {
			return fmt.Errorf("INFO %s = %q, want %q", name, got, value)
		}
	}
	return nil
}

// server returns the node of c at addr, or nil.
func (c *Cluster) server(addr string) *Server {
	for _, s := range c.all {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// Replicas returns the cluster's replicas as they were at start.
func (c *Cluster) Replicas() []*Server {
	return append([]*Server(nil), c.replicas...)
}

// view returns CLUSTER NODES from the first node that answers.
func (c *Cluster) view() ([]ClusterNode, error) {
	var errs []string
	for _, s := range c.all {
		nodes, err := s.ClusterNodes()
		if err == nil {
			return nodes, nil
		}
		errs = append(errs, err.Error())
	}
	return nil, fmt.Errorf("no node answers CLUSTER NODES: %s", strings.Join(errs, "; "))
}

// Slot returns the hash slot of key, as a live node computes it (CLUSTER
// KEYSLOT).
func (c *Cluster) Slot(t testing.TB, key string) int {
	t.Helper()
	for _, s := range c.all {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
		slot, err := cl.ClusterKeySlot(ctx, key).Result()
		cancel()
		cl.Close()
		if err == nil {
			return int(slot)
		}
	}
	t.Fatalf("redistest: CLUSTER KEYSLOT %q: no node answers", key)
	return 0
}

// MasterForSlot returns the live master that serves slot, as the first node
// that answers sees it.
func (c *Cluster) MasterForSlot(t testing.TB, slot int) *Server {
	t.Helper()
	nodes, err := c.view()
	if err != nil {
		t.Fatalf("redistest: master for slot %d: %v", slot, err)
	}
	for _, n := range nodes {
		if n.Has("master") && !n.Has("fail") && n.Serves(slot) {
			if s := c.server(n.Addr); s != nil {
				return s
			}
		}
	}
	t.Fatalf("redistest: no live master serves slot %d in %+v", slot, nodes)
	return nil
}

// MasterForKey returns the live master that serves key's slot.
func (c *Cluster) MasterForKey(t testing.TB, key string) *Server {
	t.Helper()
	return c.MasterForSlot(t, c.Slot(t, key))
}

// ReplicaOf returns a replica of master, as the first node that answers sees
// it.
func (c *Cluster) ReplicaOf(t testing.TB, master *Server) *Server {
	t.Helper()
	nodes, err := c.view()
	if err != nil {
		t.Fatalf("redistest: replica of %s: %v", master.Addr, err)
	}
	var id string
	for _, n := range nodes {
		if n.Addr == master.Addr {
			id = n.ID
		}
	}
	for _, n := range nodes {
		if id != "" && n.MasterID == id && !n.Has("fail") {
			if s := c.server(n.Addr); s != nil {
				return s
			}
		}
	}
	t.Fatalf("redistest: no replica of %s (id %q) in %+v", master.Addr, id, nodes)
	return nil
}

// WaitPromoted polls the CLUSTER NODES of replica until it calls itself a
// master that serves slots, and returns when it first saw that; it fails t
// after timeout. Polls are pollInterval apart, so the time is late by at
// most that plus one round trip.
func (c *Cluster) WaitPromoted(t testing.TB, replica *Server, timeout time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		me, err := replica.myself()
		if err == nil && me.Has("master") && len(me.Slots) > 0 {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s not promoted after %v: %+v, %v", replica.Addr, timeout, me, err)
		}
		time.Sleep(pollInterval)
	}
}
