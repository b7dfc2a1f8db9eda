package redistest

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// sentinelCount is the number of Sentinels StartSentinel runs.
	sentinelCount = 3
	// sentinelQuorum is how many Sentinels must agree that the master is down.
	sentinelQuorum = 2
	// MasterName is the name the Sentinels of StartSentinel monitor.
	MasterName = "mymaster"
)

// A SentinelOption changes how StartSentinel runs its Sentinels.
type SentinelOption func(*sentinelOptions)

type sentinelOptions struct {
	downAfter       time.Duration
	failoverTimeout time.Duration
}

// WithDownAfter sets the Sentinels' down-after-milliseconds (redistest's
// default is 1s, Redis's 30s): how long the master may fail to answer before
// a Sentinel counts it as down and, with a quorum of others, fails it over.
func WithDownAfter(d time.Duration) SentinelOption {
	return func(o *sentinelOptions) { o.downAfter = d }
}

// WithFailoverTimeout sets the Sentinels' failover-timeout (redistest's
// default is 5s, Redis's 3 min): how long a failover may take before it is
// abandoned, and twice that before the same master is failed over again.
func WithFailoverTimeout(d time.Duration) SentinelOption {
	return func(o *sentinelOptions) { o.failoverTimeout = d }
}

// Sentinel is a master with one replica, watched by three Sentinels (quorum
// 2) under the name MasterName, all on loopback.
type Sentinel struct {
	master    *Server
	replica   *Server
	sentinels []*Server
}

// StartSentinel starts a master, a replica of it, and three redis-sentinel
// processes, each with its own configuration file in its own directory, and
// waits until the replica is in sync and every Sentinel knows the replica
// and the two other Sentinels. The processes are killed when t ends.
func StartSentinel(t testing.TB, opts ...SentinelOption) *Sentinel {
	t.Helper()
	requireBinaries(t, serverBinary)
	RequireSentinel(t)
	o := sentinelOptions{downAfter: time.Second, failoverTimeout: 5 * time.Second}
	for _, opt := range opts {
		opt(&o)
	}

	master := StartServer(t)
	_, port, _ := net.SplitHostPort(master.Addr)
	replica := StartServer(t, WithArgs("--replicaof", "127.0.0.1", port))
	s := &Sentinel{master: master, replica: replica}
	ctx, cancel := context.WithTimeout(context.Background(), clusterTimeout)
	defer cancel()
	if err := waitFor(ctx, func() error {
		return checkInfo(replica.Addr, "replication", map[string]string{"role": "slave", "master_link_status": "up"})
	}); err != nil {
		t.Fatalf("redistest: replica %s of %s: %v", replica.Addr, master.Addr, err)
	}

	conf := fmt.Sprintf("sentinel monitor %s 127.0.0.1 %s %d\n"+
		"sentinel down-after-milliseconds %s %d\n"+
		"sentinel failover-timeout %s %d\n"+
		"sentinel parallel-syncs %s 1\n",
		MasterName, port, sentinelQuorum,
		MasterName, o.downAfter.Milliseconds(),
		MasterName, o.failoverTimeout.Milliseconds(),
		MasterName)
	errs := make([]error, sentinelCount)
	var wg sync.WaitGroup
	for i := range sentinelCount {
		sn := newServer(t, nil, false)
		sn.sentinelConf = filepath.Join(sn.dir, "sentinel.conf")
		if err := os.WriteFile(sn.sentinelConf, []byte(conf), 0o644); err != nil {
			t.Fatalf("redistest: write %s: %v", sn.sentinelConf, err)
		}
		s.sentinels = append(s.sentinels, sn)
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = sn.startFresh(false)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			s.sentinels[i].logStartFailure(t)
			t.Fatalf("redistest: start sentinel %d: %v", i, err)
		}
	}
	// A Sentinel that a busy machine's scheduling put in TILT mode keeps its flags
	// (a replica it saw as down) for 30 s before it looks again: wait beyond that.
	sctx, scancel := context.WithTimeout(context.Background(), sentinelTimeout)
	defer scancel()
	for _, sn := range s.sentinels {
		if err := waitFor(sctx, func() error { return s.knows(sctx, sn) }); err != nil {
			t.Fatalf("redistest: sentinel %s: %v", sn.Addr, err)
		}
	}
	return s
}

