package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// Temporaries finds what a write cut short left, by file or by pattern,
// and nothing a finished Write made.
func TestTemporaries(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.json"), filepath.Join(dir, "b.json")
	require.NoError(t, Write(a, []byte("{}"), 0o600))
	left, err := Temporaries(a)
	require.NoError(t, err)
	require.Empty(t, left, "a finished Write leaves no temporary")

	// What a kill between CreateTemp and Rename leaves.
	for _, p := range []string{a, b} {
		f, err := os.CreateTemp(dir, tempPattern(filepath.Base(p)))
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, ".c.json.tmp-1"), nil, 0o600))
	left, err = Temporaries(a)
	require.NoError(t, err)
	require.Len(t, left, 1)
	require.Regexp(t, `/\.a\.json\.tmp-[0-9]+$`, left[0])
	left, err = Temporaries(filepath.Join(dir, "[ab].json"))
	require.NoError(t, err)
	require.Len(t, left, 2)
}
