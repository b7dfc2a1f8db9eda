package decision_test

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
	"github.com/tollgate-dev/tollgate/shared/redisstore"
	"github.com/tollgate-dev/tollgate/shared/redistest"
)

// testPolicy has one rule per algorithm, each 2 per second on its own path, a shadow
// rule, and two rules for the all-or-nothing test.
const testPolicy = `
domain: test
failure: {mode: closed, timeout: 2s}
shard_by: api_key
rules:
  - {name: fw, match: {api_key: "*", path: /fixed_window}, limits: [{algorithm: fixed_window, rate: 2/s, record: user}]}
  - {name: sl, match: {api_key: "*", path: /sliding_log}, limits: [{algorithm: sliding_log, rate: 2/s, record: user}]}
  - {name: sw, match: {api_key: "*", path: /sliding_window}, limits: [{algorithm: sliding_window, rate: 2/s}]}
  - {name: tb, match: {api_key: "*", path: /token_bucket}, limits: [{algorithm: token_bucket, rate: 2/s}]}
  - {name: lb, match: {api_key: "*", path: /leaky_bucket}, limits: [{algorithm: leaky_bucket, rate: 2/s}]}
  - {name: gc, match: {api_key: "*", path: /gcra}, limits: [{algorithm: gcra, rate: 2/s}]}
  - {name: br, match: {api_key: "*", path: /bucket_ring}, limits: [{algorithm: bucket_ring, rate: 2/s}, {algorithm: bucket_ring, rate: 3/2s}]}
  - {name: watch, match: {api_key: "*", path: /shadowed}, shadow: true, limits: [{algorithm: fixed_window, rate: 1/min}]}
  - {name: per-key, match: {api_key: "*", path: /both}, limits: [{algorithm: fixed_window, rate: 5/min}]}
  - {name: global, match: {path: /both}, limits: [{algorithm: fixed_window, rate: 2/min}]}
`

type service struct {
	url string
	srv *redistest.Server
}

func newService(t *testing.T, adminToken string) service {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.StartServer(t)
	store, err := redisstore.Open(redisstore.Config{URL: srv.URL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	reg := prometheus.NewRegistry()
	m := decision.NewMetrics(reg)
	eng, err := engine.New(engine.Config{Policy: p, Store: store, Hooks: m.Hooks()})
	if err != nil {
		t.Fatal(err)
	}
	h := decision.NewHandler(eng, decision.Options{AdminToken: adminToken, Admin: store, Registry: reg})
	hs := httptest.NewServer(h)
	t.Cleanup(hs.Close)
	return service{url: hs.URL, srv: srv}
}

type answer struct {
	status int
	header http.Header
	body   decision.CheckResponse
	raw    string
}

func post(t *testing.T, url, path, body string, header ...string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header, raw: string(raw)}
	json.Unmarshal(raw, &a.body)
	return a
}

func check(t *testing.T, url, key, path string) answer {
	t.Helper()
	return post(t, url, "/v1/check", fmt.Sprintf(`{"domain":"test","attributes":{"api_key":%q,"path":%q,"user":"u-%s"}}`, key, path, key))
}

func TestEveryAlgorithmOverHTTP(t *testing.T) {
	s := newService(t, "")
	for _, algo := range []string{"fixed_window", "sliding_log", "sliding_window", "token_bucket", "leaky_bucket", "gcra", "bucket_ring"} {
		t.Run(algo, func(t *testing.T) {
			t.Parallel()
			path := "/" + algo
			var last answer
			allowed := 0
			for range 10 {
				last = check(t, s.url, "k-"+algo, path)
				if last.status != http.StatusOK {
					break
				}
				allowed++
				for _, h := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"} {
					if last.header.Get(h) == "" {
						t.Errorf("allowed answer lacks %s: %v", h, last.header)
					}
				}
				if last.header.Get("Retry-After") != "" {
					t.Errorf("allowed answer has Retry-After %q", last.header.Get("Retry-After"))
				}
			}
			if last.status != http.StatusTooManyRequests {
				t.Fatalf("status after %d allowed = %d, want 429; body %s", allowed, last.status, last.raw)
			}
			if allowed != 2 {
				t.Errorf("allowed %d before the first 429, want 2 (2/s)", allowed)
			}
			if last.body.Allowed || last.body.Reason != engine.ReasonOverLimit || last.body.RetryAfterMs <= 0 || last.body.Limit != 2 || len(last.body.Limits) == 0 {
				t.Errorf("429 body = %+v, want a denial with retry_after_ms > 0 and limit 2", last.body)
			}
			ra, err := strconv.Atoi(last.header.Get("Retry-After"))
			if err != nil || ra < 1 {
				t.Fatalf("Retry-After = %q, want whole seconds >= 1", last.header.Get("Retry-After"))
			}
			// Every limit of the rule is listed (bucket_ring's two windows as br.1 and
			// br.2); the 2/s one states q=2 over 1s and has none left.
			quota := last.body.Rule
			if algo == "bucket_ring" {
				quota += ".1"
			}
			if want := fmt.Sprintf(`%q;q=2;w=1`, quota); !slices.Contains(strings.Split(last.header.Get("RateLimit-Policy"), ", "), want) {
				t.Errorf("RateLimit-Policy = %q, want an item %q", last.header.Get("RateLimit-Policy"), want)
			}
			if !strings.Contains(last.header.Get("RateLimit"), fmt.Sprintf(`%q;r=0;t=`, quota)) {
				t.Errorf("RateLimit = %q, want %s with r=0", last.header.Get("RateLimit"), quota)
			}
			// Waiting Retry-After, the same request succeeds.
			time.Sleep(time.Duration(ra) * time.Second)
			if a := check(t, s.url, "k-"+algo, path); a.status != http.StatusOK {
				t.Errorf("after waiting Retry-After %ds: status %d, want 200; body %s", ra, a.status, a.raw)
			}
		})
	}
}

