package testnet

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// Soak tests (fault injection: kills, restarts, garbage input, run for a
// while with a leak check after every cycle) are Go tests named TestSoak…
// in any package. They ask Soak for their time budget:
//
//   - `make test` (FASTPATH_SOAK unset): the short budget, as root;
//   - `make soak` (FASTPATH_SOAK=long): the long budget;
//   - FASTPATH_SOAK=off, or go test -short: skipped.
//
// FASTPATH_SOAK_DURATION (a Go duration) overrides either budget. Each test
// also bounds its own cycle count, so a fast machine does not run forever.
const (
	SoakEnv         = "FASTPATH_SOAK"
	SoakDurationEnv = "FASTPATH_SOAK_DURATION"
	// SoakReportEnv names a file each soak test appends its figures to
	// (make soak prints it).
	SoakReportEnv = "FASTPATH_SOAK_REPORT"
)

// Soak returns the test's time budget, or skips it.
func Soak(tb testing.TB, short, long time.Duration) time.Duration {
	tb.Helper()
	mode := os.Getenv(SoakEnv)
	switch {
	case mode == "off":
		tb.Skip(SoakEnv + "=off")
	case testing.Short():
		tb.Skip("soak test: not with -short")
	}
	d := short
	switch mode {
	case "", "short":
	case "long":
		d = long
	default:
		tb.Fatalf("%s=%q: want short, long or off", SoakEnv, mode)
	}
	if s := os.Getenv(SoakDurationEnv); s != "" {
		v, err := time.ParseDuration(s)
		if err != nil || v <= 0 {
			tb.Fatalf("%s=%q: want a positive Go duration, e.g. 10m", SoakDurationEnv, s)
		}
		d = v
	}
	return d
}

// Long reports whether this is a `make soak` run.
func Long() bool { return os.Getenv(SoakEnv) == "long" }

// SoakReport records a soak test's figures as one line,
// "SOAK name: key=value …", in the test log and in the FASTPATH_SOAK_REPORT
// file when set. figures alternate names and values: "cycles", 1000,
// "kills", 310, "leaks", 0, "panics", 0.
func SoakReport(tb testing.TB, name string, figures ...any) {
	tb.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "SOAK %s:", name)
	for i := 0; i+1 < len(figures); i += 2 {
		fmt.Fprintf(&b, " %v=%v", figures[i], figures[i+1])
	}
	line := b.String()
	tb.Log(line)
	if p := os.Getenv(SoakReportEnv); p != "" {
		f, err := os.OpenFile(p, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			tb.Errorf("soak report %s: %v", p, err)
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s %s\n", time.Now().UTC().Format(time.RFC3339), line)
	}
}
