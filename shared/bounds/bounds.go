// Package bounds holds the limits on what a caller may ask the decision engine: how
// many attributes, how long each, what cost, how large an HTTP body. The engine
// enforces them for every front door; the decision service names the field a caller
// got wrong; the Envoy filter (compiled to wasip1, so this package imports nothing
// heavy) keeps its requests within them. Past a bound a request is the caller's
// mistake (400), never a 500.
package bounds

import (
	"fmt"
	"unicode/utf8"
)

const (
	// MaxAttributes is how many attributes a request may carry.
	MaxAttributes = 64
	// MaxValueLength bounds an attribute's name and its value, in bytes.
	MaxValueLength = 1024
	// MaxCost is the largest cost (units charged) of one request.
	MaxCost = 1 << 20
	// MaxBody bounds the body of an HTTP decision request, in bytes.
	MaxBody = 16 << 10
)

// An Error is a request past one of the bounds.
type Error struct {
	// Field names what is wrong: "attributes", "attributes.<name>" or "cost".
	Field string
	// Msg says what is wrong with it.
	Msg string
}

func (e *Error) Error() string { return e.Field + ": " + e.Msg }

// Check returns the first bound that a request with attrs and cost is past, or nil.
func Check(attrs map[string]string, cost int64) *Error {
	if cost < 0 || cost > MaxCost {
		return &Error{Field: "cost", Msg: fmt.Sprintf("cost must be from 0 to %d", MaxCost)}
	}
	if len(attrs) > MaxAttributes {
		return &Error{Field: "attributes", Msg: fmt.Sprintf("%d attributes; at most %d", len(attrs), MaxAttributes)}
	}
	for k, v := range attrs {
		field := "attributes." + clip(k)
		if len(k) > MaxValueLength || len(v) > MaxValueLength {
			return &Error{Field: field, Msg: fmt.Sprintf("value longer than %d bytes", MaxValueLength)}
		}
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return &Error{Field: fmt.Sprintf("attributes.%q", clip(k)), Msg: "not valid UTF-8"}
		}
	}
	return nil
}

// clip cuts a name to 64 bytes for a message.
func clip(s string) string {
	if len(s) <= 64 {
		return s
	}
	return s[:64]
}
