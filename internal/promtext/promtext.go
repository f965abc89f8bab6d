// Package promtext keeps a handful of Prometheus metrics (counters, gauges
// and histograms, with labels) and serves them in the Prometheus text
// exposition format, version 0.0.4, as client_golang's registry and
// promhttp write it for the same metrics: families sorted by name, each
// with its HELP and TYPE lines, series sorted by their label values,
// labels by name, values as strconv 'g' formats them. Families with no
// series are left out.
//
// It exists so that the lean device plugin need not link
// client_golang, whose package init (its default registry's process and
// Go collectors, procfs, the protobuf data model) costs more page faults
// and allocations at every start than the plugin's eight families are
// worth. It does not negotiate formats (no protobuf, no OpenMetrics, no
// gzip): the text format is the one every Prometheus scraper accepts.
package promtext

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// ContentType is what Handler answers with: the text format, 0.0.4.
const ContentType = "text/plain; version=0.0.4; charset=utf-8"

// Registry holds metric families. The zero value is empty and ready.
type Registry struct {
	mu       sync.Mutex // guards everything below, and every family's series
	families []*Family
}

// Family is one metric family: a name, a type and its series, one per
// set of label values.
type Family struct {
	reg        *Registry
	name, help string
	typ        string   // "counter", "gauge" or "histogram"
	labels     []string // label names, sorted
	order      []int    // order[i]: the index, in the caller's order, of labels[i]
	buckets    []float64
	series     map[string]*series
}

// series is one labelled series of a family.
type series struct {
	values []string // label values, in the order of Family.labels
	value  float64  // counter or gauge
	counts []uint64 // histogram: observations per bucket (not cumulative)
	sum    float64
	count  uint64
}

// Counter adds a counter family; labels name its labels.
func (r *Registry) Counter(name, help string, labels ...string) *Family {
	return r.add(name, help, "counter", nil, labels)
}

// Gauge adds a gauge family.
func (r *Registry) Gauge(name, help string, labels ...string) *Family {
	return r.add(name, help, "gauge", nil, labels)
}

// Histogram adds a histogram family with the given upper bucket bounds
// (increasing; the +Inf bucket is implied).
func (r *Registry) Histogram(name, help string, buckets []float64, labels ...string) *Family {
	ok := len(buckets) > 0 && !math.IsInf(buckets[len(buckets)-1], +1)
	for i := 1; ok && i < len(buckets); i++ {
		ok = buckets[i-1] < buckets[i]
	}
	if !ok {
		panic(fmt.Sprintf("promtext: histogram %s: buckets %v: want finite, strictly increasing bounds", name, buckets))
	}
	if slices.Contains(labels, "le") {
		panic(fmt.Sprintf("promtext: histogram %s: label \"le\" is reserved for its buckets", name))
	}
	return r.add(name, help, "histogram", slices.Clone(buckets), labels)
}

// ExponentialBuckets are count bounds starting at start, each factor times
// the one before (as client_golang computes them).
func ExponentialBuckets(start, factor float64, count int) []float64 {
	if count < 1 || start <= 0 || factor <= 1 {
		panic(fmt.Sprintf("promtext: exponential buckets (%g, %g, %d): want start > 0, factor > 1, count ≥ 1", start, factor, count))
	}
	out := make([]float64, count)
	for i := range out {
		out[i] = start
		start *= factor
	}
	return out
}

