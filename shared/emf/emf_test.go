package emf

import (
	"bytes"
	"encoding/json"
	"math"
	"strings"
	"sync"
	"testing"
	"time"
)

var t0 = time.Date(2025, 3, 4, 5, 6, 7, 890_000_000, time.UTC)

func decisionLine() Line {
	return Line{
		Time:       t0,
		Properties: map[string]string{"Function": "tollgate-authorizer", "Rule": "per-key", "Result": "denied"},
		Directives: []Directive{
			{Dimensions: [][]string{{"Function", "Rule", "Result"}}, Metrics: []Metric{{Name: "Decisions", Unit: Count, Value: 1}}},
			{Dimensions: [][]string{{"Function"}}, Metrics: []Metric{
				{Name: "DecisionLatency", Unit: Milliseconds, Value: 1.25},
				{Name: "FailureModeActivations", Unit: Count, Value: 0},
			}},
		},
	}
}

func TestEncodeGolden(t *testing.T) {
	t.Parallel()
	l, err := New(&bytes.Buffer{}, "Tollgate", "")
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	got, err := l.Encode(decisionLine())
	if err != nil {
		t.Fatalf("Encode() error = %v", err)
	}
	want := `{"_aws":{"Timestamp":1741064767890,"CloudWatchMetrics":[` +
		`{"Namespace":"Tollgate","Dimensions":[["Function","Rule","Result"]],"Metrics":[{"Name":"Decisions","Unit":"Count"}]},` +
		`{"Namespace":"Tollgate","Dimensions":[["Function"]],"Metrics":[{"Name":"DecisionLatency","Unit":"Milliseconds"},{"Name":"FailureModeActivations","Unit":"Count"}]}]},` +
		`"level":"INFO","timestamp":"2025-03-04T05:06:07.89Z",` +
		`"Function":"tollgate-authorizer","Result":"denied","Rule":"per-key",` +
		`"Decisions":1,"DecisionLatency":1.25,"FailureModeActivations":0}` + "\n"
	if string(got) != want {
		t.Errorf("Encode() =\n%s\nwant\n%s", got, want)
	}
}

