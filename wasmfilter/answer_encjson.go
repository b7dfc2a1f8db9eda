//go:build encjson

package main

// This reader exists to be measured, not shipped: BenchmarkVMStart, BenchmarkRequest
// and BenchmarkJSONReader build the filter with -tags encjson beside the default
// (internal/jsonv) and weigh the two. It is as lenient as encoding/json (a key set
// twice takes the last value, invalid UTF-8 becomes U+FFFD), and TestDependencies
// checks the default build only.

import (
	"encoding/json"
	"errors"
	"strings"
)

// answerMaxDepth is how deeply an answer may nest before its body is ignored:
// encoding/json's own bound.
const answerMaxDepth = 10000

// answerJSON is the answer as encoding/json decodes it.
type answerJSON struct {
	Rule         *string     `json:"rule"`
	Reason       *string     `json:"reason"`
	Error        *string     `json:"error"`
	Degraded     *bool       `json:"degraded"`
	DelayMs      json.Number `json:"delay_ms"`
	RetryAfterMs json.Number `json:"retry_after_ms"`
}

// parseAnswerErr is parseAnswer that also returns why a body is not read. A member
// of the wrong type reads as absent: encoding/json skips it and decodes the rest.
func parseAnswerErr(body []byte) (answerBody, error) {
	var aj answerJSON
	err := json.Unmarshal(body, &aj)
	var te *json.UnmarshalTypeError
	if err != nil && !errors.As(err, &te) {
		return answerBody{}, err
	}
	var a answerBody
	if aj.Rule != nil {
		a.rule = *aj.Rule
	}
	if aj.Reason != nil {
		a.reason = *aj.Reason
	}
	if aj.Error != nil {
		a.message, a.hasMessage = *aj.Error, true
	}
	if aj.Degraded != nil {
		a.degraded = *aj.Degraded
	}
	a.delay, a.retry = answerMillis(aj.DelayMs.String()), answerMillis(aj.RetryAfterMs.String())
	return a, nil
}

// tooDeep reports whether err is a body nested deeper than answerMaxDepth.
func tooDeep(err error) bool {
	return err != nil && strings.Contains(err.Error(), "exceeded max depth")
}
