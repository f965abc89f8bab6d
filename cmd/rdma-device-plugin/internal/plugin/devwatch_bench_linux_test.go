package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"
)

// BenchmarkDevWatchStart is what setting up the /dev/infiniband watch
// costs a start on a node of 1024 VFs (3,072 char devices, their dentries
// cached): dirWatch (entries only) against fsnotify's watch, which also
// asks for writes and mode changes of the entries, so the kernel walks
// every cached entry when the watch is added.
func BenchmarkDevWatchStart(b *testing.B) {
	dir := b.TempDir()
	for i := range 3072 {
		p := filepath.Join(dir, fmt.Sprintf("uverbs%d", i))
		require.NoError(b, os.WriteFile(p, nil, 0o600))
		_, err := os.Stat(p)
		require.NoError(b, err)
	}
	b.Run("watch=dirwatch", func(b *testing.B) {
		for b.Loop() {
			w, err := newDirWatch()
			require.NoError(b, err)
			require.NoError(b, w.add(dir))
			w.close()
		}
	})
	b.Run("watch=fsnotify", func(b *testing.B) {
		for b.Loop() {
			w, err := fsnotify.NewWatcher()
			require.NoError(b, err)
			require.NoError(b, w.Add(dir))
			require.NoError(b, w.Close())
		}
	})
}
