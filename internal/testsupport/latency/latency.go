// Package latency reports the percentiles of per-operation samples from a
// benchmark, as b.ReportMetric units that make bench puts in its table.
package latency

import (
	"slices"
	"testing"
	"time"
)

// MinSamples is how many operations a latency benchmark times at least,
// whatever b.N is, so that p99 stands on enough samples.
const MinSamples = 1000

// Samples are one duration per operation.
type Samples []time.Duration

// Percentile is the p-th percentile (nearest rank); 0 for no samples.
func (s Samples) Percentile(p float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	sorted := slices.Clone(s)
	slices.Sort(sorted)
	i := int(p/100*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Report adds p50-µs and p99-µs to b's results; no samples is a failure.
func (s Samples) Report(b *testing.B) {
	b.Helper()
	if len(s) == 0 {
		b.Fatal("no latency samples")
	}
	b.ReportMetric(float64(s.Percentile(50).Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(s.Percentile(99).Nanoseconds())/1e3, "p99-µs")
}

// Measure times op b.N times (at least MinSamples: the ones past b.N run
// with the timer stopped, so ns/op stays the mean of b.N) and reports the
// percentiles. op returns the duration of its own operation.
func Measure(b *testing.B, op func() time.Duration) {
	b.Helper()
	s := make(Samples, 0, max(b.N, MinSamples))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		s = append(s, op())
	}
	b.StopTimer()
	for len(s) < MinSamples {
		s = append(s, op())
	}
	s.Report(b)
}