func (r *Registry) add(name, help, typ string, buckets []float64, labels []string) *Family {
	if !validName(name, true) {
		panic(fmt.Sprintf("promtext: metric name %q: want [a-zA-Z_:][a-zA-Z0-9_:]*", name))
	}
	for i, l := range labels {
		if !validName(l, false) || strings.HasPrefix(l, "__") {
			panic(fmt.Sprintf("promtext: %s: label name %q: want [a-zA-Z_][a-zA-Z0-9_]*, not starting with __", name, l))
		}
		if slices.Contains(labels[:i], l) {
			panic(fmt.Sprintf("promtext: %s: label %q twice", name, l))
		}
	}
	f := &Family{reg: r, name: name, help: help, typ: typ, buckets: buckets, series: map[string]*series{}}
	f.order = make([]int, len(labels))
	for i := range f.order {
		f.order[i] = i
	}
	slices.SortFunc(f.order, func(a, b int) int { return strings.Compare(labels[a], labels[b]) })
	for _, i := range f.order {
		f.labels = append(f.labels, labels[i])
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.families {
		if g.name == name {
			panic(fmt.Sprintf("promtext: metric %s registered twice", name))
		}
	}
	r.families = append(r.families, f)
	if len(labels) == 0 {
		f.get(nil) // an unlabelled metric is exported from the start (0), as client_golang's is
	}
	return f
}

// validName: a metric name (colons allowed) or a label name.
func validName(s string, metric bool) bool {
	if s == "" {
		return false
	}
	for i, c := range []byte(s) {
		ok := c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || (metric && c == ':') || (i > 0 && c >= '0' && c <= '9')
		if !ok {
			return false
		}
	}
	return true
}

// get returns the series of values (in the caller's label order), made if
// new; r.mu is held.
func (f *Family) get(values []string) *series {
	if len(values) != len(f.labels) {
		panic(fmt.Sprintf("promtext: %s: %d label values for %d labels %v", f.name, len(values), len(f.labels), f.labels))
	}
	sorted := make([]string, len(values))
	for i, j := range f.order {
		sorted[i] = values[j]
	}
	key := strings.Join(sorted, "\xff")
	s := f.series[key]
	if s == nil {
		s = &series{values: sorted}
		if f.typ == "histogram" {
			s.counts = make([]uint64, len(f.buckets))
		}
		f.series[key] = s
	}
	return s
}

// Set sets a gauge's series.
func (f *Family) Set(v float64, values ...string) {
	f.must("gauge", "Set")
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	f.get(values).value = v
}

// Add adds v to a counter's or a gauge's series; a counter does not go
// down (v < 0 panics, as client_golang's does).
func (f *Family) Add(v float64, values ...string) {
	if f.typ == "counter" && v < 0 {
		panic(fmt.Sprintf("promtext: counter %s cannot decrease (Add %g)", f.name, v))
	}
	if f.typ == "histogram" {
		f.must("counter or gauge", "Add")
	}
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	f.get(values).value += v
}

// Observe records one observation in a histogram's series.
func (f *Family) Observe(v float64, values ...string) {
	f.must("histogram", "Observe")
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	s := f.get(values)
	if i, _ := slices.BinarySearch(f.buckets, v); i < len(s.counts) {
		s.counts[i]++ // the first bound ≥ v: a bucket holds v ≤ le
	}
	s.sum += v
	s.count++
}

// Delete removes a series; it reports whether there was one.
func (f *Family) Delete(values ...string) bool {
	f.reg.mu.Lock()
	defer f.reg.mu.Unlock()
	if len(values) != len(f.labels) {
		return false
	}
	sorted := make([]string, len(values))
	for i, j := range f.order {
		sorted[i] = values[j]
	}
	key := strings.Join(sorted, "\xff")
	_, ok := f.series[key]
	delete(f.series, key)
	return ok
}

func (f *Family) must(typ, op string) {
	if !strings.Contains(typ, f.typ) {
		panic(fmt.Sprintf("promtext: %s on %s %s", op, f.typ, f.name))
	}
}

// WriteTo writes every family that has series in the text format. The
// text is built under the registry's lock and written after it: a slow
// reader does not hold up the metrics' updates.
func (r *Registry) WriteTo(w io.Writer) (int64, error) {
	r.mu.Lock()
	fams := slices.Clone(r.families)
	slices.SortFunc(fams, func(a, b *Family) int { return strings.Compare(a.name, b.name) })
	var buf []byte
	for _, f := range fams {
		if len(f.series) > 0 {
			buf = f.appendText(buf)
		}
	}
	r.mu.Unlock()
	n, err := w.Write(buf)
	return int64(n), err
}

// appendText appends the family's lines; r.mu is held.
func (f *Family) appendText(b []byte) []byte {
	b = append(b, "# HELP "...)
	b = append(b, f.name...)
	b = append(b, ' ')
	b = appendEscaped(b, f.help, false)
	b = append(b, "\n# TYPE "...)
	b = append(b, f.name...)
	b = append(b, ' ')
	b = append(b, f.typ...)
	b = append(b, '\n')
	all := make([]*series, 0, len(f.series))
	for _, s := range f.series {
		all = append(all, s)
	}
	slices.SortFunc(all, func(x, y *series) int { return slices.Compare(x.values, y.values) })
	for _, s := range all {
		if f.typ != "histogram" {
			b = f.appendSample(b, "", s.values, "", s.value, 0, false)
			continue
		}
		var cum uint64
		for i, le := range f.buckets {
			cum += s.counts[i]
			b = f.appendSample(b, "_bucket", s.values, strconv.FormatFloat(le, 'g', -1, 64), 0, cum, true)
		}
		b = f.appendSample(b, "_bucket", s.values, "+Inf", 0, s.count, true)
		b = f.appendSample(b, "_sum", s.values, "", s.sum, 0, false)
		b = f.appendSample(b, "_count", s.values, "", 0, s.count, true)
	}
	return b
}

// appendSample appends one sample line: name+suffix, the labels (and le,
// last, when not ""), and the float value or, if isCount, the count.
func (f *Family) appendSample(b []byte, suffix string, values []string, le string, v float64, n uint64, isCount bool) []byte {
	b = append(b, f.name...)
	b = append(b, suffix...)
	if len(values) > 0 || le != "" {
		b = append(b, '{')
		for i, name := range f.labels {
			if i > 0 {
				b = append(b, ',')
			}
			b = append(b, name...)
			b = append(b, `="`...)
			b = appendEscaped(b, values[i], true)
			b = append(b, '"')
		}
		if le != "" {
			if len(values) > 0 {
				b = append(b, ',')
			}
			b = append(b, `le="`...)
			b = append(b, le...)
			b = append(b, '"')
		}
		b = append(b, '}')
	}
	b = append(b, ' ')
	if isCount {
		b = strconv.AppendUint(b, n, 10)
	} else {
		b = appendFloat(b, v)
	}
	return append(b, '\n')
}

// appendFloat writes v as the text format does: NaN, +Inf, -Inf, or the
// shortest 'g' form.
func appendFloat(b []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, +1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}

// appendEscaped escapes a backslash and a newline (HELP text) and, in a
// label value, a double quote too.
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			b = append(b, `\\`...)
		case c == '\n':
			b = append(b, `\n`...)
		case c == '"' && quote:
			b = append(b, `\"`...)
		default:
			b = append(b, c)
		}
	}
	return b
}

// Handler serves the registry's metrics.
func (r *Registry) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", ContentType)
		_, _ = r.WriteTo(w) // a scraper that went away: nothing to do
	})
}
