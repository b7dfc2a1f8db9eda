package main

import (
	"fmt"
	"io"
	"os"
	"strings"
)

// progress reports how far the run is: one line redrawn in place on a terminal,
// plain lines otherwise. The zero value (nil writer) reports nothing.
type progress struct {
	w     io.Writer
	tty   bool
	total int
	done  int
	width int // of the last line drawn, to blank it
}

func newProgress(w io.Writer, total int) *progress {
	p := &progress{w: w, total: total}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	return p
}

// step announces the next unit of work.
func (p *progress) step(label string) {
	if p == nil || p.w == nil {
		return
	}
	p.done++
	if !p.tty {
		fmt.Fprintf(p.w, "bench: %d/%d %s\n", p.done, p.total, label)
		return
	}
	const bar = 20
	n := bar * (p.done - 1) / max(1, p.total)
	line := fmt.Sprintf("[%s%s] %d/%d %s", strings.Repeat("#", n), strings.Repeat(".", bar-n), p.done, p.total, label)
	pad := max(0, p.width-len(line))
	p.width = len(line)
	fmt.Fprintf(p.w, "\r%s%s", line, strings.Repeat(" ", pad))
}

// finish ends the line on a terminal.
func (p *progress) finish() {
	if p == nil || p.w == nil || !p.tty {
		return
	}
	fmt.Fprintf(p.w, "\r[%s] %d/%d done%s\n", strings.Repeat("#", 20), p.total, p.total, strings.Repeat(" ", max(0, p.width-30)))
}
