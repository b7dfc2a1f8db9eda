// Package emf writes CloudWatch Embedded Metric Format (EMF) log lines: one JSON
// object per line whose "_aws" member tells CloudWatch Logs which of the line's
// members are metrics and which are their dimensions, so that a Lambda function
// publishes metrics by printing to stdout, without an API call on the request path.
//
// Every line also carries a "level" member (and an RFC 3339 "timestamp"), the fields
// Lambda's log-level filtering reads from JSON logs: a line without a level counts as
// INFO and would be dropped when the function's application log level is WARN or
// stricter. A Logger writes its lines at Level, which New sets from Lambda's
// AWS_LAMBDA_LOG_LEVEL so that the metrics pass the filter in force.
//
// The format is documented in the CloudWatch user guide, "Specification: Embedded
// metric format".
package emf

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"time"
)

// Limits of the format (CloudWatch EMF specification).
const (
	// MaxDimensions is the most dimensions a dimension set may hold.
	MaxDimensions = 30
	// MaxMetrics is the most metrics one directive may define.
	MaxMetrics = 100
	// MaxNameLength bounds metric and dimension names, in bytes.
	MaxNameLength = 255
	// MaxValueLength bounds a dimension value, in bytes; longer values are cut.
	MaxValueLength = 1024
)

// A Unit is a CloudWatch metric unit.
type Unit string

// The units tollgate uses; any CloudWatch unit name is valid.
const (
	Count        Unit = "Count"
	Milliseconds Unit = "Milliseconds"
	Microseconds Unit = "Microseconds"
	Seconds      Unit = "Seconds"
	None         Unit = "None"
)

// A Metric is one value of a named metric.
type Metric struct {
	Name  string
	Unit  Unit
	Value float64
}

// A Directive publishes its metrics under each of its dimension sets. A dimension set
// lists dimension names; their values are the line's properties of the same names.
// An empty set publishes the metrics without dimensions.
type Directive struct {
	Dimensions [][]string
	Metrics    []Metric
}

// A Line is one EMF log line.
type Line struct {
	// Time is the metrics' timestamp.
	Time time.Time
	// Properties are the dimension values, and any other string members to log
	// alongside (request id, reason). They must not use the names "_aws", "level",
	// "timestamp" or a metric's name.
	Properties map[string]string
	// Directives define the metrics.
	Directives []Directive
}

// A Logger writes EMF lines to a writer, one Write per line. It is safe for
// simultaneous use.
type Logger struct {
	// Namespace is the CloudWatch namespace of every metric.
	Namespace string
	// Level is the "level" member of every line (default "INFO").
	Level string

	mu sync.Mutex // serializes the writes to w
	w  io.Writer
}

// New returns a logger that writes to w in namespace. Its level is INFO, or
// logLevel when that is a level Lambda knows above INFO (WARN, ERROR, FATAL), so that
// the lines survive Lambda's application log-level filter; pass
// os.Getenv("AWS_LAMBDA_LOG_LEVEL").
func New(w io.Writer, namespace, logLevel string) (*Logger, error) {
	if w == nil {
		return nil, errors.New("emf: nil writer")
	}
	if err := checkName("namespace", namespace); err != nil {
		return nil, err
	}
	return &Logger{Namespace: namespace, Level: LevelFor(logLevel), w: w}, nil
}

// LevelFor returns the level at which metrics pass a Lambda application log-level
// filter set to logLevel: "INFO" unless logLevel is WARN, ERROR or FATAL (in any
// case), which is returned in upper case.
func LevelFor(logLevel string) string {
	switch l := strings.ToUpper(strings.TrimSpace(logLevel)); l {
	case "WARN", "ERROR", "FATAL":
		return l
	default:
		return "INFO"
	}
}

// Write writes one line. It returns an error, and writes nothing, when the line
// breaks the format: a missing dimension value, a bad name, a value that is not a
// finite number, too many dimensions or metrics.
func (l *Logger) Write(line Line) error {
	b, err := l.Encode(line)
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, err = l.w.Write(b)
	return err
}

// document holds the members every line starts with, in the order they are written.
type document struct {
	AWS       metadata `json:"_aws"`
	Level     string   `json:"level"`
	Timestamp string   `json:"timestamp"`
}

// metadata is the "_aws" member: which of the line's members are metrics.
type metadata struct {
	Timestamp         int64       `json:"Timestamp"` // milliseconds since the Unix epoch
	CloudWatchMetrics []directive `json:"CloudWatchMetrics"`
}

type directive struct {
	Namespace  string       `json:"Namespace"`
	Dimensions [][]string   `json:"Dimensions"`
	Metrics    []definition `json:"Metrics"`
}

