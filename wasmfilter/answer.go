package main

import (
	"math"
	"strconv"
	"time"
)

// An answerBody is what the filter reads of the decision service's answer, all of it
// from the JSON body of POST /v1/check, the service's public API: the deciding rule,
// the retry and shaping delay, and why a 503 was given. Whether the request is allowed
// is the status (200, 429, or 503 with "reason": "unavailable"); the service's
// rate-limit headers are passed on to the client, not read. A member that is absent,
// or of another type than the one below, reads as absent, and a body that is not
// JSON has no members.
type answerBody struct {
	rule, reason, message string // "rule", "reason", "error"
	hasMessage            bool
	// degraded is "degraded": the service's failure mode answered, not its store
	// (so a reservation was not kept).
	degraded bool
	// retry and delay are "retry_after_ms" and "delay_ms" (answerMillis): 0 when
	// absent, not a positive whole number, or too large for a time.Duration.
	retry, delay time.Duration
}

// The reader of the body is chosen at build time: answer_jsonv.go (the default,
// internal/jsonv) or answer_encjson.go (-tags encjson, encoding/json), so that
// BenchmarkJSONReader can weigh one against the other in the compiled module.

// parseAnswer reads the body of the decision service's answer. A body that is not
// JSON reads as an answer without members.
func parseAnswer(body []byte) answerBody {
	a, _ := parseAnswerErr(body)
	return a
}

// unavailableVerdict reports whether the body of a 503 is the decision service's
// verdict that it cannot decide and its policy fails closed — a JSON object with
// "reason": "unavailable" — rather than Envoy's own 503 (no healthy upstream, connect
// error), whose body is plain text.
func unavailableVerdict(a answerBody) bool {
	return a.reason == "unavailable"
}

// answerMillis reads a number of milliseconds as the answer writes it: a positive whole
// number that fits a time.Duration, else 0. It is the one reader of the answer's times.
func answerMillis(text string) time.Duration {
	ms, err := strconv.ParseInt(text, 10, 64)
	if err != nil || ms <= 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0
	}
	return time.Duration(ms) * time.Millisecond
}
