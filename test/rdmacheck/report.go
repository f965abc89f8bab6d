package main

import (
	"fmt"
	"io"
)

// Outcomes of one step of the check.
const (
	outOK = "ok"
	// outLimit: the kernel refused or did something a ConnectX VF would
	// not (soft-RoCE's own limits), and the CNI handled it as it must.
	outLimit = "limit"
	outSkip  = "skip"
	outFail  = "FAIL"
)

// report prints each step's outcome and counts them.
type report struct {
	w      io.Writer
	counts map[string]int
}

func newReport(w io.Writer) *report { return &report{w: w, counts: map[string]int{}} }

func (r *report) section(format string, args ...any) {
	fmt.Fprintf(r.w, "\n== "+format+"\n", args...)
}

func (r *report) line(outcome, format string, args ...any) {
	r.counts[outcome]++
	fmt.Fprintf(r.w, "  %-5s  %s\n", outcome, fmt.Sprintf(format, args...))
}

func (r *report) ok(format string, args ...any)    { r.line(outOK, format, args...) }
func (r *report) limit(format string, args ...any) { r.line(outLimit, format, args...) }
func (r *report) skip(format string, args ...any)  { r.line(outSkip, format, args...) }
func (r *report) fail(format string, args ...any)  { r.line(outFail, format, args...) }

// note prints a line that is not an outcome (what was made, a figure).
func (r *report) note(format string, args ...any) {
	fmt.Fprintf(r.w, "         %s\n", fmt.Sprintf(format, args...))
}

// failed reports whether any step failed.
func (r *report) failed() bool { return r.counts[outFail] > 0 }

// summary is the counts in one line.
func (r *report) summary() string {
	return fmt.Sprintf("%d ok, %d limit, %d skip, %d failed", r.counts[outOK], r.counts[outLimit], r.counts[outSkip], r.counts[outFail])
}
