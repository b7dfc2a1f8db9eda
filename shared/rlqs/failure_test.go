package rlqs_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// TestRedisUnreachable kills Redis under a stream: the grant in force stays (no new
// assignment replaces it), a new bucket gets the policy's failure mode (closed: a
// blanket deny for one reporting interval), and once Redis is back new buckets get
// grants again.
func TestRedisUnreachable(t *testing.T) {
	doc := fleetPolicy("{mode: closed, timeout: 200ms, breaker: {failures: 1, open_for: 500ms}}", "{}", "6000/60s")
	srv := redistest.StartServer(t)
	eng := newEngine(t, "redis://"+srv.Addr, false, doc)
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	e := openEnvoy(t, ctx, c)
	e.send(usage(0, 1, 0, "tenant", "held"))
	e.waitFor(1)
	held := e.last().action
	if g := grantOf(held); g < 1 {
		t.Fatalf("grant before the failure = %d, want at least 1", g)
	}
	srv.Kill()

	// The bucket with a grant: a report changes nothing.
	n := e.count()
	e.send(usage(5, 0, 5*time.Second, "tenant", "held"), usage(0, 1, 0, "tenant", "new"))
	e.waitFor(n + 1)
	time.Sleep(300 * time.Millisecond) // room for a wrong second action to arrive
	if got := e.count(); got != n+1 {
		t.Fatalf("received %d actions for a report of two buckets, want 1 (the new bucket's; the grant in force stays)", got-n)
	}
	a := e.last().action
	if a.GetBucketId().GetBucket()["tenant"] != "new" {
		t.Fatalf("action for %v, want the new bucket", a.GetBucketId())
	}
	if s := a.GetQuotaAssignmentAction().GetRateLimitStrategy(); s.GetBlanketRule().String() != "DENY_ALL" || s.GetTokenBucket() != nil {
		t.Errorf("new bucket while Redis is down: %v, want a blanket DENY_ALL (failure mode closed)", a)
	}
	if ttl := a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); ttl != policy.DefaultRLQSReportingInterval {
		t.Errorf("failure mode's ttl = %s, want one reporting interval", ttl)
	}

	srv.Restart(t)
	for i := 0; ; i++ {
		n := e.count()
		e.send(usage(0, 1, 0, "tenant", "after"+strconv.Itoa(i)))
		e.waitFor(n + 1)
		if grantOf(e.last().action) > 0 {
			break
		}
		if i > 100 {
			t.Fatalf("no grant after Redis came back: %v", e.last().action)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestAbandonIdle reports a bucket without requests: after a minute of Envoy's
// reports (12) the service abandons it, and gives back its grant.
func TestAbandonIdle(t *testing.T) {
	eng := newEngine(t, "redis://"+redistest.StartServer(t).Addr, false, testPolicy)
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := openEnvoy(t, ctx, c)
	e.send(usage(0, 1, 0, "tenant", "idle"))
	e.waitFor(1)
	for range 12 {
		e.send(usage(0, 0, 5*time.Second, "tenant", "idle"))
	}
	waitUntil(t, "the bucket abandoned", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		a := e.actions[len(e.actions)-1].action
		return a.GetAbandonAction() != nil
	})
	waitUntil(t, "its grant given back", func() bool { return remaining(t, eng, "idle") == 6000 })
}

// TestPolicyReload changes the tenant's limit under a stream: the bucket's next
// report is decided by the new policy's limit.
func TestPolicyReload(t *testing.T) {
	eng := newEngine(t, "redis://"+redistest.StartServer(t).Addr, false, testPolicy)
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := openEnvoy(t, ctx, c)
	e.send(usage(0, 1, 0, "tenant", "r"))
	e.waitFor(1)
	p, err := policy.Parse([]byte(fleetPolicy("{timeout: 2s}", "{}", "30/10s")))
	if err != nil {
		t.Fatal(err)
	}
	if err := eng.SetPolicy(p); err != nil {
		t.Fatal(err)
	}
	first := e.last().action.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetFillInterval().GetNanos()
	n := e.count()
	e.send(usage(0, 100, 5*time.Second, "tenant", "r"))
	// The next new assignment (the same one sent again to end nearer the window's
	// end does not count) is within the new limit.
	waitUntil(t, "a new assignment", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, r := range e.actions[n:] {
			if r.action.GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetFillInterval().GetNanos() != first {
				if g := grantOf(r.action); g > 30 {
					t.Fatalf("grant %d after the reload, over the new limit of 30: %v", g, r.action)
				}
				return true
			}
		}
		return false
	})
}