func TestLeakyBucketDelayIsReported(t *testing.T) {
	s := newService(t, "")
	check(t, s.url, "shaped", "/leaky_bucket")
	a := check(t, s.url, "shaped", "/leaky_bucket")
	if a.status != http.StatusOK {
		t.Fatalf("second shaped request status %d, want 200", a.status)
	}
	if a.body.DelayMs <= 0 || a.header.Get(decision.DelayHeader) == "" {
		t.Errorf("second shaped request: delay_ms %d, %s %q; want a delay of about 500ms in both", a.body.DelayMs, decision.DelayHeader, a.header.Get(decision.DelayHeader))
	}
}

func TestShadowRuleNeverDenies(t *testing.T) {
	s := newService(t, "")
	for i := range 3 {
		a := check(t, s.url, "watched", "/shadowed")
		if a.status != http.StatusOK {
			t.Fatalf("request %d on a shadow rule: status %d, want 200", i, a.status)
		}
		if len(a.body.Limits) != 1 || !a.body.Limits[0].Shadow {
			t.Fatalf("request %d: limits %+v, want the shadow limit reported", i, a.body.Limits)
		}
		if want := i == 0; a.body.Limits[0].Allowed != want {
			t.Errorf("request %d: shadow limit allowed = %v, want %v", i, a.body.Limits[0].Allowed, want)
		}
	}
}

func TestAllOrNothingAcrossRules(t *testing.T) {
	s := newService(t, "")
	// per-key allows 5/min, global 2/min: the third request passes per-key but global
	// denies it, so per-key must not be charged for it.
	for i := range 3 {
		a := check(t, s.url, "k1", "/both")
		if want := i < 2; (a.status == http.StatusOK) != want {
			t.Fatalf("request %d: status %d, want allowed=%v", i, a.status, want)
		}
		if i == 2 && a.body.Rule != "global" {
			t.Errorf("denying rule = %q, want global", a.body.Rule)
		}
	}
	// A cost-0 peek reads every limit from Redis (the deny cache answers only
	// requests that would be charged).
	a := post(t, s.url, "/v1/check", `{"domain":"test","attributes":{"api_key":"k1","path":"/both"},"cost":0}`)
	found := false
	for _, l := range a.body.Limits {
		if l.Rule == "per-key" {
			found = true
			if l.Remaining != 3 {
				t.Errorf("per-key remaining = %d after 2 admitted requests and 1 denied, want 3 (a denied request charges nothing)", l.Remaining)
			}
		}
	}
	if !found {
		t.Errorf("peek answered %s, want the per-key limit in it", a.raw)
	}
}

