package main

import (
	"io/fs"
	"os"
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
	require.Equal(t, startLimit(os.ReadFile), memoryLimit())
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

// The start's limit is half the cgroup's memory limit where that is below
// twice startMemoryLimit, read as cgroup v1 and v2 lay it out, with or
// without the group's path visible; startMemoryLimit when there is none.
func TestStartLimit(t *testing.T) {
	const v1 = "12:pids:/kubepods/pod1/c1\n4:memory:/kubepods/pod1/c1\n1:name=systemd:/kubepods/pod1/c1\n0::/\n"
	const v2 = "0::/kubepods.slice/pod1/c1\n"
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  int64
	}{
		{"v1, at the group's path", map[string]string{"/proc/self/cgroup": v1,
			"/sys/fs/cgroup/memory/kubepods/pod1/c1/memory.limit_in_bytes": "25165824\n"}, 12 << 20},
		{"v1, the group at the root (a container's view)", map[string]string{"/proc/self/cgroup": v1,
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "25165824\n"}, 12 << 20},
		{"v1, no limit", map[string]string{"/proc/self/cgroup": v1,
			"/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n"}, startMemoryLimit},
		{"v2, at the group's path", map[string]string{"/proc/self/cgroup": v2,
			"/sys/fs/cgroup/kubepods.slice/pod1/c1/memory.max": "16777216\n"}, 8 << 20},
		{"v2, the group at the root", map[string]string{"/proc/self/cgroup": "0::/\n",
			"/sys/fs/cgroup/memory.max": "16777216\n"}, 8 << 20},
		{"v2, max", map[string]string{"/proc/self/cgroup": v2,
			"/sys/fs/cgroup/kubepods.slice/pod1/c1/memory.max": "max\n"}, startMemoryLimit},
		{"a limit below twice the start's", map[string]string{"/proc/self/cgroup": v2,
			"/sys/fs/cgroup/kubepods.slice/pod1/c1/memory.max": "50331648\n"}, 24 << 20},
		{"a limit above twice the start's", map[string]string{"/proc/self/cgroup": v2,
			"/sys/fs/cgroup/kubepods.slice/pod1/c1/memory.max": "268435456\n"}, startMemoryLimit},
		{"garbage", map[string]string{"/proc/self/cgroup": v2,
			"/sys/fs/cgroup/kubepods.slice/pod1/c1/memory.max": "lots\n"}, startMemoryLimit},
		{"no memory controller", map[string]string{"/proc/self/cgroup": "3:cpu:/\n"}, startMemoryLimit},
		{"no /proc", map[string]string{}, startMemoryLimit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			read := func(name string) ([]byte, error) {
				if s, ok := tc.files[name]; ok {
					return []byte(s), nil
				}
				return nil, fs.ErrNotExist
			}
			require.Equal(t, tc.want, startLimit(read))
		})
	}
}
