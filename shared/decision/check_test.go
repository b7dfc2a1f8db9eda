package decision_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/shared/decision"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// manyAttributes returns a body with n attributes.
func manyAttributes(n int) string {
	var b strings.Builder
	b.WriteString(`{"domain":"test","attributes":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"a%02d":"v"`, i)
	}
	b.WriteString("}}")
	return b.String()
}

// parseCases are bodies of /v1/check and what ParseCheckRequest makes of them: a
// request, or an error naming field (empty for the body as a whole) and containing
// err. They also seed FuzzCheckBody.
var parseCases = []struct {
	body       string
	want       engine.Request
	field, err string
}{
	{body: `{"domain":"test","attributes":{"api_key":"k1","path":"/gcra"},"cost":1}`,
		want: engine.Request{Domain: "test", Attributes: map[string]string{"api_key": "k1", "path": "/gcra"}, Cost: 1}},
	{body: ` { "cost" : 0 , "attributes" : { } , "domain" : "test" } ` + "\n\t\r",
		want: engine.Request{Domain: "test", Attributes: map[string]string{}, Cost: 0}},
	{body: `{"domain":"te\u0073t","attributes":{"k":"a\"b","path_with_query":"/search?q=a&page=2"}}`,
		want: engine.Request{Domain: "test", Attributes: map[string]string{"k": `a"b`, "path_with_query": "/search?q=a&page=2"}, Cost: 1}},
	{body: `{"domain":"t\u00e9st","attributes":{"k":"日本\u2028<&>"}}`,
		want: engine.Request{Domain: "tést", Attributes: map[string]string{"k": "日本\u2028<&>"}, Cost: 1}},
	{body: `{"domain":"test","attributes":{"a":null},"cost":null}`,
		want: engine.Request{Domain: "test", Attributes: map[string]string{"a": ""}, Cost: 1}},
	{body: `{"domain":"test","cost":-0}`, want: engine.Request{Domain: "test", Cost: 0}},
	{body: fmt.Sprintf(`{"domain":"test","cost":%d}`, bounds.MaxCost), want: engine.Request{Domain: "test", Cost: bounds.MaxCost}},

	// Each name once, in the body and in attributes: the last of two used to win,
	// so "cost":1,"cost":100000 charged 100,000.
	{body: `{"domain":"d","domain":"e"}`, field: "domain", err: "domain is given twice"},
	{body: `{"domain":"test","cost":1,"cost":100000}`, field: "cost", err: "cost is given twice"},
	{body: `{"domain":"test","attributes":{"a":"1","a":"2"}}`, field: "attributes.a", err: "given twice"},
	{body: `{"domain":"a","attributes":{"x":"1"},"attributes":{"y":"2"}}`, field: "attributes", err: "given twice"},
	// Names match exactly: "DOMAIN" used to be taken for "domain".
	{body: `{"DOMAIN":"test"}`, field: "DOMAIN", err: `unknown field "DOMAIN"; known fields: domain, attributes, cost, settle, reserve_id, reserve_ttl_ms`},
	{body: `{"Domain":"test","COST":2}`, field: "Domain", err: `unknown field "Domain"`},
	{body: `{"domain":"test","colour":1}`, field: "colour", err: `unknown field "colour"`},
	{body: `{"domain":"test","a/b~c":1}`, field: "a/b~c", err: `unknown field "a/b~c"`},

	{body: "{\"domain\":\"test\",\"attributes\":{\"api_key\":\"\xff\xfe\"}}", err: "not valid UTF-8"},
	{body: "\xff", err: "not valid UTF-8"},
	// Nothing after the object: a stray } or ] after it used to be ignored.
	{body: `{"domain":"test"} }`, err: "more than one JSON value"},
	{body: `{"domain":"test"}]`, err: "more than one JSON value"},
	{body: `{"domain":"test"} {}`, err: "more than one JSON value"},
	{body: `{"domain":"test"} x`, err: "more than one JSON value"},
	{body: "{\"domain\":\"test\"}\x00", err: "more than one JSON value"},
	{body: `{"domain":"test"}` + strings.Repeat(" ", 10), want: engine.Request{Domain: "test", Cost: 1}},

	{body: `{"domain":"test"`, err: "malformed JSON at byte"},
	{body: `{"domain":"test",}`, err: "malformed JSON at byte"},
	{body: `{"domain" "test"}`, err: "malformed JSON at byte"},
	{body: `{"domain":"te` + "\n" + `st"}`, err: "malformed JSON at byte"},
	{body: `{"domain":"test","cost":01}`, err: "malformed JSON at byte"},
	{body: `{"domain":"test","cost":+1}`, err: "malformed JSON at byte"},
	{body: "\ufeff{\"domain\":\"test\"}", err: "malformed JSON at byte"},
	{body: `{`, err: "malformed JSON at byte"},
	{body: ``, err: "empty body"},
	{body: " \n", err: "empty body"},

	{body: `[1,2]`, err: "the body must be a JSON object, not a JSON array"},
	{body: `"domain"`, err: "the body must be a JSON object, not a JSON string"},
	{body: `null`, field: "domain", err: "domain is required"},
	{body: `{}`, field: "domain", err: "domain is required"},
	{body: `{"domain":""}`, field: "domain", err: "domain is required"},
	{body: `{"domain":5}`, field: "domain", err: "domain must be a string, not a JSON number"},
	{body: `{"domain":"test","attributes":{"a":5}}`, field: "attributes.a", err: "attributes.a must be a string, not a JSON number"},
	{body: `{"domain":"test","attributes":{"a/b":true}}`, field: "attributes.a/b", err: "must be a string, not a JSON boolean"},
	{body: `{"domain":"test","attributes":["a"]}`, field: "attributes", err: "attributes must be an object of strings, not a JSON array"},
	{body: `{"domain":"test","cost":1e99}`, field: "cost", err: "cost must be a whole number, not a JSON number 1e99"},
	{body: `{"domain":"test","cost":1.0}`, field: "cost", err: "cost must be a whole number"},
	{body: `{"domain":"test","cost":"1"}`, field: "cost", err: "cost must be a whole number, not a JSON string"},
	{body: `{"domain":"test","cost":9999999999999999999}`, field: "cost", err: "cost must be a whole number"},
	{body: `{"domain":"test","attributes":{"a":"` + strings.Repeat("x", bounds.MaxBody) + `"}}`, err: "body is larger than 16384 bytes"},
}

