package promtext

import (
	"bytes"
	"math"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
)

// gather is what client_golang's registry writes in the text format (what
// promhttp serves a text scrape).
func gather(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		require.NoError(t, enc.Encode(mf))
	}
	return buf.String()
}

func text(t *testing.T, r *Registry) string {
	t.Helper()
	var buf bytes.Buffer
	n, err := r.WriteTo(&buf)
	require.NoError(t, err)
	require.Equal(t, int64(buf.Len()), n)
	return buf.String()
}

// The same metrics and the same updates, in client_golang and here, are
// written byte for byte the same: order of families, series and labels,
// escaping, number formats, histogram buckets.
func TestSameAsClientGolang(t *testing.T) {
	odd := "a\"b\\c\nd é"
	buckets := ExponentialBuckets(0.0005, 2, 14)
	require.Equal(t, prometheus.ExponentialBuckets(0.0005, 2, 14), buckets)
	for _, tc := range []struct {
		name string
		do   func(*Registry, *prometheus.Registry)
	}{
		{"counter with labels out of order", func(r *Registry, p *prometheus.Registry) {
			c := r.Counter("x_requests_total", "Requests.", "zone", "app")
			pc := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "x_requests_total", Help: "Requests."}, []string{"zone", "app"})
			p.MustRegister(pc)
			for _, s := range [][2]string{{"b", "y"}, {"a", "z"}, {"b", "a"}, {odd, ""}} {
				c.Add(3, s[0], s[1])
				pc.WithLabelValues(s[0], s[1]).Add(3)
			}
			c.Add(0.25, "a", "z")
			pc.WithLabelValues("a", "z").Add(0.25)
		}},
		{"gauges: numbers, help escaping, delete, empty family", func(r *Registry, p *prometheus.Registry) {
			g := r.Gauge("x_value", "Help with \\ and\nnewline \"quoted\".", "k")
			pg := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x_value", Help: "Help with \\ and\nnewline \"quoted\"."}, []string{"k"})
			p.MustRegister(pg)
			for i, v := range []float64{0, 1, -1, 32, 1e21, 1.5e-7, -3.25, math.Inf(1), math.Inf(-1), math.NaN(), 123456789012} {
				k := string(rune('a' + i))
				g.Set(v, k)
				pg.WithLabelValues(k).Set(v)
			}
			g.Add(-2, "b")
			pg.WithLabelValues("b").Add(-2)
			require.True(t, g.Delete("c"))
			require.False(t, g.Delete("nope"))
			pg.DeleteLabelValues("c")
			r.Gauge("x_unset", "Never set.", "k")
			p.MustRegister(prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "x_unset", Help: "Never set."}, []string{"k"}))
			r.Gauge("a_plain", "No labels.").Set(7)
			pp := prometheus.NewGauge(prometheus.GaugeOpts{Name: "a_plain", Help: "No labels."})
			pp.Set(7)
			p.MustRegister(pp)
		}},
		{"const-label style info gauge", func(r *Registry, p *prometheus.Registry) {
			r.Gauge("fastpath_build_info", "Always 1.", "version", "revision", "goversion").Set(1, "v1"+odd, "abc", "go1.26")
			pg := prometheus.NewGauge(prometheus.GaugeOpts{Name: "fastpath_build_info", Help: "Always 1.",
				ConstLabels: prometheus.Labels{"version": "v1" + odd, "revision": "abc", "goversion": "go1.26"}})
			pg.Set(1)
			p.MustRegister(pg)
		}},
		{"histograms", func(r *Registry, p *prometheus.Registry) {
			h := r.Histogram("x_duration_seconds", "Durations.", buckets)
			ph := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x_duration_seconds", Help: "Durations.", Buckets: buckets})
			p.MustRegister(ph)
			hv := r.Histogram("x_size_bytes", "Sizes.", []float64{1, 10, 100}, "pool")
			phv := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "x_size_bytes", Help: "Sizes.", Buckets: []float64{1, 10, 100}}, []string{"pool"})
			p.MustRegister(phv)
			for _, v := range []float64{0, 0.0005, 0.0007, 0.003, 0.004096, 0.5, 4.096, 5, 1000} {
				h.Observe(v)
				ph.Observe(v)
				hv.Observe(v*100, "b")
				phv.WithLabelValues("b").Observe(v * 100)
			}
			hv.Observe(10, "a")
			phv.WithLabelValues("a").Observe(10)
		}},
		{"unlabelled metrics never set", func(r *Registry, p *prometheus.Registry) {
			r.Counter("x_events_total", "Events.")
			p.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "x_events_total", Help: "Events."}))
			r.Gauge("x_level", "Level.")
			p.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "x_level", Help: "Level."}))
		}},
		{"unobserved histogram", func(r *Registry, p *prometheus.Registry) {
			r.Histogram("x_wait_seconds", "Waits.", []float64{0.1, 1})
			p.MustRegister(prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x_wait_seconds", Help: "Waits.", Buckets: []float64{0.1, 1}}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, p := &Registry{}, prometheus.NewRegistry()
			tc.do(r, p)
			want := gather(t, p)
			require.NotEmpty(t, want)
			require.Equal(t, want, text(t, r))
		})
	}
}

