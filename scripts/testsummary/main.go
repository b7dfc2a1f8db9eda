// Command testsummary reads `go test -json` on stdin and writes what a person needs
// from it: each package's ok or FAIL line, the output of every failed test and of
// every failed build, and, last, one summary line with the packages, tests, skips
// and time. It exits 1 when a test, a package or a build failed.
//
//	go test -json ./... | go run scripts/testsummary/main.go
//
// It imports only the standard library and is one file, so that `go run` of the file
// works from the repository's root whichever module scripts/ belongs to.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"
)

// An event is one line of `go test -json` (cmd/test2json's TestEvent, and the
// build-output and build-fail actions of go 1.24 and later).
type event struct {
	Action      string
	Package     string
	Test        string
	Output      string
	ImportPath  string
	FailedBuild string
}

// A summary counts what a run did.
type summary struct {
	packages, noTests, failedPackages int
	tests, subtests, skipped, failed  int
	failures                          []string // "pkg TestName", in order
}

// line returns the summary line of a run that took d.
func (s summary) line(label string, d time.Duration) string {
	verdict := "ok"
	if s.failedPackages > 0 || s.failed > 0 {
		verdict = "FAIL"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s: %d packages", label, verdict, s.packages)
	if s.noTests > 0 {
		fmt.Fprintf(&b, " (%d without tests)", s.noTests)
	}
	fmt.Fprintf(&b, ", %d tests and %d subtests passed, %d skipped, %d failed", s.tests, s.subtests, s.skipped, s.failed)
	if s.failedPackages > 0 {
		fmt.Fprintf(&b, ", %d packages failed", s.failedPackages)
	}
	fmt.Fprintf(&b, ", in %v", d.Round(time.Second))
	if len(s.failures) > 0 {
		shown := s.failures[:min(len(s.failures), 5)]
		fmt.Fprintf(&b, " (%s", strings.Join(shown, ", "))
		if len(s.failures) > len(shown) {
			fmt.Fprintf(&b, ", and %d more", len(s.failures)-len(shown))
		}
		b.WriteString(")")
	}
	return b.String()
}

// summarize reads events from r and writes the report to w.
func summarize(r io.Reader, w io.Writer) (summary, error) {
	var s summary
	// The output of each running top-level test, its subtests' included, by
	// package and name: printed if it fails, dropped if not.
	output := map[string]*strings.Builder{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		var e event
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil || e.Action == "" {
			fmt.Fprintln(w, sc.Text()) // not an event: pass it on
			continue
		}
		top, _, sub := strings.Cut(e.Test, "/")
		key := e.Package + " " + top
		switch {
		case e.Action == "build-output":
			fmt.Fprint(w, e.Output)
		case e.Test != "" && e.Action == "output":
			if noise(e.Output) {
				continue
			}
			if output[key] == nil {
				output[key] = &strings.Builder{}
			}
			output[key].WriteString(e.Output)
		case e.Test != "" && (e.Action == "pass" || e.Action == "skip" || e.Action == "fail"):
			switch {
			case e.Action == "skip":
				s.skipped++
			case e.Action == "fail":
				s.failed++
				s.failures = append(s.failures, e.Package+" "+e.Test)
			case sub:
				s.subtests++
			default:
				s.tests++
			}
			if !sub {
				if e.Action == "fail" && output[key] != nil {
					fmt.Fprint(w, output[key])
				}
				delete(output, key)
			}
		case e.Test == "" && e.Action == "output":
			// The package's own lines: ok and FAIL, and what a crashed test binary
			// printed outside any test; not PASS, nor a package without tests.
			if e.Output == "PASS\n" || strings.HasPrefix(e.Output, "?   \t") || noise(e.Output) {
				continue
			}
			fmt.Fprint(w, e.Output)
		case e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip"):
			s.packages++
			if e.Action == "skip" {
				s.noTests++
			}
			if e.Action == "fail" {
				s.failedPackages++
				// Tests that never ended (a panic, a timeout) say why here.
				for k, b := range output {
					if strings.HasPrefix(k, e.Package+" ") {
						fmt.Fprint(w, b)
						delete(output, k)
					}
				}
			}
		}
	}
	return s, sc.Err()
}

// noise reports whether a line of a test's output is one go test prints only with -v:
// a test starting, pausing or passing.
func noise(line string) bool {
	t := strings.TrimLeft(line, " ")
	return strings.HasPrefix(t, "=== ") || strings.HasPrefix(t, "--- PASS")
}

func main() {
	label := flag.String("label", "go test", "the name the summary line starts with")
	flag.Parse()
	start := time.Now()
	s, err := summarize(os.Stdin, os.Stdout)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testsummary:", err)
		os.Exit(1)
	}
	fmt.Println(s.line(*label, time.Since(start)))
	if s.failed > 0 || s.failedPackages > 0 {
		os.Exit(1)
	}
}
