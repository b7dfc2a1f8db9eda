//go:build !encjson

package main

import (
	"errors"

	"github.com/tollgate-dev/tollgate/wasmfilter/internal/jsonv"
)

// internal/jsonv, not encoding/json, reads the answers and the configuration: in the
// compiled module encoding/json makes a request 1.18× (the mix) to 1.20× (allowed)
// as slow, interleaved on one VM of each, and the module 0.64 MiB (19%) larger, which
// every worker compiles (1.28 s against 1.13 s) and starts (5.4 ms against 5.0 ms).
// BenchmarkJSONReader and BenchmarkVMStart guard these figures; jsonv's reader is
// worth its 640 lines while they hold (wasmfilter/README.md, "Cost").

// answerMaxDepth is how deeply an answer may nest before its body is ignored.
const answerMaxDepth = jsonv.MaxDepth

// parseAnswerErr is parseAnswer that also returns why a body is not read.
func parseAnswerErr(body []byte) (answerBody, error) {
	v, err := jsonv.Parse(body)
	if err != nil {
		return answerBody{}, err
	}
	var a answerBody
	a.rule, _ = member(v, "rule").Str()
	a.reason, _ = member(v, "reason").Str()
	a.message, a.hasMessage = member(v, "error").Str()
	a.degraded, _ = member(v, "degraded").Bool()
	delay, _ := member(v, "delay_ms").Num()
	retry, _ := member(v, "retry_after_ms").Num()
	a.delay, a.retry = answerMillis(delay), answerMillis(retry)
	return a, nil
}

func member(v jsonv.Value, key string) jsonv.Value {
	m, _ := v.Get(key)
	return m
}

// tooDeep reports whether err is a body nested deeper than answerMaxDepth.
func tooDeep(err error) bool { return errors.Is(err, jsonv.ErrTooDeep) }
