package decision

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"reflect"
	"strconv"
	"testing"
	"testing/iotest"
	"time"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/engine"
	"github.com/tollgate-dev/tollgate/shared/policy"
)

// referencePolicy decides with every kind of answer: allowed, denied, delayed
// (leaky_bucket), shadowed, several limits, no rule matched.
const referencePolicy = `
domain: test
shard_by: api_key
rules:
  - {name: gc, match: {api_key: "*", path: /gcra}, limits: [{algorithm: gcra, rate: 2/s}]}
  - {name: lb, match: {api_key: "*", path: /leaky_bucket}, limits: [{algorithm: leaky_bucket, rate: 2/s}]}
  - {name: sl, match: {api_key: "*", path: /sliding_log}, limits: [{algorithm: sliding_log, rate: 2/s, record: user}]}
  - {name: br, match: {api_key: "*", path: /bucket_ring}, limits: [{algorithm: bucket_ring, rate: 2/s}, {algorithm: bucket_ring, rate: 3/2s}]}
  - {name: watch, match: {api_key: "*", path: /shadowed}, shadow: true, limits: [{algorithm: fixed_window, rate: 1/min}]}
  - {name: per-key, match: {api_key: "*", path: /both}, limits: [{algorithm: fixed_window, rate: 5/min}]}
  - {name: global, match: {path: /both}, limits: [{algorithm: fixed_window, rate: 2/min}]}
`

// newReferencePair returns two handlers on twin in-process engines whose clocks
// advance 70ms per reading: the same requests in the same order get the same
// verdicts from both.
func newReferencePair(tb testing.TB) (*handler, *handler) {
	tb.Helper()
	p, err := policy.Parse([]byte(referencePolicy))
	if err != nil {
		tb.Fatal(err)
	}
	pair := [2]*handler{}
	for i := range pair {
		now := time.Unix(1_700_000_000, 0)
		clock := func() time.Time {
			now = now.Add(70 * time.Millisecond)
			return now
		}
		eng, err := engine.New(engine.Config{Policy: p, Clock: clock, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			tb.Fatal(err)
		}
		pair[i] = &handler{eng: eng, log: slog.New(slog.DiscardHandler)}
	}
	return pair[0], pair[1]
}

// referenceCheck is /v1/check as it was written before its answer was encoded by
// hand: the behaviour check must keep.
func referenceCheck(h *handler, w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxBody+1))
	if err != nil {
		referenceWriteJSON(w, http.StatusBadRequest, ErrorResponse{Error: "reading body: " + err.Error()})
		return
	}
	req, perr := parseCheckRequest(body, false)
	if perr != nil {
		referenceWriteJSON(w, http.StatusBadRequest, perr)
		return
	}
	v, err := h.eng.Check(r.Context(), req)
	if err != nil {
		if errors.Is(err, engine.ErrBadRequest) {
			field := ""
			if errors.Is(err, engine.ErrUnknownDomain) {
				field = "domain"
			}
			referenceWriteJSON(w, http.StatusBadRequest, ErrorResponse{Error: err.Error(), Field: field})
			return
		}
		referenceWriteJSON(w, http.StatusInternalServerError, ErrorResponse{Error: "internal error"})
		return
	}
	status := http.StatusOK
	switch {
	case v.Reason == engine.ReasonUnavailable:
		status = http.StatusServiceUnavailable
	case !v.Allowed:
		status = http.StatusTooManyRequests
	}
	for _, kv := range v.Headers() {
		w.Header().Set(kv[0], kv[1])
	}
	if v.Delay > 0 {
		w.Header().Set(DelayHeader, strconv.FormatInt(ms(v.Delay), 10))
	}
	referenceWriteJSON(w, status, Response(req.Domain, v))
}

func referenceWriteJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}

