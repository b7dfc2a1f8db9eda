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
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
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

	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
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
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Reset()
	if err := l.encode(&l.buf, line); err != nil {
		return err
	}
	_, err := l.w.Write(l.buf.Bytes())
	return err
}

// Encode returns the line as Write would write it, newline included.
func (l *Logger) Encode(line Line) ([]byte, error) {
	var b bytes.Buffer
	if err := l.encode(&b, line); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

func (l *Logger) encode(b *bytes.Buffer, line Line) error {
	if err := validate(line); err != nil {
		return err
	}
	level := l.Level
	if level == "" {
		level = "INFO"
	}
	t := line.Time
	if t.IsZero() {
		t = time.Now()
	}
	b.WriteString(`{"_aws":{"Timestamp":`)
	b.WriteString(strconv.FormatInt(t.UnixMilli(), 10))
	b.WriteString(`,"CloudWatchMetrics":[`)
	for i, d := range line.Directives {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"Namespace":`)
		writeString(b, l.Namespace)
		b.WriteString(`,"Dimensions":[`)
		for j, set := range d.Dimensions {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteByte('[')
			for k, name := range set {
				if k > 0 {
					b.WriteByte(',')
				}
				writeString(b, name)
			}
			b.WriteByte(']')
		}
		b.WriteString(`],"Metrics":[`)
		for j, m := range d.Metrics {
			if j > 0 {
				b.WriteByte(',')
			}
			b.WriteString(`{"Name":`)
			writeString(b, m.Name)
			if m.Unit != "" {
				b.WriteString(`,"Unit":`)
				writeString(b, string(m.Unit))
			}
			b.WriteByte('}')
		}
		b.WriteString(`]}`)
	}
	b.WriteString(`]},"level":`)
	writeString(b, level)
	b.WriteString(`,"timestamp":`)
	writeString(b, t.UTC().Format(time.RFC3339Nano))
	keys := make([]string, 0, len(line.Properties))
	for k := range line.Properties {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteByte(',')
		writeString(b, k)
		b.WriteByte(':')
		writeString(b, clip(line.Properties[k]))
	}
	seen := map[string]bool{}
	for _, d := range line.Directives {
		for _, m := range d.Metrics {
			if seen[m.Name] {
				continue
			}
			seen[m.Name] = true
			b.WriteByte(',')
			writeString(b, m.Name)
			b.WriteByte(':')
			b.WriteString(strconv.FormatFloat(m.Value, 'g', -1, 64))
		}
	}
	b.WriteString("}\n")
	return nil
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

// writeString writes s as a JSON string. Invalid UTF-8 becomes U+FFFD.
func writeString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always marshals
	b.Write(enc)
}
