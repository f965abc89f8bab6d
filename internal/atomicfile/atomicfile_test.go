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

// WriteAt puts the whole file under its name with its mode, leaves no
// temporary, and replaces a symlink planted at the name instead of
// writing through it.
func TestWriteAt(t *testing.T) {
	dir, outside := t.TempDir(), t.TempDir()
	victim := filepath.Join(outside, "victim")
	require.NoError(t, os.WriteFile(victim, []byte("keep"), 0o600))
	require.NoError(t, os.Symlink(victim, filepath.Join(dir, "f.json")))
	d, err := os.Open(dir)
	require.NoError(t, err)
	defer d.Close()

	require.NoError(t, WriteAt(d, "f.json", []byte(`{"a":1}`), 0o444))
	fi, err := os.Lstat(filepath.Join(dir, "f.json"))
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular(), "the link is replaced by the file")
	require.Equal(t, os.FileMode(0o444), fi.Mode().Perm())
	b, err := os.ReadFile(filepath.Join(dir, "f.json"))
	require.NoError(t, err)
	require.Equal(t, `{"a":1}`, string(b))
	b, err = os.ReadFile(victim)
	require.NoError(t, err)
	require.Equal(t, "keep", string(b), "nothing written through the link")
	left, err := Temporaries(filepath.Join(dir, "f.json"))
	require.NoError(t, err)
	require.Empty(t, left)
}