// checkSame fails t unless h.check and referenceCheck on ref answer body alike:
// status, headers and body byte for byte. It returns check's answer.
func checkSame(t *testing.T, h, ref *handler, body []byte) *httptest.ResponseRecorder {
	t.Helper()
	got, want := httptest.NewRecorder(), httptest.NewRecorder()
	h.check(got, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", bytes.NewReader(body)))
	referenceCheck(ref, want, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", bytes.NewReader(body)))
	if got.Code != want.Code || !reflect.DeepEqual(got.Header(), want.Header()) || got.Body.String() != want.Body.String() {
		t.Fatalf("POST %q = %d %v %q, want %d %v %q", body, got.Code, got.Header(), got.Body, want.Code, want.Header(), want.Body)
	}
	return got
}

var referenceBodies = []string{
	`{"domain":"test","attributes":{"api_key":"k1","path":"/gcra"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/leaky_bucket"},"cost":1}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/leaky_bucket"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/sliding_log","user":"u<&>\u2028"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/bucket_ring"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/shadowed"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/both"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/both"},"cost":0}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/nowhere"}}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/gcra"},"cost":3}`,
	`{"domain":"test","attributes":{"api_key":"k1","path":"/gcra"},"cost":1048577}`,
	`{"domain":"nope","attributes":{}}`,
	`{"attributes":{}}`,
	`{"domain":"test","attributes":{},"colour":1}`,
	`{"domain":"test","attributes":{"api_key":5}}`,
	`{"domain":"test","cost":1e99}`,
	`{"domain":"test"} {}`,
	"{\"domain\":\"test\",\"attributes\":{\"api_key\":\"\xff\"}}",
	``,
	`[1]`,
}

func TestCheckMatchesReference(t *testing.T) {
	t.Parallel()
	h, ref := newReferencePair(t)
	seen := map[string]bool{}
	for range 4 { // again and again, to reach denials and reuse the pooled buffers
		for _, body := range referenceBodies {
			a := checkSame(t, h, ref, []byte(body))
			seen[strconv.Itoa(a.Code)] = true
			for k := range a.Header() {
				seen[k] = true
			}
		}
	}
	checkSame(t, h, ref, append([]byte(`{"domain":"test","attributes":{"api_key":"`), bytes.Repeat([]byte("x"), MaxBody)...))
	for _, want := range []string{"200", "429", "400", DelayHeader, "Retry-After", "Ratelimit-Policy"} {
		if !seen[want] {
			t.Errorf("the answers had no %s, want the bodies to reach one", want)
		}
	}
}

// FuzzCheckMatchesReference sends arbitrary bodies to check and to referenceCheck:
// the answers must be the same, byte for byte.
func FuzzCheckMatchesReference(f *testing.F) {
	for _, body := range referenceBodies {
		f.Add([]byte(body))
	}
	h, ref := newReferencePair(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		checkSame(t, h, ref, body)
	})
}

func TestCheckReadError(t *testing.T) {
	t.Parallel()
	h, ref := newReferencePair(t)
	body := func() io.Reader {
		return io.MultiReader(bytes.NewReader([]byte(`{"domain":`)), iotest.ErrReader(errors.New("connection reset")))
	}
	got, want := httptest.NewRecorder(), httptest.NewRecorder()
	h.check(got, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", body()))
	referenceCheck(ref, want, httptest.NewRequestWithContext(context.Background(), http.MethodPost, "/v1/check", body()))
	if got.Code != want.Code || got.Body.String() != want.Body.String() {
		t.Errorf("POST with a failing body = %d %q, want %d %q", got.Code, got.Body, want.Code, want.Body)
	}
}

func TestCanonicalKey(t *testing.T) {
	t.Parallel()
	names := []string{DelayHeader, "x-custom", "content-type", "RATELIMIT"}
	for _, kv := range algo.Headers("r", algo.Decision{Allowed: false, Limit: 1, Period: time.Second}) {
		names = append(names, kv[0])
	}
	if len(names) < 10 {
		t.Fatalf("algo.Headers of a denial named %d headers, want 6", len(names)-4)
	}
	for _, k := range names {
		if got, want := canonicalKey(k), textproto.CanonicalMIMEHeaderKey(k); got != want {
			t.Errorf("canonicalKey(%q) = %q, want %q", k, got, want)
		}
	}
	if got := textproto.CanonicalMIMEHeaderKey(DelayHeader); got != DelayHeader {
		t.Errorf("DelayHeader %q is not canonical (%q): setHeaders stores it as it is", DelayHeader, got)
	}
}

func TestSetHeaders(t *testing.T) {
	t.Parallel()
	denial := algo.Headers("r", algo.Decision{Allowed: false, Limit: 5, Period: time.Minute, RetryAfter: time.Second})
	tests := []struct {
		name  string
		kvs   [][2]string
		delay string
	}{
		{"none", nil, ""},
		{"denial", denial, ""},
		{"delay only", nil, "250"},
		{"allowed with delay", algo.Headers("r", algo.Decision{Allowed: true, Limit: 5, Period: time.Minute}), "17"},
		{"other names", [][2]string{{"x-custom", "1"}, {"Retry-After", "3"}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, want := http.Header{"Content-Type": {"text/plain"}, "Retry-After": {"old"}}, http.Header{"Content-Type": {"text/plain"}, "Retry-After": {"old"}}
			setHeaders(got, tc.kvs, tc.delay)
			for _, kv := range tc.kvs {
				want.Set(kv[0], kv[1])
			}
			if tc.delay != "" {
				want.Set(DelayHeader, tc.delay)
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("setHeaders(%v, %q) = %v, want %v", tc.kvs, tc.delay, got, want)
			}
			// Adding to one header must not overwrite another's value.
			for k := range got {
				got.Add(k, "added")
				want.Add(k, "added")
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("setHeaders(%v, %q), then Add to each = %v, want %v", tc.kvs, tc.delay, got, want)
			}
		})
	}
}
