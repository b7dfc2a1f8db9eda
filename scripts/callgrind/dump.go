package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// parseTotals reads a callgrind dump (the callgrind format,
// valgrind.org/docs/manual/cl-format.html) and returns its total of event, e.g. "Ir":
// the "totals:" line, or the "summary:" line of a dump that has none. The values of
// both are the dump's events, in the order of its "events:" line. iai-callgrind
// prefers totals too: summary has been wrong in some dumps.
func parseTotals(r io.Reader, event string) (int64, error) {
	var events []string
	var totals, summary string
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		line := sc.Text()
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "events":
			if events != nil {
				return 0, errors.New("callgrind dump: two events: lines")
			}
			events = strings.Fields(value)
		case "totals":
			totals = value
		case "summary":
			summary = value
		}
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("callgrind dump: %w", err)
	}
	if totals == "" {
		totals = summary
	}
	if events == nil || strings.TrimSpace(totals) == "" {
		return 0, errors.New("callgrind dump: no events: line, or neither totals: nor summary: (is it a callgrind dump?)")
	}
	i := -1
	for j, e := range events {
		if e == event {
			i = j
			break
		}
	}
	if i < 0 {
		return 0, fmt.Errorf("callgrind dump: no event %q among %q", event, events)
	}
	values := strings.Fields(totals)
	if i >= len(values) {
		// The format lets trailing zero counts be left out.
		return 0, nil
	}
	n, err := strconv.ParseInt(values[i], 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("callgrind dump: total %q of %s is not a count", values[i], event)
	}
	return n, nil
}