func TestHandler(t *testing.T) {
	r := &Registry{}
	r.Counter("x_total", "X.").Add(2)
	rec := httptest.NewRecorder()
	r.Handler().ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	require.Equal(t, 200, rec.Code)
	require.Equal(t, "text/plain; version=0.0.4; charset=utf-8", rec.Header().Get("Content-Type"))
	require.Equal(t, "# HELP x_total X.\n# TYPE x_total counter\nx_total 2\n", rec.Body.String())
}

// Misuse is a programming error, named.
func TestMisusePanics(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		do         func(r *Registry)
	}{
		{"bad metric name", `metric name "1x"`, func(r *Registry) { r.Gauge("1x", "") }},
		{"bad label name", `label name "a-b"`, func(r *Registry) { r.Gauge("x", "", "a-b") }},
		{"reserved label name", `label name "__x"`, func(r *Registry) { r.Gauge("x", "", "__x") }},
		{"label twice", `label "a" twice`, func(r *Registry) { r.Gauge("x", "", "a", "a") }},
		{"registered twice", "x registered twice", func(r *Registry) { r.Gauge("x", ""); r.Counter("x", "") }},
		{"le on a histogram", `label "le" is reserved`, func(r *Registry) { r.Histogram("x", "", []float64{1}, "le") }},
		{"unsorted buckets", "strictly increasing", func(r *Registry) { r.Histogram("x", "", []float64{2, 1}) }},
		{"no buckets", "strictly increasing", func(r *Registry) { r.Histogram("x", "", nil) }},
		{"wrong label count", "1 label values for 2 labels", func(r *Registry) { r.Gauge("x", "", "a", "b").Set(1, "v") }},
		{"counter going down", "cannot decrease", func(r *Registry) { r.Counter("x_total", "").Add(-1) }},
		{"Set on a counter", "Set on counter x_total", func(r *Registry) { r.Counter("x_total", "").Set(1) }},
		{"Observe on a gauge", "Observe on gauge x", func(r *Registry) { r.Gauge("x", "").Observe(1) }},
		{"bad exponential buckets", "want start > 0", func(*Registry) { ExponentialBuckets(0, 2, 3) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func() {
				p := recover()
				require.NotNil(t, p)
				require.Contains(t, p, tc.want)
			}()
			tc.do(&Registry{})
		})
	}
}

// Updates and scrapes from many goroutines (run with -race).
func TestConcurrent(t *testing.T) {
	r := &Registry{}
	c := r.Counter("x_total", "X.", "k")
	h := r.Histogram("x_seconds", "X.", []float64{1})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				c.Add(1, string(rune('a'+i%2)))
				h.Observe(0.5)
				_, _ = r.WriteTo(&strings.Builder{})
			}
		}()
	}
	wg.Wait()
	out := text(t, r)
	require.Contains(t, out, `x_total{k="a"} 400`)
	require.Contains(t, out, "x_seconds_count 800")
}

// blockingWriter signals when Write is entered and blocks until released.
type blockingWriter struct{ entered, release chan struct{} }

func (b blockingWriter) Write(p []byte) (int, error) {
	close(b.entered)
	<-b.release
	return len(p), nil
}

// A scraper that reads slowly does not hold up the metrics' updates, also
// when the text is larger than any buffer on the way.
func TestSlowReaderDoesNotBlockUpdates(t *testing.T) {
	r := &Registry{}
	c := r.Counter("x_total", "X.")
	c.Add(1)
	g := r.Gauge("x_devices", "Devices per resource.", "resource")
	for i := range 1000 {
		g.Set(float64(i), strings.Repeat("r", 20)+strconv.Itoa(i))
	}
	w := blockingWriter{entered: make(chan struct{}), release: make(chan struct{})}
	wrote := make(chan error, 1)
	go func() {
		_, err := r.WriteTo(w)
		wrote <- err
	}()
	<-w.entered
	added := make(chan struct{})
	go func() {
		c.Add(1)
		close(added)
	}()
	select {
	case <-added:
	case <-time.After(10 * time.Second):
		t.Fatal("Add blocked while a reader was being written to")
	}
	close(w.release)
	require.NoError(t, <-wrote)
	require.Contains(t, text(t, r), "x_total 2\n")
}
