package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// BenchmarkDevWatchStart is what setting up the /dev/infiniband watch
// costs a start on a node of 1024 VFs (3,072 char devices, their dentries
// cached). fsnotify's watch asks for writes and mode changes of the
// entries too, so the kernel walks every cached entry when it is added
// (fsnotify_set_children_dentry_flags); docs/benchmarks.md has the figure
// against the entries-only inotify watch it replaced.
func BenchmarkDevWatchStart(b *testing.B) {
	dir := b.TempDir()
	for i := range 3072 {
		p := filepath.Join(dir, fmt.Sprintf("uverbs%d", i))
		require.NoError(b, os.WriteFile(p, nil, 0o600))
		_, err := os.Stat(p)
		require.NoError(b, err)
	}
	for b.Loop() {
		w, err := fsnotify.NewWatcher()
		require.NoError(b, err)
		require.NoError(b, w.Add(dir))
		require.NoError(b, w.Close())
	}
}

// The dev watch counts RDMA char devices coming and going, in
// /dev/infiniband and of /dev/infiniband itself; writes and mode changes
// of a device change nothing the plugin serves.
func TestDevWatch(t *testing.T) {
	root := t.TempDir()
	kubelet := filepath.Join(root, "kubelet")
	ib := filepath.Join(root, rdma.DevDir)
	require.NoError(t, os.MkdirAll(kubelet, 0o755))
	require.NoError(t, os.MkdirAll(ib, 0o755))
	f, err := newFileWatch(&Options{KubeletDir: kubelet, HostRoot: root}, nil)
	require.NoError(t, err)
	defer f.close()
	events, errs := f.devEvents()
	require.NotNil(t, events, "no dev watch")
	own := func(string) bool { return false }
	// until reads events up to name's op, which must be a devChange;
	// every other event before it changes nothing, but for a second
	// removal of name (a directory's comes from its watch and its
	// parent's).
	until := func(name string, op fsnotify.Op) {
		t.Helper()
		for {
			var ev fsnotify.Event
			select {
			case ev = <-events:
			case err := <-errs:
				t.Fatalf("dev watch error: %v", err)
			case <-time.After(5 * time.Second):
				t.Fatalf("no %s of %s in 5 s", op, name)
			}
			c := f.classify(ev, own)
			if ev.Name == name && ev.Has(op) {
				require.Equal(t, devChange, c, ev.String())
				return
			}
			if ev.Name != name || !ev.Has(fsnotify.Remove) {
				require.Equal(t, noChange, c, ev.String())
			}
		}
	}

	uverbs := filepath.Join(ib, "uverbs0")
	require.NoError(t, os.WriteFile(uverbs, nil, 0o600))
	until(uverbs, fsnotify.Create)
	require.NoError(t, os.WriteFile(uverbs, []byte("x"), 0o600))
	require.NoError(t, os.Chmod(uverbs, 0o666))
	require.NoError(t, os.Chtimes(uverbs, time.Now(), time.Now()))
	require.NoError(t, os.Rename(uverbs, uverbs+"x"))
	until(uverbs, fsnotify.Rename) // the writes and mode changes before it count for nothing
	until(uverbs+"x", fsnotify.Create)
	require.NoError(t, os.Remove(uverbs+"x"))
	until(uverbs+"x", fsnotify.Remove)

	// The directory goes with the driver and comes back: watched again.
	require.NoError(t, os.Remove(ib))
	until(ib, fsnotify.Remove)
	require.NoError(t, os.Mkdir(ib, 0o755))
	until(ib, fsnotify.Create)
	issm := filepath.Join(ib, "issm0")
	require.NoError(t, os.WriteFile(issm, nil, 0o600))
	until(issm, fsnotify.Create)
}
