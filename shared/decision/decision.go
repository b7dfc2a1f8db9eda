// Package decision is tollgate's HTTP decision protocol: POST /v1/check answers 200 or
// 429 with the RateLimit headers (and settles, reserves and settles reservations:
// see CheckRequest), plus admin (/v1/state, /v1/reset), health
// (/healthz, /readyz) and Prometheus metrics (/metrics). The same handler serves the
// Lambda Function URL and the plain local server.
package decision

import (
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/tollgate-dev/tollgate/shared/algo"
	"github.com/tollgate-dev/tollgate/shared/bounds"
	"github.com/tollgate-dev/tollgate/shared/breaker"
	"github.com/tollgate-dev/tollgate/shared/engine"
)

// DelayHeader carries a leaky-bucket shaping delay, in milliseconds.
const DelayHeader = "X-Tollgate-Delay-Ms"

// Admin is what the admin endpoints need from the store.
type Admin interface {
	// Records returns the recorded values of meter m at key, with their units.
	Records(ctx context.Context, key string, m algo.Meter) (map[string]int64, error)
	// Reset deletes the state of the meters at keys.
	Reset(ctx context.Context, keys []string, meters []algo.Meter) error
}

// Options configures the handler. The zero value serves /v1/check, /healthz and an
// always-ready /readyz, with no admin and no metrics.
type Options struct {
	// AdminToken enables /v1/state and /v1/reset for requests carrying
	// "Authorization: Bearer <AdminToken>". Empty disables them (404).
	AdminToken string
	// Admin serves the admin endpoints; required when AdminToken is set.
	Admin Admin
	// Ready is an extra readiness check, beside the engine's Health, which already
	// checks every node of the store through its breaker and loads the Lua library. Do not
	// pass a node store's Ping: both checks would go through the same breakers, and
	// the one that lost a breaker's single probe would report it open.
	Ready func(ctx context.Context) error
	// Registry serves /metrics when set.
	Registry *prometheus.Registry
	// Logger logs requests that fail on the server side (default slog.Default()).
	Logger *slog.Logger
}

type handler struct {
	eng  *engine.Engine
	opts Options
	log  *slog.Logger
}

// NewHandler returns the decision service's handler on eng.
func NewHandler(eng *engine.Engine, opts Options) http.Handler {
	h := &handler{eng: eng, opts: opts, log: opts.Logger}
	if h.log == nil {
		h.log = slog.Default()
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", h.check)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", h.ready)
	if opts.AdminToken != "" && opts.Admin != nil {
		mux.HandleFunc("POST /v1/state", h.admin(h.state))
		mux.HandleFunc("POST /v1/reset", h.admin(h.reset))
	}
	if opts.Registry != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{}))
	}
	return mux
}

// CheckRequest is the body of POST /v1/check.
type CheckRequest struct {
	Domain     string            `json:"domain"`
	Attributes map[string]string `json:"attributes"`
	// Cost defaults to 1 when absent; a settlement must state it.
	Cost *int64 `json:"cost,omitempty"`
	// Settle says the cost was spent already: it is charged, never refused, and may
	// leave the limits in debt (engine.Engine.Settle). With ReserveID it settles that
	// reservation with the actual cost.
	Settle bool `json:"settle,omitempty"`
	// ReserveID names a reservation: without Settle, the cost is an estimate,
	// decided as usual and kept under this id when admitted (engine.Engine.Reserve);
	// with Settle, the reservation to settle.
	ReserveID string `json:"reserve_id,omitempty"`
	// ReserveTTLMs is how long a reservation waits for its settlement, in
	// milliseconds (default 300000, at most 3600000); past it the estimate stands.
	ReserveTTLMs *int64 `json:"reserve_ttl_ms,omitempty"`
}

// A Check is a parsed /v1/check body: the request, and the reservation it makes or
// settles.
type Check struct {
	Request engine.Request
	// ReserveID is the reservation made (Request.Settle false) or settled; "" for
	// none.
	ReserveID string
	// ReserveTTL is how long a reservation is kept (0: the default).
	ReserveTTL time.Duration
}

// LimitJSON is one limit's decision in a response.
type LimitJSON struct {
	Rule         string `json:"rule"`
	Algorithm    string `json:"algorithm"`
	Allowed      bool   `json:"allowed"`
	Shadow       bool   `json:"shadow"`
	Limit        int64  `json:"limit"`
	WindowMs     int64  `json:"window_ms"`
	Remaining    int64  `json:"remaining"`
	ResetAfterMs int64  `json:"reset_after_ms"`
	RetryAfterMs int64  `json:"retry_after_ms"`
	DelayMs      int64  `json:"delay_ms"`
}