// definition names a metric whose value is the line's member of that name.
type definition struct {
	Name string `json:"Name"`
	Unit Unit   `json:"Unit,omitempty"`
}

// Encode returns the line as Write would write it, newline included: the document's
// members, then the properties in the order of their names, then each metric's value
// once, in the order the directives define them.
func (l *Logger) Encode(line Line) ([]byte, error) {
	if err := validate(line); err != nil {
		return nil, err
	}
	t := line.Time
	if t.IsZero() {
		t = time.Now()
	}
	doc := document{
		AWS:       metadata{Timestamp: t.UnixMilli(), CloudWatchMetrics: make([]directive, len(line.Directives))},
		Level:     cmp.Or(l.Level, "INFO"),
		Timestamp: t.UTC().Format(time.RFC3339Nano),
	}
	for i, d := range line.Directives {
		dir := directive{Namespace: l.Namespace, Dimensions: make([][]string, len(d.Dimensions)), Metrics: make([]definition, len(d.Metrics))}
		for j, set := range d.Dimensions {
			if set == nil {
				set = []string{} // an empty set is [], not null
			}
			dir.Dimensions[j] = set
		}
		for j, m := range d.Metrics {
			dir.Metrics[j] = definition{Name: m.Name, Unit: m.Unit}
		}
		doc.AWS.CloudWatchMetrics[i] = dir
	}
	b, err := json.Marshal(doc)
	if err != nil {
		return nil, fmt.Errorf("emf: %w", err)
	}
	// The properties and metric values are members of the same object, after the
	// document's: b loses its closing brace and each member is appended.
	b = b[:len(b)-1]
	for _, k := range slices.Sorted(maps.Keys(line.Properties)) {
		b = appendMember(b, k, clip(line.Properties[k]))
	}
	seen := map[string]bool{}
	for _, d := range line.Directives {
		for _, m := range d.Metrics {
			if !seen[m.Name] {
				seen[m.Name] = true
				b = appendMember(b, m.Name, m.Value)
			}
		}
	}
	return append(b, "}\n"...), nil
}

// appendMember appends ,"name":value to b, each encoded by encoding/json. Invalid
// UTF-8 in a string becomes U+FFFD.
func appendMember(b []byte, name string, value any) []byte {
	k, _ := json.Marshal(name)  // a string always marshals
	v, _ := json.Marshal(value) // a string or a finite float64 (validate checked it)
	b = append(append(b, ','), k...)
	return append(append(b, ':'), v...)
}

// reserved are the members every line has.
var reserved = map[string]bool{"_aws": true, "level": true, "timestamp": true}

func validate(line Line) error {
	if len(line.Directives) == 0 {
		return errors.New("emf: a line needs at least one directive")
	}
	for k := range line.Properties {
		if reserved[k] {
			return fmt.Errorf("emf: property %q: the name is reserved", k)
		}
	}
	values := map[string]float64{}
	for i, d := range line.Directives {
		if len(d.Metrics) == 0 || len(d.Metrics) > MaxMetrics {
			return fmt.Errorf("emf: directives[%d]: %d metrics; want 1 to %d", i, len(d.Metrics), MaxMetrics)
		}
		for _, set := range d.Dimensions {
			if len(set) > MaxDimensions {
				return fmt.Errorf("emf: directives[%d]: a dimension set of %d; at most %d", i, len(set), MaxDimensions)
			}
			for _, name := range set {
				if err := checkName("dimension", name); err != nil {
					return err
				}
				if _, ok := line.Properties[name]; !ok {
					return fmt.Errorf("emf: dimension %q has no value: add it to Properties", name)
				}
			}
		}
		for _, m := range d.Metrics {
			if err := checkName("metric", m.Name); err != nil {
				return err
			}
			if reserved[m.Name] {
				return fmt.Errorf("emf: metric %q: the name is reserved", m.Name)
			}
			if _, ok := line.Properties[m.Name]; ok {
				return fmt.Errorf("emf: metric %q is also a property", m.Name)
			}
			if math.IsNaN(m.Value) || math.IsInf(m.Value, 0) {
				return fmt.Errorf("emf: metric %q: value %v is not a finite number", m.Name, m.Value)
			}
			if v, ok := values[m.Name]; ok && v != m.Value {
				return fmt.Errorf("emf: metric %q has two values, %v and %v", m.Name, v, m.Value)
			}
			values[m.Name] = m.Value
		}
	}
	return nil
}

func checkName(what, name string) error {
	if name == "" || len(name) > MaxNameLength {
		return fmt.Errorf("emf: %s name %q: want 1 to %d bytes", what, name, MaxNameLength)
	}
	return nil
}

// clip cuts s to MaxValueLength bytes.
func clip(s string) string {
	if len(s) <= MaxValueLength {
		return s
	}
	return s[:MaxValueLength]
}
