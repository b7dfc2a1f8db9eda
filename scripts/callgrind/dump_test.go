package main

import (
	"os"
	"strconv"
	"strings"
	"testing"
)

func TestParseTotals(t *testing.T) {
	t.Parallel()
	real, err := os.ReadFile("testdata/idle.callgrind")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, dump, event string
		want              int64
		wantErr           string
	}{
		{"a dump of redis-server (totals, not summary)", string(real), "Ir", 215441, ""},
		{"several events", "events: Ir Dr Dw\nsummary: 1 2 3\ntotals: 10 20 30\n", "Dw", 30, ""},
		{"summary only", "events: Ir\nsummary: 42\n", "Ir", 42, ""},
		{"trailing zero left out", "events: Ir Dr\ntotals: 7\n", "Dr", 0, ""},
		{"no events line", "totals: 5\n", "Ir", 0, "no events: line"},
		{"no totals", "events: Ir\nfn=(1) main\n0 5\n", "Ir", 0, "neither totals: nor summary:"},
		{"no such event", "events: Dr\ntotals: 5\n", "Ir", 0, `no event "Ir"`},
		{"not a count", "events: Ir\ntotals: 5x\n", "Ir", 0, "not a count"},
		{"negative", "events: Ir\ntotals: -5\n", "Ir", 0, "not a count"},
		{"two events lines", "events: Ir\nevents: Ir\ntotals: 5\n", "Ir", 0, "two events: lines"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseTotals(strings.NewReader(tc.dump), tc.event)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("parseTotals(%q) = %d, %v, want an error with %q", tc.name, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("parseTotals(%q) = %d, %v, want %d", tc.name, got, err, tc.want)
			}
		})
	}
}

// FuzzParseTotals checks that no input makes parseTotals panic or return a negative
// count, and that a total written after any text is read back (when the text has no
// events: line of its own).
func FuzzParseTotals(f *testing.F) {
	real, err := os.ReadFile("testdata/idle.callgrind")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(real), int64(215441))
	f.Add("events: Ir Dr\ntotals: 7\n", int64(0))
	f.Add("summary: 3\n", int64(1)<<62)
	f.Fuzz(func(t *testing.T, dump string, n int64) {
		got, err := parseTotals(strings.NewReader(dump), "Ir")
		if err == nil && got < 0 {
			t.Fatalf("parseTotals(%q) = %d, a negative count", dump, got)
		}
		if n < 0 || strings.Contains(dump, "events") || strings.Contains(dump, "totals") || strings.Contains(dump, "\r") {
			return
		}
		written := dump + "\nevents: Ir\ntotals: " + strconv.FormatInt(n, 10) + "\n"
		if got, err := parseTotals(strings.NewReader(written), "Ir"); err != nil || got != n {
			t.Fatalf("parseTotals(%q) = %d, %v, want %d", written, got, err, n)
		}
	})
}