// CheckResponse is the body of a /v1/check answer.
type CheckResponse struct {
	Allowed      bool        `json:"allowed"`
	Domain       string      `json:"domain"`
	Rule         string      `json:"rule,omitempty"`
	Reason       string      `json:"reason,omitempty"`
	Limit        int64       `json:"limit"`
	Remaining    int64       `json:"remaining"`
	ResetAfterMs int64       `json:"reset_after_ms"`
	RetryAfterMs int64       `json:"retry_after_ms"`
	DelayMs      int64       `json:"delay_ms"`
	Degraded     bool        `json:"degraded"`
	Cached       bool        `json:"cached,omitempty"`
	Limits       []LimitJSON `json:"limits"`
	// Note says why an allowed answer has no limit: no rule of the policy matches
	// the request.
	Note string `json:"note,omitempty"`
}

// NoRuleNote is the Note of an answer to a request that no rule matches.
const NoRuleNote = "no rule of the policy matches this request, so nothing limits it"

// ErrorResponse is the body of a 4xx/5xx answer.
type ErrorResponse struct {
	Error string `json:"error"`
	Field string `json:"field,omitempty"`
}

// ms rounds a duration up to whole milliseconds.
func ms(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// ParseCheckRequest decodes a /v1/check body. Errors name the field. The engine
// checks the request's bounds (Engine.Plan).
//
// The body is decoded by github.com/go-json-experiment/json (encoding/json/v2),
// which is strict where encoding/json is lenient: names must match exactly
// ("Domain" is an unknown field), and a name given twice (in the body or in
// attributes), invalid UTF-8 or anything after the object is an error, as is an
// unknown field. Answers are written by encoding/json.
func ParseCheckRequest(body []byte) (engine.Request, *ErrorResponse) {
	c, perr := ParseCheck(body)
	return c.Request, perr
}

// ParseCheck decodes a /v1/check body as ParseCheckRequest does, with the
// reservation it makes or settles (reserve_id, reserve_ttl_ms).
func ParseCheck(body []byte) (Check, *ErrorResponse) {
	if len(body) > bounds.MaxBody {
		return Check{}, &ErrorResponse{Error: fmt.Sprintf("body is larger than %d bytes", bounds.MaxBody)}
	}
	if !utf8.Valid(body) {
		return Check{}, &ErrorResponse{Error: "body is not valid UTF-8"}
	}
	var cr CheckRequest
	if err := jsonv2.Unmarshal(body, &cr, jsonv2.RejectUnknownMembers(true)); err != nil {
		return Check{}, jsonError(body, err)
	}
	if cr.Domain == "" {
		return Check{}, &ErrorResponse{Error: `domain is required, e.g. {"domain": "public-api", "attributes": {...}}`, Field: "domain"}
	}
	r := engine.Request{Domain: cr.Domain, Attributes: cr.Attributes, Cost: 1, Settle: cr.Settle}
	if cr.Cost != nil {
		r.Cost = *cr.Cost
	}
	c := Check{Request: r, ReserveID: cr.ReserveID}
	switch {
	case cr.Settle && cr.Cost == nil:
		return Check{}, &ErrorResponse{Error: `cost is required with settle: send the units spent, e.g. {"settle": true, "cost": 200}`, Field: "cost"}
	case cr.ReserveID == "" && bytes.Contains(body, []byte(`"reserve_id"`)):
		return Check{}, &ErrorResponse{Error: "reserve_id is empty: send the id that names the reservation", Field: "reserve_id"}
	case len(cr.ReserveID) > maxReserveID:
		return Check{}, &ErrorResponse{Error: fmt.Sprintf("reserve_id is %d bytes long: use at most %d", len(cr.ReserveID), maxReserveID), Field: "reserve_id"}
	case cr.ReserveTTLMs != nil && cr.ReserveID == "":
		return Check{}, &ErrorResponse{Error: "reserve_ttl_ms needs a reserve_id: send the reservation's id, or remove reserve_ttl_ms", Field: "reserve_ttl_ms"}
	case cr.ReserveTTLMs != nil && cr.Settle:
		return Check{}, &ErrorResponse{Error: "reserve_ttl_ms applies to a reservation, not to its settlement: remove it", Field: "reserve_ttl_ms"}
	case cr.ReserveTTLMs != nil && (*cr.ReserveTTLMs < 1 || *cr.ReserveTTLMs > engine.MaxReservationTTL.Milliseconds()):
		return Check{}, &ErrorResponse{Error: fmt.Sprintf("reserve_ttl_ms must be 1 to %d (an hour); leave it out for %d", engine.MaxReservationTTL.Milliseconds(), engine.DefaultReservationTTL.Milliseconds()), Field: "reserve_ttl_ms"}
	}
	if cr.ReserveTTLMs != nil {
		c.ReserveTTL = time.Duration(*cr.ReserveTTLMs) * time.Millisecond
	}
	return c, nil
}

// maxReserveID bounds a reserve_id's length, in bytes, as the engine does.
const maxReserveID = 128

// jsonError turns an error of jsonv2.Unmarshal on body into an answer that names the
// field and says what was wrong with it.
func jsonError(body []byte, err error) *ErrorResponse {
	var se *jsonv2.SemanticError
	if errors.As(err, &se) {
		field := fieldName(se.JSONPointer)
		if errors.Is(err, jsonv2.ErrUnknownName) {
			return &ErrorResponse{Error: fmt.Sprintf("unknown field %q; known fields: domain, attributes, cost, settle, reserve_id, reserve_ttl_ms", field), Field: field}
		}
		got := kindName(se.JSONKind)
		if se.JSONKind == '0' && len(se.JSONValue) > 0 {
			got += " " + string(se.JSONValue)
		}
		what := field
		if what == "" {
			what = "the body"
		}
		return &ErrorResponse{Error: fmt.Sprintf("%s must be %s, not a JSON %s", what, want(field), got), Field: field}
	}
	var ye *jsontext.SyntacticError
	if !errors.As(err, &ye) {
		return &ErrorResponse{Error: "malformed JSON: " + err.Error()}
	}
	switch {
	case len(bytes.Trim(body, " \t\r\n")) == 0:
		return &ErrorResponse{Error: `empty body; send {"domain": ..., "attributes": {...}, "cost": 1}`}
	case errors.Is(err, jsontext.ErrDuplicateName):
		field := fieldName(ye.JSONPointer)
		return &ErrorResponse{Error: fmt.Sprintf("%s is given twice; send each name once", field), Field: field}
	case ye.ByteOffset <= int64(len(body)) && jsontext.Value(body[:ye.ByteOffset]).IsValid():
		return &ErrorResponse{Error: fmt.Sprintf("body holds more than one JSON value: unexpected data at byte %d", ye.ByteOffset)}
	}
	return &ErrorResponse{Error: fmt.Sprintf("malformed JSON at byte %d: %v", ye.ByteOffset, ye.Err)}
}

// fieldName writes a JSON pointer as the answer names fields: /attributes/api_key is
// attributes.api_key.
func fieldName(p jsontext.Pointer) string {
	return strings.Join(slices.Collect(p.Tokens()), ".")
}

// kindName names a JSON kind as the JSON grammar does.
func kindName(k jsontext.Kind) string {
	switch k {
	case '"':
		return "string"
	case '0':
		return "number"
	case 't', 'f':
		return "boolean"
	case 'n':
		return "null"
	case '{':
		return "object"
	case '[':
		return "array"
	}
	return "value"
}

func want(field string) string {
	switch {
	case field == "":
		return "a JSON object"
	case field == "domain":
		return "a string"
	case field == "cost", field == "reserve_ttl_ms":
		return "a whole number"
	case field == "settle":
		return "true or false"
	case field == "reserve_id":
		return "a string"
	case field == "attributes":
		return "an object of strings"
	case strings.HasPrefix(field, "attributes."):
		return "a string"
	}
	return "of another type"
}

func (h *handler) check(w http.ResponseWriter, r *http.Request) {
	c, ok := readCheck(w, r)
	if !ok {
		return
	}
	req := c.Request
	var v engine.Verdict
	var err error
	if c.ReserveID == "" {
		v, err = h.eng.Check(r.Context(), req)
	} else {
		var p engine.Plan
		if p, err = h.eng.Plan(req); err == nil {
			if req.Settle {
				v, err = h.eng.SettleReserved(r.Context(), p, c.ReserveID)
			} else {
				v, err = h.eng.Reserve(r.Context(), p, c.ReserveID, c.ReserveTTL)
			}
		}
	}
	if err != nil {
		// A caller's mistake, an unknown reservation, or a settlement the store did
		// not take: the failure mode answers a decision's store failure.
		h.writeEngineError(w, err)
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
	writeJSON(w, status, Response(req.Domain, v))
}

// Response builds the JSON body of a verdict. limit and window_ms are the quota the
// RateLimit headers state (algo.QuotaWindow): a limit with a burst states its burst
// over the time the rate refills it, so that remaining never exceeds limit.
func Response(domain string, v engine.Verdict) CheckResponse {
	cr := CheckResponse{
		Allowed:      v.Allowed,
		Domain:       domain,
		Rule:         v.Rule,
		Reason:       v.Reason,
		Limit:        v.Quota,
		Remaining:    max(0, v.Decision.Remaining),
		ResetAfterMs: ms(v.Decision.ResetAfter),
		RetryAfterMs: ms(v.Decision.RetryAfter),
		DelayMs:      ms(v.Delay),
		Degraded:     v.Degraded,
		Cached:       v.Cached,
		Limits:       make([]LimitJSON, 0, len(v.Limits)),
	}
	if len(v.Limits) == 0 && !v.Degraded {
		cr.Note = NoRuleNote
	}
	for _, l := range v.Limits {
		q, w := l.Stated()
		cr.Limits = append(cr.Limits, LimitJSON{
			Rule: l.Rule, Algorithm: string(l.Algorithm), Allowed: l.Allowed, Shadow: l.Shadow,
			Limit: q, WindowMs: ms(w), Remaining: max(0, l.Remaining),
			ResetAfterMs: ms(l.ResetAfter), RetryAfterMs: ms(l.RetryAfter), DelayMs: ms(l.Delay),
		})
	}
	return cr
}

// ReadyResponse is the body of a /readyz answer.
type ReadyResponse struct {
	// Status is "ready" (every node can decide), "degraded" (some can: requests whose
	// keys are on the others get the failure mode) or "not ready" (none can).
	Status string `json:"status"`
	// Breaker is the worst state of the circuit breakers.
	Breaker string `json:"breaker"`
	// Error is why the service is not ready.
	Error string `json:"error,omitempty"`
	// Nodes holds each Redis node's breaker and health check.
	Nodes []NodeJSON `json:"nodes,omitempty"`
}

// NodeJSON is one Redis node in a /readyz answer.
type NodeJSON struct {
	Node    string `json:"node"`
	Breaker string `json:"breaker"`
	Error   string `json:"error,omitempty"`
}

// ready answers /readyz: 503 when no node can decide, so that a load balancer stops
// sending to an instance that could only answer with the failure mode; 200 when at
// least one can, "degraded" when some cannot. Every instance sees the same dead shard:
// pulling them all would turn one shard's outage into a total one. The health check of
// each node goes through its breaker and is the probe of a breaker whose wait is over,
// so an instance the load balancer took out of service still recovers.
func (h *handler) ready(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	// The two checks run side by side: a dead node must not spend one's time on the
	// other.
	var err error
	done := make(chan struct{})
	go func() {
		defer close(done)
		if h.opts.Ready != nil {
			err = h.opts.Ready(ctx)
		}
	}()
	sts := h.eng.Health(ctx)
	<-done
	rr := ReadyResponse{Breaker: breaker.Worst(sts).String(), Nodes: make([]NodeJSON, len(sts))}
	deciding := 0
	for i, st := range sts {
		rr.Nodes[i] = NodeJSON{Node: st.Node, Breaker: st.State.String()}
		if st.Err != nil {
			rr.Nodes[i].Error = st.Err.Error()
		} else if st.State == breaker.Closed {
			deciding++
		}
	}
	if err == nil && len(sts) > 0 && deciding == 0 {
		err = errors.New("no Redis node can decide: every circuit breaker is open or every node failed its check")
	}
	status := http.StatusOK
	switch {
	case err != nil:
		status, rr.Status, rr.Error = http.StatusServiceUnavailable, "not ready", err.Error()
	case deciding < len(sts):
		rr.Status = "degraded"
	default:
		rr.Status = "ready"
	}
	writeJSON(w, status, rr)
}

func (h *handler) admin(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || subtle.ConstantTimeCompare([]byte(tok), []byte(h.opts.AdminToken)) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="tollgate-admin"`)
			writeJSON(w, http.StatusUnauthorized, ErrorResponse{Error: "admin endpoints need Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>"})
			return
		}
		next(w, r)
	}
}

// StateResponse is the body of a /v1/state answer.
type StateResponse struct {
	Domain string        `json:"domain"`
	Limits []LimitState  `json:"limits"`
	Check  CheckResponse `json:"check"`
	Keys   []string      `json:"keys"`
}

// LimitState is one meter's state with its recorded values.
type LimitState struct {
	Key     string           `json:"key"`
	Records map[string]int64 `json:"records,omitempty"`
}

// readRequest reads and parses the body of an admin request, which neither settles
// nor reserves, and answers the client's mistake (see readCheck).
func readRequest(w http.ResponseWriter, r *http.Request) (engine.Request, bool) {
	c, ok := readCheck(w, r)
	if ok && (c.Request.Settle || c.ReserveID != "") {
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: "settle and reserve_id belong to /v1/check: remove them", Field: "settle"})
		return engine.Request{}, false
	}
	return c.Request, ok
}

// readCheck reads and parses the body of a /v1/check request, and answers the
// client's mistake: 413 for a body over bounds.MaxBody, else 400.
func readCheck(w http.ResponseWriter, r *http.Request) (Check, bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, bounds.MaxBody+1))
	if err != nil {
		writeJSON(w, http.StatusBadRequest, ErrorResponse{Error: "reading body: " + err.Error()})
		return Check{}, false
	}
	c, perr := ParseCheck(body)
	if perr != nil {
		status := http.StatusBadRequest
		if len(body) > bounds.MaxBody {
			status = http.StatusRequestEntityTooLarge
		}
		writeJSON(w, status, perr)
		return Check{}, false
	}
	return c, true
}

func (h *handler) state(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	plan, err := h.eng.Plan(req)
	if err != nil {
		h.writeEngineError(w, err)
		return
	}
	v, err := h.eng.Peek(r.Context(), plan)
	if err != nil {
		h.writeEngineError(w, err)
		return
	}
	sr := StateResponse{Domain: req.Domain, Check: Response(req.Domain, v), Keys: plan.Check().Keys}
	for _, it := range plan.Items {
		ls := LimitState{Key: it.Key}
		if it.Meter.Record != "" || it.Meter.Algorithm().CanRecord() {
			recs, err := h.opts.Admin.Records(r.Context(), it.Key, it.Meter)
			if err != nil {
				h.writeEngineError(w, err)
				return
			}
			ls.Records = recs
		}
		sr.Limits = append(sr.Limits, ls)
	}
	writeJSON(w, http.StatusOK, sr)
}

func (h *handler) reset(w http.ResponseWriter, r *http.Request) {
	req, ok := readRequest(w, r)
	if !ok {
		return
	}
	keys, meters, err := h.eng.Keys(req.Domain, req.Attributes)
	if err != nil {
		h.writeEngineError(w, err)
		return
	}
	if err := h.opts.Admin.Reset(r.Context(), keys, meters); err != nil {
		h.writeEngineError(w, err)
		return
	}
	h.eng.Forget(keys)
	writeJSON(w, http.StatusOK, map[string]any{"reset": keys})
}

// badRequest is the answer to an engine error that wraps ErrBadRequest, naming the
// field the caller got wrong.
func badRequest(err error) ErrorResponse {
	er := ErrorResponse{Error: err.Error()}
	var be *bounds.Error
	switch {
	case errors.Is(err, engine.ErrUnknownDomain):
		er.Field = "domain"
	case errors.As(err, &be):
		er.Field = be.Field
	}
	return er
}

func (h *handler) writeEngineError(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, engine.ErrBadRequest):
		writeJSON(w, http.StatusBadRequest, badRequest(err))
		return
	case errors.Is(err, engine.ErrUnknownReservation):
		writeJSON(w, http.StatusNotFound, ErrorResponse{Error: err.Error(), Field: "reserve_id"})
		return
	case errors.Is(err, engine.ErrSettleFailed):
		// Not known to be charged: the caller sends it again (a timed-out call may
		// have run, so a retry may charge twice; the engine counted it).
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: "settlement not taken, send it again: " + err.Error()})
		return
	}
	h.log.Error("request failed", "err", err)
	writeJSON(w, http.StatusServiceUnavailable, ErrorResponse{Error: "store unavailable: " + err.Error()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":"internal error"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	w.Write(append(b, '\n'))
}