// sentinelArgv is the redis-sentinel command line for s.
func sentinelArgv(s *Server) []string {
	return []string{
		s.sentinelConf,
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--daemonize", "no",
	}
}

// knows returns an error unless the Sentinel sn sees the replica in sync and
// both other Sentinels.
func (s *Sentinel) knows(ctx context.Context, sn *Server) error {
	c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
	defer c.Close()
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	peers, err := c.Sentinels(pctx, MasterName).Result()
	if err != nil {
		return err
	}
	if len(peers) != sentinelCount-1 {
		return fmt.Errorf("SENTINEL SENTINELS lists %d, want %d", len(peers), sentinelCount-1)
	}
	replicas, err := c.Replicas(pctx, MasterName).Result()
	if err != nil {
		return err
	}
	for _, r := range replicas {
		if net.JoinHostPort(r["ip"], r["port"]) == s.replica.Addr && r["flags"] == "slave" && r["master-link-status"] == "ok" {
			return nil
		}
	}
	return fmt.Errorf("SENTINEL REPLICAS = %v, want %s, flags slave, link ok", replicas, s.replica.Addr)
}

// waitFor calls check every pollInterval until it returns nil or ctx ends.
func waitFor(ctx context.Context, check func() error) error {
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pollInterval):
		}
	}
}

// Master returns the master the Sentinels were started on.
func (s *Sentinel) Master() *Server { return s.master }

// Replica returns the replica the Sentinels were started with.
func (s *Sentinel) Replica() *Server { return s.replica }

// Sentinels returns the Sentinel processes.
func (s *Sentinel) Sentinels() []*Server { return append([]*Server(nil), s.sentinels...) }

// URL returns the Sentinels in the form tollgate's REDIS_URL takes for
// Sentinel mode: "redis://127.0.0.1:S1?addr=127.0.0.1:S2&addr=127.0.0.1:S3&master_name=mymaster".
func (s *Sentinel) URL() string {
	q := url.Values{}
	for _, sn := range s.sentinels[1:] {
		q.Add("addr", sn.Addr)
	}
	q.Set("master_name", MasterName)
	u := url.URL{Scheme: "redis", Host: s.sentinels[0].Addr, RawQuery: q.Encode()}
	return u.String()
}

// MasterAddr returns the master's address as the Sentinel sn names it
// (SENTINEL GET-MASTER-ADDR-BY-NAME).
func (s *Sentinel) MasterAddr(sn *Server) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), probeTimeout)
	defer cancel()
	hp, err := c.GetMasterAddrByName(ctx, MasterName).Result()
	if err != nil {
		return "", err
	}
	if len(hp) != 2 {
		return "", fmt.Errorf("GET-MASTER-ADDR-BY-NAME = %q, want host and port", hp)
	}
	return net.JoinHostPort(hp[0], hp[1]), nil
}

// A Promotion is when a failover's steps were seen.
type Promotion struct {
	// Promoted is when the replica first reported role:master.
	Promoted time.Time
	// Announced is when the first Sentinel named the replica as the master;
	// a Sentinel client can find the new master from then on.
	Announced time.Time
	// Agreed is when every Sentinel named it.
	Agreed time.Time
}

// WaitPromoted polls the replica's INFO replication and every Sentinel until
// the replica is master and every Sentinel names it, and returns when each
// was first seen; it fails t after timeout. Polls are pollInterval apart.
func (s *Sentinel) WaitPromoted(t testing.TB, replica *Server, timeout time.Duration) Promotion {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var p Promotion
	named := make([]bool, len(s.sentinels))
	for {
		if p.Promoted.IsZero() && checkInfo(replica.Addr, "replication", map[string]string{"role": "master"}) == nil {
			p.Promoted = time.Now()
		}
		all := true
		for i, sn := range s.sentinels {
			if !named[i] {
				addr, err := s.MasterAddr(sn)
				named[i] = err == nil && addr == replica.Addr
			}
			if named[i] && p.Announced.IsZero() {
				p.Announced = time.Now()
			}
			all = all && named[i]
		}
		if all && p.Agreed.IsZero() {
			p.Agreed = time.Now()
		}
		if !p.Promoted.IsZero() && !p.Agreed.IsZero() {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: %s not promoted after %v: %+v, named by sentinels %v", replica.Addr, timeout, p, named)
		}
		time.Sleep(pollInterval)
	}
}
