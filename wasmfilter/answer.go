package main

import (
	"math"
	"strconv"
	"time"
)

// An answerBody is what the filter uses of the decision service's JSON body. A member
// that is absent, or of another type than the one below, reads as absent, and a body
// that is not JSON has no members.
type answerBody struct {
	rule, reason, message          string // "rule", "reason", "error"
	hasRule, hasReason, hasMessage bool
	// delayMs and retryAfterMs are "delay_ms" and "retry_after_ms" as written, or
	// empty when absent or not numbers.
	delayMs, retryAfterMs string
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
	return a.hasReason && a.reason == "unavailable"
}

// answerMillis returns a whole number of milliseconds, as written in the answer, when it is
// positive and fits a time.Duration.
func answerMillis(text string) (time.Duration, bool) {
	ms, err := strconv.ParseInt(text, 10, 64)
	if err != nil || ms <= 0 || ms > math.MaxInt64/int64(time.Millisecond) {
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}