// TestEncodeIsSpecShaped parses a line back and checks the structure the EMF
// specification requires: every dimension and metric named in a directive is a root
// member, dimensions are strings and metrics numbers.
func TestEncodeIsSpecShaped(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, err := New(&buf, "Tollgate", "warn")
	if err != nil {
		t.Fatalf("New() error = %v", err)
	}
	line := decisionLine()
	line.Properties["Rule"] = "quote\" <and> \xff"
	if err := l.Write(line); err != nil {
		t.Fatalf("Write() error = %v", err)
	}
	if !strings.HasSuffix(buf.String(), "}\n") || strings.Count(buf.String(), "\n") != 1 {
		t.Fatalf("Write() = %q, want one line", buf.String())
	}
	var doc struct {
		AWS struct {
			Timestamp         int64
			CloudWatchMetrics []struct {
				Namespace  string
				Dimensions [][]string
				Metrics    []struct{ Name, Unit string }
			}
		} `json:"_aws"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("Unmarshal(%s) error = %v", buf.Bytes(), err)
	}
	var root map[string]any
	if err := json.Unmarshal(buf.Bytes(), &root); err != nil {
		t.Fatalf("Unmarshal(%s) error = %v", buf.Bytes(), err)
	}
	if root["level"] != "WARN" {
		t.Errorf("level = %v, want WARN", root["level"])
	}
	if doc.AWS.Timestamp != t0.UnixMilli() {
		t.Errorf("Timestamp = %d, want %d", doc.AWS.Timestamp, t0.UnixMilli())
	}
	for _, d := range doc.AWS.CloudWatchMetrics {
		if d.Namespace != "Tollgate" {
			t.Errorf("Namespace = %q, want Tollgate", d.Namespace)
		}
		for _, set := range d.Dimensions {
			for _, name := range set {
				if _, ok := root[name].(string); !ok {
					t.Errorf("dimension %q = %#v, want a string member", name, root[name])
				}
			}
		}
		for _, m := range d.Metrics {
			if _, ok := root[m.Name].(float64); !ok {
				t.Errorf("metric %q = %#v, want a number member", m.Name, root[m.Name])
			}
		}
	}
}

func TestWriteRejectsMalformedLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		edit func(*Line)
		want string
	}{
		{"no directive", func(l *Line) { l.Directives = nil }, "at least one directive"},
		{"missing dimension value", func(l *Line) { delete(l.Properties, "Rule") }, `dimension "Rule" has no value`},
		{"NaN", func(l *Line) { l.Directives[0].Metrics[0].Value = math.NaN() }, "not a finite number"},
		{"Inf", func(l *Line) { l.Directives[0].Metrics[0].Value = math.Inf(1) }, "not a finite number"},
		{"empty metric name", func(l *Line) { l.Directives[0].Metrics[0].Name = "" }, "metric name"},
		{"reserved property", func(l *Line) { l.Properties["level"] = "x" }, "reserved"},
		{"metric shadows property", func(l *Line) { l.Properties["Decisions"] = "x" }, "also a property"},
		{"no metrics", func(l *Line) { l.Directives[0].Metrics = nil }, "0 metrics"},
		{"two values", func(l *Line) {
			l.Directives[1].Metrics = append(l.Directives[1].Metrics, Metric{Name: "Decisions", Value: 2})
		}, "two values"},
		{"too many dimensions", func(l *Line) {
			set := make([]string, MaxDimensions+1)
			for i := range set {
				set[i] = "Function"
			}
			l.Directives[0].Dimensions = [][]string{set}
		}, "dimension set of 31"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			l, _ := New(&buf, "Tollgate", "")
			line := decisionLine()
			tt.edit(&line)
			err := l.Write(line)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Write() error = %v, want one containing %q", err, tt.want)
			}
			if buf.Len() != 0 {
				t.Errorf("Write() wrote %q after an error, want nothing", buf.String())
			}
		})
	}
}

func TestNewRejectsBadArguments(t *testing.T) {
	t.Parallel()
	if _, err := New(nil, "Tollgate", ""); err == nil {
		t.Errorf("New(nil writer) error = nil, want an error")
	}
	if _, err := New(&bytes.Buffer{}, "", ""); err == nil {
		t.Errorf("New(empty namespace) error = nil, want an error")
	}
}

func TestLevelFor(t *testing.T) {
	t.Parallel()
	tests := map[string]string{
		"": "INFO", "TRACE": "INFO", "debug": "INFO", "INFO": "INFO",
		"warn": "WARN", "ERROR": "ERROR", " fatal ": "FATAL", "bogus": "INFO",
	}
	for in, want := range tests {
		if got := LevelFor(in); got != want {
			t.Errorf("LevelFor(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestLongValuesAreClipped(t *testing.T) {
	t.Parallel()
	l, _ := New(&bytes.Buffer{}, "Tollgate", "")
	line := decisionLine()
	line.Properties["Rule"] = strings.Repeat("r", 5000)
	got, err := l.Encode(line)
	if err != nil {
		t.Fatalf("Encode() error = %v", err)
	}
	var root map[string]any
	if err := json.Unmarshal(got, &root); err != nil {
		t.Fatalf("Unmarshal() error = %v", err)
	}
	if n := len(root["Rule"].(string)); n != MaxValueLength {
		t.Errorf("len(Rule) = %d, want %d", n, MaxValueLength)
	}
}

// TestConcurrentWritesKeepLinesWhole writes from many goroutines and checks that
// every line arrives whole.
func TestConcurrentWritesKeepLinesWhole(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l, _ := New(&buf, "Tollgate", "")
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				if err := l.Write(decisionLine()); err != nil {
					t.Errorf("Write() error = %v", err)
				}
			}
		})
	}
	wg.Wait()
	lines := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(lines) != 400 {
		t.Fatalf("got %d lines, want 400", len(lines))
	}
	for _, line := range lines {
		if !json.Valid([]byte(line)) {
			t.Fatalf("line %q is not valid JSON", line)
		}
	}
}
