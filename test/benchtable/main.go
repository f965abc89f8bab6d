// Command benchtable turns `go test -bench` output on stdin into one
// Markdown table: a row per benchmark, a column per unit (ns/op, B/op,
// allocs/op and every b.ReportMetric unit), with the machine and date on
// top. Lines that are not benchmark results pass through to stderr, so a
// failing benchmark is still seen.
//
// A benchmark that measures itself against a floor in the same run
// reports x-<floor>, the ratio, and beside it <floor>-<unit> for one of
// its own units (the floor's figure) and, if it has one, goal-x-<floor>.
// Those rows come again in a second table, each as the measure, fastpath's
// figure, the floor's, the ratio and the goal.
//
//	go test -run '^$' -bench . -benchmem ./... | go run ./test/benchtable
package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"
)

type row struct {
	pkg, name string
	values    map[string]string
	nums      map[string]float64
}

func main() {
	if err := run(os.Stdin, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out, errOut io.Writer) error {
	var rows []row
	var units []string
	seen := map[string]bool{}
	pkg, cpu := "", ""
	failed := false
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "pkg: "):
			pkg = strings.TrimPrefix(line, "pkg: ")
			continue
		case strings.HasPrefix(line, "cpu: "):
			// Go pads the model name as the kernel gives it.
			cpu = strings.TrimSpace(strings.TrimPrefix(line, "cpu: "))
			continue
		case strings.HasPrefix(line, "Benchmark"):
			if r, ok := parse(line); ok {
				r.pkg = pkg
				for u := range r.values {
					if !seen[u] {
						seen[u] = true
						units = append(units, u)
					}
				}
				rows = append(rows, r)
				continue
			}
		case strings.HasPrefix(line, "FAIL"), strings.HasPrefix(line, "--- FAIL"):
			failed = true
		}
		if strings.TrimSpace(line) != "" && line != "PASS" && !strings.HasPrefix(line, "ok ") && !strings.HasPrefix(line, "?") &&
			!strings.HasPrefix(line, "goos: ") && !strings.HasPrefix(line, "goarch: ") {
			fmt.Fprintln(errOut, line)
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	order := []string{"ns/op", "B/op", "allocs/op"}
	var cols []string
	for _, u := range order {
		if seen[u] {
			cols = append(cols, u)
		}
	}
	// The rest in name order: packages benchmark in parallel, so the
	// order units are first seen in changes from run to run.
	sort.Strings(units)
	for _, u := range units {
		if u != "ns/op" && u != "B/op" && u != "allocs/op" {
			cols = append(cols, u)
		}
	}
	host, _ := os.Hostname()
	fmt.Fprintf(out, "%s, %s, %d CPUs (%s), %s %s/%s, host %s\n\n", time.Now().UTC().Format("2006-01-02"),
		cpuOr(cpu), runtime.NumCPU(), "GOMAXPROCS "+strconv.Itoa(runtime.GOMAXPROCS(0)), runtime.Version(), runtime.GOOS, runtime.GOARCH, host)
	fmt.Fprintf(out, "| package | benchmark | %s |\n", strings.Join(cols, " | "))
	fmt.Fprintf(out, "|---|---|%s\n", strings.Repeat("---:|", len(cols)))
	for _, r := range rows {
		var vals []string
		for _, c := range cols {
			v := r.values[c]
			if v == "" {
				v = "–"
			}
			vals = append(vals, v)
		}
		fmt.Fprintf(out, "| %s | %s | %s |\n", shortPkg(r.pkg), r.name, strings.Join(vals, " | "))
	}
	writeRatios(out, rows)
	if failed {
		return fmt.Errorf("a benchmark failed (see above)")
	}
	if len(rows) == 0 {
		return fmt.Errorf("no benchmark results on stdin")
	}
	return nil
}

// parse reads "BenchmarkX/y-2  20  123 ns/op  4 B/op  5 foo".
func parse(line string) (row, bool) {
	f := strings.Fields(line)
	if len(f) < 4 || len(f)%2 != 0 {
		return row{}, false
	}
	if _, err := strconv.Atoi(f[1]); err != nil {
		return row{}, false
	}
	name := strings.TrimPrefix(f[0], "Benchmark")
	if i := strings.LastIndexByte(name, '-'); i > 0 {
		if _, err := strconv.Atoi(name[i+1:]); err == nil {
			name = name[:i]
		}
	}
	r := row{name: name, values: map[string]string{}, nums: map[string]float64{}}
	for i := 2; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i], 64)
		if err != nil {
			return row{}, false
		}
		r.values[f[i+1]] = format(v)
		r.nums[f[i+1]] = v
	}
	return r, true
}

func format(v float64) string {
	switch {
	case v >= 1000:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

func shortPkg(p string) string { return strings.TrimPrefix(p, "github.com/fastpath-k8s/fastpath/") }

func cpuOr(c string) string {
	if c == "" {
		return "unknown CPU"
	}
	return c
}
