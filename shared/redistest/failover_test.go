package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestParseClusterNodes(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		text string
		want []ClusterNode
	}{
		{
			name: "master and replica",
			text: "07c37dfeb235213a872192d90877d0cd55635b91 127.0.0.1:30004@31004,host.example slave e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 0 1426238317239 4 connected\n" +
				"e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca 127.0.0.1:30001@31001 myself,master - 0 0 1 connected 0-5460 5462 [5463->-292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f]\n",
			want: []ClusterNode{
				{ID: "07c37dfeb235213a872192d90877d0cd55635b91", Addr: "127.0.0.1:30004", Flags: []string{"slave"}, MasterID: "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca"},
				{ID: "e7d1eecce10fd6bb5eb35b9f99a514335d9ba9ca", Addr: "127.0.0.1:30001", Flags: []string{"myself", "master"}, Slots: [][2]int{{0, 5460}, {5462, 5462}}},
			},
		},
		{
			name: "failed master",
			text: "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f 127.0.0.1:30003@31003 master,fail - 1426238316232 1426238315000 3 disconnected\n",
			want: []ClusterNode{
				{ID: "292f8b365bb7edb5e285caf0b7e6ddc7265d2f4f", Addr: "127.0.0.1:30003", Flags: []string{"master", "fail"}},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseClusterNodes(tt.text)
			if err != nil {
				t.Fatalf("parseClusterNodes() = %v, want nil", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("parseClusterNodes() = %+v, want %+v", got, tt.want)
			}
		})
	}
	for _, bad := range []string{"id 127.0.0.1:1@2 master", "id 127.0.0.1:1@2 master - 0 0 1 connected 9-x", "id 127.0.0.1:1@2 master - 0 0 1 connected 9-3"} {
		if _, err := parseClusterNodes(bad); err == nil {
			t.Errorf("parseClusterNodes(%q) = nil error, want an error", bad)
		}
	}
}

func TestClusterNodeServes(t *testing.T) {
	t.Parallel()
	n := ClusterNode{Flags: []string{"master", "fail?"}, Slots: [][2]int{{0, 10}, {20, 20}}}
	tests := []struct {
		slot int
		want bool
	}{{0, true}, {10, true}, {11, false}, {20, true}, {21, false}}
	for _, tt := range tests {
		if got := n.Serves(tt.slot); got != tt.want {
			t.Errorf("Serves(%d) = %v, want %v", tt.slot, got, tt.want)
		}
	}
	if !n.Has("fail?") || n.Has("fail") {
		t.Errorf("Has(fail?), Has(fail) = %v, %v, want true, false", n.Has("fail?"), n.Has("fail"))
	}
}

func TestClusterWithReplicas(t *testing.T) {
	t.Parallel()
	c := StartCluster(t, WithReplicas(1), WithNodeTimeout(1500*time.Millisecond), WithFullCoverage(false))
	if got := len(c.Nodes()); got != clusterSize {
		t.Errorf("len(Nodes()) = %d, want %d", got, clusterSize)
	}
	if got := len(c.Replicas()); got != clusterSize {
		t.Errorf("len(Replicas()) = %d, want %d", got, clusterSize)
	}
	followed := map[*Server]bool{}
	for _, m := range c.Nodes() {
		r := c.ReplicaOf(t, m)
		if followed[r] {
			t.Errorf("ReplicaOf(%s) = %s, which already follows another master", m.Addr, r.Addr)
		}
		followed[r] = true
	}
	for i, m := range c.Nodes() {
		for _, cfg := range []struct{ name, want string }{
			{"cluster-node-timeout", "1500"},
			{"cluster-require-full-coverage", "no"},
		} {
			got, err := m.Client(t).ConfigGet(t.Context(), cfg.name).Result()
			if err != nil || got[cfg.name] != cfg.want {
				t.Errorf("CONFIG GET %s on master %d = %v, %v, want %s", cfg.name, i, got, err, cfg.want)
			}
		}
	}
	// Every key lands on the master that MasterForKey names.
	cc := c.Client(t)
	for i := range 20 {
		key := fmt.Sprintf("key:%d", i)
		want := c.MasterForKey(t, key)
		got, err := cc.MasterForKey(t.Context(), key)
		if err != nil {
			t.Fatalf("ClusterClient.MasterForKey(%s) = %v, want nil", key, err)
		}
		if got.Options().Addr != want.Addr {
			t.Errorf("MasterForKey(%s) = %s, want %s (go-redis)", key, want.Addr, got.Options().Addr)
		}
	}
}