func TestBadInput(t *testing.T) {
	s := newService(t, "")
	many := map[string]string{}
	for i := range 65 {
		many[fmt.Sprint("a", i)] = "v"
	}
	manyJSON, _ := json.Marshal(map[string]any{"domain": "test", "attributes": many})
	tests := []struct {
		name, body, want string
		status           int // 0: 400
	}{
		{"malformed JSON", `{"domain": "test", `, "malformed JSON", 0},
		{"not an object", `[1,2]`, "must be", 0},
		{"empty", ``, "empty body", 0},
		{"unknown domain", `{"domain":"nope","attributes":{}}`, "unknown domain", 0},
		{"missing domain", `{"attributes":{}}`, "domain is required", 0},
		{"unknown field", `{"domain":"test","attributes":{},"colour":1}`, `unknown field "colour"`, 0},
		{"attribute not a string", `{"domain":"test","attributes":{"api_key":5}}`, "must be", 0},
		{"negative cost", `{"domain":"test","attributes":{},"cost":-1}`, "cost must be", 0},
		{"too many attributes", string(manyJSON), "at most 64", 0},
		{"value over 1 KiB", `{"domain":"test","attributes":{"api_key":"` + strings.Repeat("x", 1025) + `"}}`, "longer than 1024", 0},
		{"body over 16 KiB", `{"domain":"test","attributes":{"a":"` + strings.Repeat("x", 17<<10) + `"}}`, "larger than", http.StatusRequestEntityTooLarge},
		{"not UTF-8", "{\"domain\":\"test\",\"attributes\":{\"api_key\":\"\xff\xfe\"}}", "UTF-8", 0},
		{"two values", `{"domain":"test","attributes":{}} {}`, "more than one", 0},
		{"data after the object", `{"domain":"test","attributes":{}} }`, "more than one", 0},
		{"domain twice", `{"domain":"d","domain":"e"}`, "domain is given twice", 0},
		{"cost twice", `{"domain":"test","attributes":{},"cost":1,"cost":100000}`, "cost is given twice", 0},
		{"attribute twice", `{"domain":"test","attributes":{"api_key":"a","api_key":"b"}}`, "attributes.api_key is given twice", 0},
		{"name in another case", `{"DOMAIN":"test","attributes":{}}`, `unknown field "DOMAIN"`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := post(t, s.url, "/v1/check", tc.body)
			want := cmp.Or(tc.status, http.StatusBadRequest)
			if a.status != want {
				t.Fatalf("POST %.60q = %d, want %d; body %s", tc.body, a.status, want, a.raw)
			}
			var e decision.ErrorResponse
			if err := json.Unmarshal([]byte(a.raw), &e); err != nil || !strings.Contains(e.Error, tc.want) {
				t.Errorf("POST %.60q error = %q, want it to mention %q", tc.body, e.Error, tc.want)
			}
		})
	}
}

