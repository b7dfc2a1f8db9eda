package main

import (
	"runtime/debug"
	"testing"
)

func TestTuneGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

	debug.SetGCPercent(100)
	tuneGC(env(nil))
	if got := debug.SetGCPercent(100); got != gcPercent {
		t.Errorf("GOGC unset: GC percent %d, want %d", got, gcPercent)
	}
	tuneGC(env(map[string]string{"GOGC": "100"}))
	if got := debug.SetGCPercent(100); got != 100 {
		t.Errorf("GOGC=100: GC percent %d, want the runtime's 100 left alone", got)
	}

	before := debug.SetMemoryLimit(-1)
	tuneGC(env(map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512"}))
	if got, want := debug.SetMemoryLimit(-1), int64(512<<20*9/10); got != want {
		t.Errorf("on Lambda with 512 MB: memory limit %d, want %d", got, want)
	}
	debug.SetMemoryLimit(before)
	tuneGC(env(map[string]string{"AWS_LAMBDA_FUNCTION_MEMORY_SIZE": "512", "GOMEMLIMIT": "100MiB"}))
	if got := debug.SetMemoryLimit(-1); got != before {
		t.Errorf("GOMEMLIMIT set: memory limit %d, want %d left alone", got, before)
	}
}