// TestLocalGrantsCharged: under failure mode local, a bucket's grants while Redis
// is down are counted nowhere; when Redis answers again within the same window, the
// grant taken from it charges beside its own the local grant in force and what
// Envoy reported admitting under local grants in that window, so that the window
// holds to the limit.
func TestLocalGrantsCharged(t *testing.T) {
	doc := fleetPolicy("{mode: local, expected_instances: 1, timeout: 200ms, breaker: {failures: 1, open_for: 200ms}}", "{reporting_interval: 1s}", "1000/10s")
	srv := redistest.StartServer(t)
	eng := newEngine(t, "redis://"+srv.Addr, false, doc)
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	srv.Kill()
	// Early in a window, so that the whole test fits in it.
	const window = 10 * time.Second
	start := nextWindow(window, 100*time.Millisecond)
	e := joinEnvoys(t, ctx, c, "l", 1)[0]
	local := e.last().action
	if g, ttl := grantOf(local), local.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration(); g != 100 || ttl != time.Second {
		t.Fatalf("grant with Redis down: %d units for %s, want failure mode local's 100 (1000 × 1s / 10s) for one reporting interval", g, ttl)
	}
	// Envoy admitted 30 under it; the next report gets another local grant.
	e.send(usage(30, 0, time.Second, "tenant", "l"))
	e.waitFor(2)
	if g := grantOf(e.last().action); g != 100 {
		t.Fatalf("second local grant: %d units, want 100", g)
	}
	srv.Restart(t)
	var grant int64
	for i := 0; ; i++ {
		n := e.count()
		e.send(usage(0, 50, time.Second, "tenant", "l"))
		e.waitFor(n + 1)
		a := e.last().action
		if a.GetQuotaAssignmentAction().GetAssignmentTimeToLive().AsDuration() > time.Second {
			grant = grantOf(a)
			break
		}
		if i > 50 || time.Since(start) > 5*time.Second {
			t.Fatalf("no grant from Redis after it came back: %v", a)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if time.Since(start) > window-time.Second {
		t.Fatal("the test ran past its window")
	}
	// A sweep's push may hold one unit for a moment (it takes one to learn the
	// window, and gives it back): read until it settles.
	want := 1000 - grant - 100 - 30
	got := remaining(t, eng, "l")
	for deadline := time.Now().Add(time.Second); got != want && time.Now().Before(deadline); got = remaining(t, eng, "l") {
		time.Sleep(20 * time.Millisecond)
	}
	if got != want {
		t.Errorf("Redis has %d left after a grant of %d, want %d: the local grant in force (100) and the 30 admitted under local grants charged beside it", got, grant, want)
	}
}

// TestLocalPushedAtWindowStart: under failure mode local, with Redis down, an Envoy
// with demand is pushed its local grant at each window's start, as a grant from
// Redis would be, without waiting for its next report (late in a short window, a
// report has no room left for a grant of a whole second).
func TestLocalPushedAtWindowStart(t *testing.T) {
	doc := fleetPolicy("{mode: local, expected_instances: 2, timeout: 200ms, breaker: {failures: 1, open_for: 200ms}}", "{reporting_interval: 1s}", "1000/2s")
	srv := redistest.StartServer(t)
	eng := newEngine(t, "redis://"+srv.Addr, false, doc)
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	e := joinEnvoys(t, ctx, c, "s", 1)[0]
	e.send(usage(0, 500, time.Second, "tenant", "s"))
	srv.Kill()
	const window = 2 * time.Second
	for range 2 {
		start := nextWindow(window, 0)
		deadline := start.Add(time.Second)
		for !e.last().at.After(start) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		last := e.last()
		if !last.at.After(start) {
			t.Fatalf("no action pushed within 1s of a window's start with Redis down (the last came %s before it)", start.Sub(last.at).Round(time.Millisecond))
		}
		// The bucket's part of the window: 1000 / (2 instances × 1 bucket).
		if g := grantOf(last.action); g != 500 {
			t.Errorf("local grant pushed at the window's start: %d units, want 500 (%v)", g, last.action)
		}
	}
}
