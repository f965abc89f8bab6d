package pool_test

import (
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// The config is capped in size and depth (issue 44, finding 7): the
// review's 72 KB document nested 12,000 deep took 150 MB to parse.
func TestConfigLimits(t *testing.T) {
	deep := `{"configList": [` + strings.Repeat(`{"x":`, 12000) + `1` + strings.Repeat(`}`, 12000) + `]}`
	require.InDelta(t, 72_000, len(deep), 1_000)
	padded := `{"configList": [{"resourceName": "a", "selectors": {"vendors": ["15b3"]}}]}` + strings.Repeat(" ", pool.MaxConfigSize)
	atDepth := func(n int) string { // n nested lists inside the entry's selectors
		return `{"configList": [{"resourceName": "a", "selectors": {"vendors": ` + strings.Repeat(`[`, n) + strings.Repeat(`]`, n) + `}}]}`
	}
	for _, tc := range []struct {
		name, data string
		err        string // "" parses past the limits (it may fail on content)
	}{
		{"72 KB nested 12,000 deep", deep, "nested deeper than 16 objects and lists"},
		{"over the size limit", padded, "bytes, the limit is 655360"},
		{"lists nested 17 deep", atDepth(13), "nested deeper than 16"},
		{"at the depth limit", atDepth(12), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			_, err := pool.Parse([]byte(tc.data))
			runtime.ReadMemStats(&after)
			if tc.err == "" {
				require.NotErrorIs(t, err, pool.ErrConfigTooLarge)
				return
			}
			require.ErrorIs(t, err, pool.ErrConfigTooLarge)
			require.ErrorContains(t, err, tc.err)
			alloc := after.TotalAlloc - before.TotalAlloc
			t.Logf("refused after %d KiB allocated", alloc>>10)
			require.Less(t, alloc, uint64(4<<20), "refusing must not cost what parsing did")
		})
	}

	// Load reads no more than the limit and a byte of a larger file.
	path := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(path, []byte(padded+strings.Repeat(" ", 4<<20)), 0o644))
	_, err := pool.Load(path)
	require.ErrorIs(t, err, pool.ErrConfigTooLarge)
	require.ErrorContains(t, err, "655361 bytes")

	// Every real config is well inside both limits.
	files, err := filepath.Glob(filepath.Join("..", "..", "testdata", "config", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	for _, f := range files {
		_, err := pool.Load(f)
		require.NoError(t, err, f)
	}
}
