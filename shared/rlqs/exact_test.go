package rlqs_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	rlqspb "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/tollgate-dev/tollgate/shared/redisinfo"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// modelEnvoy enforces one bucket's assignments as Envoy's filter does: a token
// bucket starts full and refills tokens_per_fill per whole second of fill_interval;
// an assignment equal to the one in force (max_tokens, tokens_per_fill, the nanos of
// fill_interval) keeps its state; an assignment lives its time to live in whole
// seconds from its arrival, and then, like a bucket without one, denies. It reports
// its usage every interval, and at once on its first request.
type modelEnvoy struct {
	st     rlqspb.RateLimitQuotaService_StreamRateLimitQuotasClient
	tenant string

	mu               sync.Mutex
	created          bool
	tb               *rlqspb.RateLimitQuotaResponse_BucketAction // the assignment in force
	tokens, rate     float64
	refilled         time.Time
	expires          time.Time
	allowed, denied  uint64
	lastReport       time.Time
	admitted         map[int64]int64 // by window (Unix seconds / period)
	period           time.Duration
	sendErr, recvErr error
}

func (m *modelEnvoy) receive() {
	for {
		r, err := m.st.Recv()
		if err != nil {
			m.mu.Lock()
			m.recvErr = err
			m.mu.Unlock()
			return
		}
		now := time.Now()
		m.mu.Lock()
		for _, a := range r.BucketAction {
			q := a.GetQuotaAssignmentAction()
			tb := q.GetRateLimitStrategy().GetTokenBucket()
			old := m.tb.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
			same := tb != nil && old != nil && tb.GetMaxTokens() == old.GetMaxTokens() &&
				tb.GetTokensPerFill().GetValue() == old.GetTokensPerFill().GetValue() &&
				tb.GetFillInterval().GetNanos() == old.GetFillInterval().GetNanos()
			if tb != nil && !same {
				m.tokens, m.refilled = float64(tb.GetMaxTokens()), now
				m.rate = float64(tb.GetTokensPerFill().GetValue()) / float64(tb.GetFillInterval().GetSeconds())
			}
			m.tb = a
			m.expires = now.Add(time.Duration(q.GetAssignmentTimeToLive().GetSeconds()) * time.Second)
		}
		m.mu.Unlock()
	}
}

// request decides one request now.
func (m *modelEnvoy) request(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ok := false
	if m.tb != nil && now.Before(m.expires) {
		s := m.tb.GetQuotaAssignmentAction().GetRateLimitStrategy()
		if tb := s.GetTokenBucket(); tb != nil {
			m.tokens = math.Min(float64(tb.GetMaxTokens()), m.tokens+now.Sub(m.refilled).Seconds()*m.rate)
			m.refilled = now
			if m.tokens >= 1 {
				m.tokens--
				ok = true
			}
		} else {
			ok = s.GetBlanketRule().String() == "ALLOW_ALL"
		}
	}
	if ok {
		m.allowed++
		m.admitted[now.UnixMicro()/m.period.Microseconds()]++
	} else {
		m.denied++
	}
	if !m.created {
		m.created = true
		m.reportLocked(now)
	}
}

// report sends the usage since the last report.
func (m *modelEnvoy) report(now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.created {
		m.reportLocked(now)
	}
}

func (m *modelEnvoy) reportLocked(now time.Time) {
	elapsed := time.Duration(0)
	if !m.lastReport.IsZero() {
		elapsed = now.Sub(m.lastReport).Truncate(time.Second)
	}
	m.lastReport = now
	u := usage(m.allowed, m.denied, elapsed, "tenant", m.tenant)
	u.TimeElapsed = durationpb.New(elapsed)
	m.allowed, m.denied = 0, 0
	if err := m.st.Send(&rlqspb.RateLimitQuotaUsageReports{Domain: "fleet", BucketQuotaUsages: []*rlqspb.RateLimitQuotaUsageReports_BucketQuotaUsage{u}}); err != nil {
		m.sendErr = err
	}
}

// TestNeverOverLimit runs three model Envoys, on two instances sharing one Redis,
// asking 3 times a tenant's limit of 2000 per 4s window between them (750, 500 and
// 250 requests per second), for five windows: in no window do they admit more than
// 2000 together.
func TestNeverOverLimit(t *testing.T) {
	doc := fleetPolicy("{timeout: 2s}", "{reporting_interval: 1s}", "2000/4s")
	const period = 4 * time.Second
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			url := b.start(t)
			c1, _ := serve(t, newEngine(t, url, b.cluster, doc), rlqs.Limits{})
			c2, _ := serve(t, newEngine(t, url, b.cluster, doc), rlqs.Limits{})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			rates := []float64{750, 500, 250}
			var envoys []*modelEnvoy
			for i, r := range rates {
				c := c1
				if i%2 == 1 {
					c = c2
				}
				st, err := c.StreamRateLimitQuotas(ctx)
				if err != nil {
					t.Fatal(err)
				}
				m := &modelEnvoy{st: st, tenant: "e", admitted: map[int64]int64{}, period: period}
				go m.receive()
				envoys = append(envoys, m)
				_ = r
			}
			calls0 := commandsProcessed(t, url, b.cluster)
			start := time.Now()
			end := start.Add(5*period + period/2)
			var wg sync.WaitGroup
			for i, m := range envoys {
				wg.Add(1)
				go func(m *modelEnvoy, rate float64) {
					defer wg.Done()
					tick := time.NewTicker(5 * time.Millisecond)
					defer tick.Stop()
					next := time.Now().Add(time.Second)
					owed := 0.0
					last := time.Now()
					for now := range tick.C {
						if now.After(end) {
							return
						}
						owed += now.Sub(last).Seconds() * rate
						last = now
						for ; owed >= 1; owed-- {
							m.request(now)
						}
						if now.After(next) {
							m.report(now)
							next = next.Add(time.Second)
						}
					}
				}(m, rates[i])
			}
			wg.Wait()
			total := map[int64]int64{}
			for _, m := range envoys {
				m.mu.Lock()
				if m.sendErr != nil || m.recvErr != nil {
					t.Errorf("stream failed: send %v, receive %v", m.sendErr, m.recvErr)
				}
				for w, n := range m.admitted {
					total[w] += n
				}
				m.mu.Unlock()
			}
			calls := commandsProcessed(t, url, b.cluster) - calls0
			var admitted int64
			for _, n := range total {
				admitted += n
			}
			t.Logf("Redis round trips %d for %d admitted requests: %.4f per request (reports every second; Envoy's every 5s send a fifth as many)", calls, admitted, float64(calls)/float64(max(1, admitted)))
			first, last := start.UnixMicro()/period.Microseconds(), end.UnixMicro()/period.Microseconds()
			for w := first; w <= last; w++ {
				var per []int64
				for _, m := range envoys {
					per = append(per, m.admitted[w])
				}
				t.Logf("window %d: admitted %d of 2000 (per Envoy %v)", w-first, total[w], per)
				if total[w] > 2000 {
					t.Errorf("window %d: admitted %d, over the limit of 2000", w-first, total[w])
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