// boundsCases are bodies that parse but pass the bounds of package bounds, which the
// engine checks for every front door: /v1/check answers 400 naming the field.
var boundsCases = []struct{ body, field, err string }{
	{`{"domain":"test","cost":-1}`, "cost", "cost must be from 0 to 1048576"},
	{fmt.Sprintf(`{"domain":"test","cost":%d}`, bounds.MaxCost+1), "cost", "cost must be from 0 to"},
	{manyAttributes(bounds.MaxAttributes + 1), "attributes", "65 attributes; at most 64"},
	{`{"domain":"test","attributes":{"api_key":"` + strings.Repeat("x", 1025) + `"}}`, "attributes.api_key", "value longer than 1024 bytes"},
}

func TestCheckBounds(t *testing.T) {
	t.Parallel()
	h := inProcessHandler(t)
	for _, tc := range boundsCases {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(tc.body)))
		var er decision.ErrorResponse
		if err := json.Unmarshal(rec.Body.Bytes(), &er); err != nil || rec.Code != http.StatusBadRequest || er.Field != tc.field || !strings.Contains(er.Error, tc.err) {
			t.Errorf("POST %.80q = %d %s; want 400 with an error on field %q containing %q", tc.body, rec.Code, rec.Body, tc.field, tc.err)
		}
	}
}

func TestParseCheckRequest(t *testing.T) {
	t.Parallel()
	for _, tc := range parseCases {
		req, perr := decision.ParseCheckRequest([]byte(tc.body))
		if tc.err == "" {
			if perr != nil || !reflect.DeepEqual(req, tc.want) {
				t.Errorf("ParseCheckRequest(%.80q) = %+v, %+v; want %+v, nil", tc.body, req, perr, tc.want)
			}
			continue
		}
		if perr == nil || perr.Field != tc.field || !strings.Contains(perr.Error, tc.err) {
			t.Errorf("ParseCheckRequest(%.80q) = %+v, %+v; want an error on field %q containing %q", tc.body, req, perr, tc.field, tc.err)
		}
	}
	many := manyAttributes(bounds.MaxAttributes)
	if req, perr := decision.ParseCheckRequest([]byte(many)); perr != nil || len(req.Attributes) != bounds.MaxAttributes {
		t.Errorf("ParseCheckRequest(%d attributes) = %d attributes, %+v; want them all", bounds.MaxAttributes, len(req.Attributes), perr)
	}
}

