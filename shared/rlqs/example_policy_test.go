package rlqs_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/tollgate-dev/tollgate/shared/redistest"
	"github.com/tollgate-dev/tollgate/shared/rlqs"
)

// TestExamplePolicy serves deploy/examples/rlqs/policy.yaml (the policy beside the
// Envoy configuration that deploy/rlqs_test.go checks) on a real Redis: a tenant's
// bucket, as the example's filter builds it, gets a grant.
func TestExamplePolicy(t *testing.T) {
	doc, err := os.ReadFile("../../deploy/examples/rlqs/policy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	eng := newEngine(t, "redis://"+redistest.StartServer(t).Addr, false, string(doc))
	if r := eng.Policy().Rules[0]; r.RLQS == nil {
		t.Fatalf("rule %s has no rlqs block", r.Name)
	}
	c, _ := serve(t, eng, rlqs.Limits{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	e := openEnvoy(t, ctx, c)
	e.send(usage(0, 1, 0, "tenant", "anonymous"))
	e.waitFor(1)
	if g := grantOf(e.last().action); g < 1 {
		t.Errorf("grant = %d, want at least 1", g)
	}
}
