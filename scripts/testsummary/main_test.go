package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestSummarize reads the `go test -json` of three packages (testdata/failures.json):
// one with a passing, a skipped and a failing test with subtests, one that does not
// build, one whose test panics.
func TestSummarize(t *testing.T) {
	f, err := os.Open("testdata/failures.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out strings.Builder
	s, err := summarize(f, &out)
	if err != nil {
		t.Fatal(err)
	}
	want := summary{packages: 3, failedPackages: 3, tests: 1, subtests: 1, skipped: 1, failed: 3,
		failures: []string{"fk TestBad/bad", "fk TestBad", "fk/c TestPanic"}}
	if s.packages != want.packages || s.failedPackages != want.failedPackages || s.tests != want.tests || s.subtests != want.subtests ||
		s.skipped != want.skipped || s.failed != want.failed || strings.Join(s.failures, ",") != strings.Join(want.failures, ",") {
		t.Errorf("summarize() = %+v, want %+v", s, want)
	}
	for _, line := range []string{"b/b.go:2:23: cannot use", "FAIL\tfk/b [build failed]", "a_test.go:7: want 1, got 2", "--- FAIL: TestBad (", "panic: boom", "FAIL\tfk/c\t"} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("summarize() output lacks %q:\n%s", line, &out)
		}
	}
	for _, noise := range []string{"=== RUN", "quiet", "no redis-server", "--- PASS", "\nPASS\n"} {
		if strings.Contains(out.String(), noise) {
			t.Errorf("summarize() output has %q, which only a failure's output should:\n%s", noise, &out)
		}
	}
	if got, want := s.line("test-go", 90*time.Second), "test-go: FAIL: 3 packages, 1 tests and 1 subtests passed, 1 skipped, 3 failed, 3 packages failed, in 1m30s (fk TestBad/bad, fk TestBad, fk/c TestPanic)"; got != want {
		t.Errorf("line() = %q, want %q", got, want)
	}
}