// inProcessHandler returns the handler on an in-process engine for testPolicy whose
// clock starts at a fixed time and advances 70ms per reading.
func inProcessHandler(t testing.TB) http.Handler {
	t.Helper()
	p, err := policy.Parse([]byte(testPolicy))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_700_000_000, 0)
	clock := func() time.Time {
		now = now.Add(70 * time.Millisecond)
		return now
	}
	eng, err := engine.New(engine.Config{Policy: p, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return decision.NewHandler(eng, decision.Options{Logger: slog.New(slog.DiscardHandler)})
}

// TestCheckAnswerBytes pins /v1/check's answers byte for byte — status, headers and
// body — as encoding/json wrote them before the JSON library changed: field order,
// omitted fields, <, > and & escaped.
func TestCheckAnswerBytes(t *testing.T) {
	t.Parallel()
	h := inProcessHandler(t)
	steps := []struct {
		body   string
		status int
		header http.Header
		answer string
	}{
		{`{"domain":"test","attributes":{"api_key":"k<&>","path":"/gcra"}}`, http.StatusOK,
			http.Header{"Ratelimit": {`"gc";r=1;t=1`}, "Ratelimit-Policy": {`"gc";q=2;w=1`}, "X-Ratelimit-Limit": {"2"}, "X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1"}},
			`{"allowed":true,"domain":"test","rule":"gc","limit":2,"remaining":1,"reset_after_ms":500,"retry_after_ms":0,"delay_ms":0,"degraded":false,"limits":[{"rule":"gc","algorithm":"gcra","allowed":true,"shadow":false,"limit":2,"window_ms":1000,"remaining":1,"reset_after_ms":500,"retry_after_ms":0,"delay_ms":0}]}`},
		{`{"domain":"test","attributes":{"api_key":"k<&>","path":"/gcra"},"cost":2}`, http.StatusTooManyRequests,
			http.Header{"Ratelimit": {`"gc";r=1;t=1`}, "Ratelimit-Policy": {`"gc";q=2;w=1`}, "Retry-After": {"1"}, "X-Ratelimit-Limit": {"2"}, "X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1"}},
			`{"allowed":false,"domain":"test","rule":"gc","reason":"over_limit","limit":2,"remaining":1,"reset_after_ms":360,"retry_after_ms":360,"delay_ms":0,"degraded":false,"limits":[{"rule":"gc","algorithm":"gcra","allowed":false,"shadow":false,"limit":2,"window_ms":1000,"remaining":1,"reset_after_ms":360,"retry_after_ms":360,"delay_ms":0}]}`},
		{`{"domain":"test","attributes":{"api_key":"k1","path":"/leaky_bucket"}}`, http.StatusOK,
			http.Header{"Ratelimit": {`"lb";r=1;t=1`}, "Ratelimit-Policy": {`"lb";q=2;w=1`}, "X-Ratelimit-Limit": {"2"}, "X-Ratelimit-Remaining": {"1"}, "X-Ratelimit-Reset": {"1"}},
			`{"allowed":true,"domain":"test","rule":"lb","limit":2,"remaining":1,"reset_after_ms":500,"retry_after_ms":0,"delay_ms":0,"degraded":false,"limits":[{"rule":"lb","algorithm":"leaky_bucket","allowed":true,"shadow":false,"limit":2,"window_ms":1000,"remaining":1,"reset_after_ms":500,"retry_after_ms":0,"delay_ms":0}]}`},
		{`{"domain":"test","attributes":{"api_key":"k1","path":"/leaky_bucket"}}`, http.StatusOK,
			http.Header{decision.DelayHeader: {"360"}},
			`{"allowed":true,"domain":"test","rule":"lb","limit":2,"remaining":0,"reset_after_ms":860,"retry_after_ms":0,"delay_ms":360,"degraded":false,"limits":[{"rule":"lb","algorithm":"leaky_bucket","allowed":true,"shadow":false,"limit":2,"window_ms":1000,"remaining":0,"reset_after_ms":860,"retry_after_ms":0,"delay_ms":360}]}`},
		{`{"domain":"test","attributes":{"api_key":"k1","path":"/nowhere"}}`, http.StatusOK,
			http.Header{},
			`{"allowed":true,"domain":"test","limit":0,"remaining":0,"reset_after_ms":0,"retry_after_ms":0,"delay_ms":0,"degraded":false,"limits":[],"note":"no rule of the policy matches this request, so nothing limits it"}`},
		{`{"domain":"nope<&>"}`, http.StatusBadRequest, http.Header{},
			`{"error":"bad request: unknown domain \"nope\u003c\u0026\u003e\": this service decides domain \"test\"","field":"domain"}`},
		{`{"domain":"test","colour":1}`, http.StatusBadRequest, http.Header{},
			`{"error":"unknown field \"colour\"; known fields: domain, attributes, cost, settle, reserve_id, reserve_ttl_ms","field":"colour"}`},
	}
	for i, s := range steps {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", strings.NewReader(s.body)))
		if rec.Code != s.status {
			t.Fatalf("step %d: POST %s = %d %s, want %d", i, s.body, rec.Code, rec.Body, s.status)
		}
		if got := rec.Header().Get("Content-Type"); got != "application/json" {
			t.Errorf("step %d: Content-Type = %q, want application/json", i, got)
		}
		for k, v := range s.header {
			if got := rec.Header()[k]; !reflect.DeepEqual(got, v) {
				t.Errorf("step %d: header %s = %q, want %q", i, k, got, v)
			}
		}
		if rec.Body.String() != s.answer+"\n" {
			t.Errorf("step %d: POST %s answered\n%s\nwant\n%s", i, s.body, rec.Body, s.answer)
		}
	}
}

func TestCheckReadError(t *testing.T) {
	t.Parallel()
	h := inProcessHandler(t)
	body := io.MultiReader(strings.NewReader(`{"domain":`), iotest.ErrReader(errors.New("connection reset")))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", body))
	if want := `{"error":"reading body: connection reset"}` + "\n"; rec.Code != http.StatusBadRequest || rec.Body.String() != want {
		t.Errorf("POST with a failing body = %d %q, want 400 %q", rec.Code, rec.Body, want)
	}
}
