package rlqs_test

import (
	"context"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/redis/go-redis/v9"

	"github.com/tollgate-dev/tollgate/internal/envoyrlqs"
	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// denyAll is the fallback that makes the fleet exact: a bucket without a grant
// denies (see docs/rlqs.md).
var denyAll = &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}

// newEnvoy returns a simulated Envoy (package envoyrlqs, written from Envoy's
// filter) whose one bucket is {tenant: tenant}, on client, denying without a
// grant and reporting every second; Stats counts its admissions in windows of
// window.
func newEnvoy(t *testing.T, client rlqspb.RateLimitQuotaServiceClient, tenant string, window time.Duration) *envoyrlqs.Envoy {
	t.Helper()
	e, err := envoyrlqs.New(envoyrlqs.Config{
		Domain:         "fleet",
		Clients:        []rlqspb.RateLimitQuotaServiceClient{client},
		BucketID:       map[string]envoyrlqs.Value{"tenant": {String: tenant}},
		NoAssignment:   denyAll,
		ReportInterval: time.Second,
		Window:         window,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.Close)
	return e
}

// drive sends requests through each Envoy at its rate (requests per second)
// until end.
func drive(envoys []*envoyrlqs.Envoy, rates []float64, end time.Time) {
	var wg sync.WaitGroup
	for i, e := range envoys {
		wg.Go(func() {
			tick := time.NewTicker(5 * time.Millisecond)
			defer tick.Stop()
			owed, last := 0.0, time.Now()
			for now := range tick.C {
				if now.After(end) {
					return
				}
				owed += now.Sub(last).Seconds() * rates[i]
				last = now
				for ; owed >= 1; owed-- {
					e.Request(nil)
				}
			}
		})
	}
	wg.Wait()
}

// admittedBy returns what each Envoy admitted in each window of its Stats, and
// fails the test if a stream broke or a report was lost.
func admittedBy(t *testing.T, envoys []*envoyrlqs.Envoy) []map[int64]int64 {
	t.Helper()
	out := make([]map[int64]int64, len(envoys))
	for i, e := range envoys {
		if rc := e.ReportCounts(); rc.Broken != 0 || rc.Dropped != 0 {
			t.Errorf("envoy %d: %d streams broke, %d reports lost; want none", i, rc.Broken, rc.Dropped)
		}
		out[i] = map[int64]int64{}
		for _, m := range e.Stats() {
			for w, c := range m {
				out[i][w] += c.Admitted
			}
		}
	}
	return out
}

// TestNeverOverLimit runs three simulated Envoys, on two instances sharing one
// Redis, asking 3 times a tenant's limit of 2000 per 4s window between them (750,
// 500 and 250 requests per second), for five windows: in no window do they admit
// more than 2000 together.
func TestNeverOverLimit(t *testing.T) {
	doc := fleetPolicy("{timeout: 2s}", "{reporting_interval: 1s}", "2000/4s")
	const period = 4 * time.Second
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.start(t)
			c1, _ := serve(t, newEngine(t, url, b.cluster, doc), rlqs.Limits{})
			c2, _ := serve(t, newEngine(t, url, b.cluster, doc), rlqs.Limits{})
			rates := []float64{750, 500, 250}
			envoys := []*envoyrlqs.Envoy{newEnvoy(t, c1, "e", period), newEnvoy(t, c2, "e", period), newEnvoy(t, c1, "e", period)}
			calls0 := commandsProcessed(t, url, b.cluster)
			start := time.Now()
			end := start.Add(5*period + period/2)
			drive(envoys, rates, end)
			per := admittedBy(t, envoys)
			calls := commandsProcessed(t, url, b.cluster) - calls0
			var admitted int64
			for _, m := range per {
				for _, n := range m {
					admitted += n
				}
			}
			t.Logf("Redis round trips %d for %d admitted requests: %.4f per request (reports every second; Envoy's every 5s send a fifth as many)", calls, admitted, float64(calls)/float64(max(1, admitted)))
			first, last := start.UnixNano()/int64(period), end.UnixNano()/int64(period)
			for w := first; w <= last; w++ {
				var each []int64
				var total int64
				for _, m := range per {
					each = append(each, m[w])
					total += m[w]
				}
				t.Logf("window %d: admitted %d of 2000 (per Envoy %v)", w-first, total, each)
				if total > 2000 {
					t.Errorf("window %d: admitted %d, over the limit of 2000", w-first, total)
				}
			}
		})
	}
}

// commandsProcessed returns the store round trips the Redis at url (every master of
// a cluster) has served: its script calls (FCALL, EVALSHA, EVAL) and its INCRBYs, the
// first round trip of a one-limit fixed_window request counted with no script (the
// scripts run none; a counted denial's second round trip is not counted).
func commandsProcessed(t *testing.T, url string, cluster bool) int64 {
	t.Helper()
	ctx := context.Background()
	scripts := func(name string) bool {
		return name == "fcall" || name == "evalsha" || name == "eval" || name == "incrby"
	}
	var mu sync.Mutex
	var n float64
	read := func(ctx context.Context, c redis.UniversalClient) error {
		st, err := redisinfo.Read(ctx, c)
		mu.Lock()
		n += st.Sum(scripts).Calls
		mu.Unlock()
		return err
	}
	if cluster {
		opt, err := redis.ParseClusterURL(url)
		if err != nil {
			t.Fatal(err)
		}
		c := redis.NewClusterClient(opt)
		defer c.Close()
		if err := c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error { return read(ctx, node) }); err != nil {
			t.Fatal(err)
		}
		return int64(n)
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := read(ctx, c); err != nil {
		t.Fatal(err)
	}
	return int64(n)
}