// TestClusterFailover kills a master of a 3+3 cluster and measures how long its
// replica takes to be promoted, and for how long a healthy master answers
// CLUSTERDOWN meanwhile: from when the dead master is marked failed until the
// promotion with cluster-require-full-coverage yes, never with no.
func TestClusterFailover(t *testing.T) {
	t.Parallel()
	const nodeTimeout = time.Second
	for _, full := range []bool{true, false} {
		t.Run(fmt.Sprintf("full coverage %v", full), func(t *testing.T) {
			t.Parallel()
			c := StartCluster(t, WithReplicas(1), WithNodeTimeout(nodeTimeout), WithFullCoverage(full))
			dead := c.MasterForKey(t, "doomed")
			replica := c.ReplicaOf(t, dead)
			var healthy *Server
			var healthyKey string
			for i := 0; healthy == nil; i++ {
				k := fmt.Sprintf("healthy:%d", i)
				if m := c.MasterForKey(t, k); m != dead {
					healthy, healthyKey = m, k
				}
			}
			if got := healthy.Do(t, "SET", healthyKey, "v"); got != "OK" {
				t.Fatalf("SET %s on %s = %v, want OK", healthyKey, healthy.Addr, got)
			}

			// Ask the healthy master for its own key until the failover is over.
			stop := make(chan struct{})
			var down []time.Time
			var other []error
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					_, err := roundTrip(healthy.Addr, []string{"GET", healthyKey})
					switch {
					case err == nil:
					case strings.Contains(err.Error(), "CLUSTERDOWN"):
						down = append(down, time.Now())
					default:
						other = append(other, err)
					}
					time.Sleep(5 * time.Millisecond)
				}
			}()

			dead.Kill()
			killed := time.Now()
			promoted := c.WaitPromoted(t, replica, 10*nodeTimeout)
			// The other masters learn of the promotion from the replica's broadcast;
			// give them well over that, then stop asking.
			time.Sleep(time.Second)
			close(stop)
			wg.Wait()

			t.Logf("promotion %v after the kill (node timeout %v)", promoted.Sub(killed).Round(time.Millisecond), nodeTimeout)
			if len(other) > 0 {
				t.Errorf("GET %s on healthy %s failed %d times with other errors, first %v", healthyKey, healthy.Addr, len(other), other[0])
			}
			if d := promoted.Sub(killed); d < nodeTimeout || d > 5*nodeTimeout {
				t.Errorf("promotion %v after the kill, want between the node timeout %v and %v", d, nodeTimeout, 5*nodeTimeout)
			}
			if !full {
				if len(down) > 0 {
					t.Errorf("CLUSTERDOWN answers from a healthy master = %d (from %v to %v after the kill), want 0 with full coverage no",
						len(down), down[0].Sub(killed), down[len(down)-1].Sub(killed))
				}
			} else {
				if len(down) == 0 {
					t.Fatalf("CLUSTERDOWN answers from a healthy master = 0, want some with full coverage yes")
				}
				first, last := down[0].Sub(killed), down[len(down)-1].Sub(killed)
				t.Logf("healthy master answered CLUSTERDOWN %d times, from %v to %v after the kill (%v; promotion at %v)",
					len(down), first.Round(time.Millisecond), last.Round(time.Millisecond), (last - first).Round(time.Millisecond), promoted.Sub(killed).Round(time.Millisecond))
				if first < nodeTimeout {
					t.Errorf("first CLUSTERDOWN %v after the kill, want after the node timeout %v", first, nodeTimeout)
				}
				if end := promoted.Add(500 * time.Millisecond); down[len(down)-1].After(end) {
					t.Errorf("last CLUSTERDOWN %v after the promotion, want at most 500ms", down[len(down)-1].Sub(promoted))
				}
			}

			if got := c.MasterForKey(t, "doomed"); got != replica {
				t.Errorf("MasterForKey(doomed) after failover = %s, want the replica %s", got.Addr, replica.Addr)
			}
			if got := replica.Do(t, "SET", "doomed", "v"); got != "OK" {
				t.Errorf("SET doomed on the promoted replica = %v, want OK", got)
			}
		})
	}
}

