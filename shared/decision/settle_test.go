package decision_test

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestSettleHTTP: the tenant scenario over POST /v1/check on real Redis: a check, a
// charge of 900 of 1000, then a settlement of 200 answered 200 with remaining 0 and
// a reset; the next check is denied; the metric counts the settled units.
// Reserve-then-settle over HTTP, and the answers that name the field.
func TestSettleHTTP(t *testing.T) {
	svc := newService(t, "")
	const key = `"attributes":{"api_key":"tenant-1","path":"/both"}`
	body := func(extra string) string { return `{"domain":"test",` + key + extra + `}` }
	// per-key is 5/min and global 2/min on /both: use cost 1 on the global limit.
	if a := post(t, svc.url, "/v1/check", body(`,"cost":1`)); a.status != http.StatusOK {
		t.Fatalf("check = %d %s", a.status, a.raw)
	}
	a := post(t, svc.url, "/v1/check", body(`,"cost":3,"settle":true`))
	if a.status != http.StatusOK || !a.body.Allowed || a.body.Remaining != 0 || a.body.ResetAfterMs == 0 {
		t.Fatalf("settle 3 on 1 remaining = %d %s, want 200 with remaining 0 and a reset", a.status, a.raw)
	}
	if got := a.header.Get("X-RateLimit-Remaining"); got != "0" {
		t.Fatalf("settle: X-RateLimit-Remaining %q, want 0", got)
	}
	if a := post(t, svc.url, "/v1/check", body(`,"cost":1`)); a.status != http.StatusTooManyRequests {
		t.Fatalf("check after the debt = %d %s, want 429", a.status, a.raw)
	}
	// reserve then settle, on the token_bucket path (2/s)
	tb := func(extra string) string {
		return `{"domain":"test","attributes":{"api_key":"tenant-2","path":"/token_bucket"}` + extra + `}`
	}
	if a := post(t, svc.url, "/v1/check", tb(`,"cost":2,"reserve_id":"req-1","reserve_ttl_ms":60000`)); a.status != http.StatusOK || a.body.Remaining != 0 {
		t.Fatalf("reserve 2 = %d %s, want 200 remaining 0", a.status, a.raw)
	}
	if a := post(t, svc.url, "/v1/check", tb(`,"cost":1,"settle":true,"reserve_id":"req-1"`)); a.status != http.StatusOK || a.body.Remaining != 1 {
		t.Fatalf("settle 1 of a reserved 2 = %d %s, want 200 remaining 1 (one unit given back)", a.status, a.raw)
	}
	if a := post(t, svc.url, "/v1/check", tb(`,"cost":1,"settle":true,"reserve_id":"req-1"`)); a.status != http.StatusNotFound || !strings.Contains(a.raw, `"field":"reserve_id"`) {
		t.Fatalf("second settle = %d %s, want 404 naming reserve_id", a.status, a.raw)
	}
	for _, tc := range []struct{ body, field string }{
		{tb(`,"settle":true`), "cost"},
		{tb(`,"reserve_id":""`), "reserve_id"},
		{tb(`,"reserve_ttl_ms":5`), "reserve_ttl_ms"},
		{tb(`,"reserve_id":"x","reserve_ttl_ms":0`), "reserve_ttl_ms"},
		{tb(`,"cost":1,"settle":true,"reserve_id":"x","reserve_ttl_ms":5`), "reserve_ttl_ms"},
		{tb(`,"settle":1`), "settle"},
	} {
		if a := post(t, svc.url, "/v1/check", tc.body); a.status != http.StatusBadRequest || !strings.Contains(a.raw, `"field":"`+tc.field+`"`) {
			t.Errorf("POST %s = %d %s, want 400 naming %s", tc.body, a.status, a.raw, tc.field)
		}
	}
	if a := post(t, svc.url, "/v1/check", `{"domain":"test","attributes":{"api_key":"k","path":"/sliding_log"},"cost":3,"settle":true}`); a.status != http.StatusBadRequest || !strings.Contains(a.raw, "sliding_window") {
		t.Fatalf("settle on sliding_log = %d %s, want 400 naming the fix", a.status, a.raw)
	}
	resp, err := http.Get(svc.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	m, _ := io.ReadAll(resp.Body)
	if !strings.Contains(string(m), `tollgate_settled_units_total{domain="test"} 3`) {
		t.Fatalf("metrics lack tollgate_settled_units_total 3:\n%s", m)
	}
}