func TestAdminAndHealth(t *testing.T) {
	s := newService(t, "s3cret")
	check(t, s.url, "kA", "/sliding_log")
	body := `{"domain":"test","attributes":{"api_key":"kA","path":"/sliding_log","user":"u-kA"}}`
	if a := post(t, s.url, "/v1/state", body); a.status != http.StatusUnauthorized {
		t.Errorf("state without a token = %d, want 401", a.status)
	}
	if a := post(t, s.url, "/v1/state", body, "Authorization", "Bearer wrong"); a.status != http.StatusUnauthorized {
		t.Errorf("state with a wrong token = %d, want 401", a.status)
	}
	a := post(t, s.url, "/v1/state", body, "Authorization", "Bearer s3cret")
	var st decision.StateResponse
	if err := json.Unmarshal([]byte(a.raw), &st); err != nil || a.status != http.StatusOK {
		t.Fatalf("state = %d %s", a.status, a.raw)
	}
	if len(st.Limits) != 1 || st.Limits[0].Records["u-kA"] != 1 {
		t.Errorf("state records = %+v, want u-kA: 1", st.Limits)
	}
	if st.Check.Remaining != 1 {
		t.Errorf("state remaining = %d, want 1 (peeking charges nothing)", st.Check.Remaining)
	}
	if a := post(t, s.url, "/v1/reset", body, "Authorization", "Bearer s3cret"); a.status != http.StatusOK {
		t.Fatalf("reset = %d %s", a.status, a.raw)
	}
	for i := range 2 {
		if a := check(t, s.url, "kA", "/sliding_log"); a.status != http.StatusOK {
			t.Errorf("request %d after reset = %d, want 200", i, a.status)
		}
	}
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "tollgate_decisions_total"} {
		resp, err := http.Get(s.url + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !bytes.Contains(b, []byte(want)) {
			t.Errorf("GET %s = %d %.200s, want 200 containing %q", path, resp.StatusCode, b, want)
		}
	}
	s.srv.Kill()
	resp, err := http.Get(s.url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("GET /readyz with Redis down = %d, want 503", resp.StatusCode)
	}
	if a := check(t, s.url, "kB", "/gcra"); a.status != http.StatusServiceUnavailable || !a.body.Degraded {
		t.Errorf("check with Redis down in closed mode = %d %s, want 503 degraded", a.status, a.raw)
	}
}

// FuzzCheckBody sends arbitrary bodies to /v1/check on the in-process store: the answer
// is 200, 429 or 400, never a 500 or a panic, and always JSON. A body the service
// decides on is one that encoding/json decodes too, to the same request: the strict
// parser only ever refuses more.
func FuzzCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"domain":"test","attributes":{"api_key":"k1","path":"/gcra"},"cost":1}`,
		`{"domain":"test","attributes":{"api_key":"{x}:y\n","path":"/both"}}`,
		`{"domain":"nope"}`, `{"cost":1e99}`, `[]`, `null`, "\xff", `{"domain":"test","attributes":{"a":null}}`,
		`{"domain":"test","attributes":{"api_key":"k1"},"cost":200,"settle":true}`,
		`{"domain":"test","attributes":{"api_key":"k1"},"cost":20,"reserve_id":"r1","reserve_ttl_ms":1000}`,
		`{"domain":"test","attributes":{"api_key":"k1"},"cost":5,"settle":true,"reserve_id":"r1"}`,
		`{"domain":"test","settle":"yes"}`, `{"domain":"test","reserve_id":""}`, `{"domain":"test","reserve_ttl_ms":5}`,
	} {
		f.Add([]byte(s))
	}
	for _, tc := range parseCases {
		f.Add([]byte(tc.body))
	}
	for _, tc := range boundsCases {
		f.Add([]byte(tc.body))
	}
	p, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		f.Fatal(err)
	}
	eng, err := engine.New(engine.Config{Policy: p})
	if err != nil {
		f.Fatal(err)
	}
	h := decision.NewHandler(eng, decision.Options{})
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusBadRequest, http.StatusRequestEntityTooLarge:
		case http.StatusNotFound: // a settlement of a reservation never made
			if !bytes.Contains(body, []byte("reserve_id")) {
				t.Fatalf("POST %.200q = 404 without a reserve_id", body)
			}
			return
		default:
			t.Fatalf("POST %.200q = %d %s, want 200, 429, 400, 404 or 413", body, rec.Code, rec.Body)
		}
		if !json.Valid(rec.Body.Bytes()) {
			t.Fatalf("POST %.200q answered invalid JSON %q", body, rec.Body)
		}
		if rec.Code == http.StatusBadRequest || rec.Code == http.StatusRequestEntityTooLarge {
			return
		}
		got, perr := decision.ParseCheckRequest(body)
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		var cr decision.CheckRequest
		if err := dec.Decode(&cr); err != nil || dec.More() || perr != nil {
			t.Fatalf("POST %q = %d, but encoding/json refuses it (%v) or ParseCheckRequest does (%+v)", body, rec.Code, err, perr)
		}
		want := engine.Request{Domain: cr.Domain, Attributes: cr.Attributes, Cost: 1, Settle: cr.Settle}
		if cr.Cost != nil {
			want.Cost = *cr.Cost
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ParseCheckRequest(%q) = %+v; encoding/json decodes %+v", body, got, want)
		}
	})
}