func TestSentinelFailover(t *testing.T) {
	t.Parallel()
	s := StartSentinel(t, WithDownAfter(time.Second), WithFailoverTimeout(5*time.Second))
	for _, sn := range s.Sentinels() {
		if got, err := s.MasterAddr(sn); err != nil || got != s.Master().Addr {
			t.Fatalf("MasterAddr(%s) = %q, %v, want %q", sn.Addr, got, err, s.Master().Addr)
		}
	}
	opt, err := redis.ParseURL(strings.Split(s.URL(), "?")[0])
	if err != nil || opt.Addr != s.Sentinels()[0].Addr {
		t.Fatalf("URL() = %q, want the first Sentinel's address first", s.URL())
	}
	if !strings.HasSuffix(s.URL(), "&master_name="+MasterName) || strings.Count(s.URL(), "addr=") != sentinelCount-1 {
		t.Errorf("URL() = %q, want the other Sentinels as addr= and master_name=%s", s.URL(), MasterName)
	}

	var addrs []string
	for _, sn := range s.Sentinels() {
		addrs = append(addrs, sn.Addr)
	}
	fc := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: MasterName, SentinelAddrs: addrs})
	defer fc.Close()
	ctx := t.Context()
	if err := fc.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatalf("Set(k) through the Sentinels = %v, want nil", err)
	}
	// The write reaches the replica before the master dies.
	if got, err := s.Master().Client(t).Wait(ctx, 1, time.Second).Result(); err != nil || got != 1 {
		t.Fatalf("WAIT 1 = %d, %v, want 1, nil", got, err)
	}

	s.Master().Kill()
	killed := time.Now()
	p := s.WaitPromoted(t, s.Replica(), 20*time.Second)
	t.Logf("replica role:master %v after the kill; first Sentinel named it %v, all %v",
		p.Promoted.Sub(killed).Round(time.Millisecond), p.Announced.Sub(killed).Round(time.Millisecond), p.Agreed.Sub(killed).Round(time.Millisecond))
	if d := p.Announced.Sub(killed); d < time.Second || d > 15*time.Second {
		t.Errorf("first Sentinel named the new master %v after the kill, want between down-after 1s and 15s", d)
	}
	if p.Agreed.Before(p.Announced) {
		t.Errorf("Agreed %v before Announced %v", p.Agreed, p.Announced)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, err := fc.Get(ctx, "k").Result()
		if err == nil {
			if got != "v" {
				t.Errorf("Get(k) after failover = %q, want v", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Get(k) through the Sentinels 5s after the failover = %v, want v", err)
		}
		time.Sleep(pollInterval)
	}
}

func TestCleanupStopsFailoverProcesses(t *testing.T) {
	t.Parallel()
	requireBinaries(t, serverBinary, cliBinary)
	RequireSentinel(t)
	var addrs []string
	t.Run("start", func(t *testing.T) {
		c := StartCluster(t, WithReplicas(1))
		for _, n := range c.all {
			addrs = append(addrs, n.Addr)
		}
		s := StartSentinel(t)
		addrs = append(addrs, s.Master().Addr, s.Replica().Addr)
		for _, sn := range s.Sentinels() {
			addrs = append(addrs, sn.Addr)
		}
		for _, addr := range addrs {
			conn, err := net.DialTimeout("tcp", addr, time.Second)
			if err != nil {
				t.Fatalf("Dial(%s) while running = %v, want nil", addr, err)
			}
			conn.Close()
		}
	})
	if want := 2*clusterSize + 2 + sentinelCount; len(addrs) != want {
		t.Fatalf("started %d processes, want %d", len(addrs), want)
	}
	for _, addr := range addrs {
		assertClosed(t, addr)
	}
}

// errCheck is a sentinel for TestWaitFor.
var errCheck = errors.New("not yet")

func TestWaitFor(t *testing.T) {
	t.Parallel()
	calls := 0
	err := waitFor(t.Context(), func() error {
		calls++
		if calls < 3 {
			return errCheck
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Errorf("waitFor() = %v after %d calls, want nil after 3", err, calls)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
	defer cancel()
	if err := waitFor(ctx, func() error { return errCheck }); !errors.Is(err, errCheck) {
		t.Errorf("waitFor() until the context ends = %v, want %v", err, errCheck)
	}
}
