package main

import (
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gcPercent is the collector's GOGC setting now, read without setting it
// (a restore may come from another goroutine meanwhile).
func gcPercent() int { return int(readMetric("/gc/gogc:percent")) }

// memoryLimit is the runtime's memory limit now.
func memoryLimit() int64 { return int64(readMetric("/gc/gomemlimit:bytes")) }

func readMetric(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// A start turns the collector off under its memory limit, and the first
// release (or the bound) puts back what was there, once; a GOGC or
// GOMEMLIMIT the user set is left alone.
func TestDeferCollection(t *testing.T) {
	t.Setenv("GOGC", "")
	t.Setenv("GOMEMLIMIT", "")
	percent, limit := gcPercent(), memoryLimit()

	restore := deferCollection()
	require.Equal(t, -1, gcPercent())
	require.Equal(t, int64(startMemoryLimit), memoryLimit())
	restore()
	require.Equal(t, percent, gcPercent())
	require.Equal(t, limit, memoryLimit())
	// Once: a later release finds the setting of its time.
	debug.SetGCPercent(150)
	restore()
	require.Equal(t, 150, gcPercent())
	debug.SetGCPercent(percent)

	// A second start while the first's collection is off changes
	// nothing: the first's release puts back what was there before
	// both, and the second's, later, does not turn it off again.
	first := deferCollection()
	second := deferCollection()
	require.Equal(t, -1, gcPercent())
	first()
	second()
	require.Equal(t, percent, gcPercent())
	require.Equal(t, limit, memoryLimit())

	// No release: the bound turns it back on.
	old := startCollectionBound
	startCollectionBound = 20 * time.Millisecond
	t.Cleanup(func() { startCollectionBound = old })
	restore = deferCollection()
	require.Equal(t, -1, gcPercent())
	require.Eventually(t, func() bool { return gcPercent() == percent && memoryLimit() == limit }, 5*time.Second, 5*time.Millisecond)
	restore()

	for _, env := range []string{"GOGC", "GOMEMLIMIT"} {
		t.Run(env, func(t *testing.T) {
			t.Setenv(env, map[string]string{"GOGC": "50", "GOMEMLIMIT": "100MiB"}[env])
			restore := deferCollection()
			require.Equal(t, percent, gcPercent())
			require.Equal(t, limit, memoryLimit())
			restore()
		})
	}
}
