package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fsnotify/fsnotify"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// The dev watch reports entries coming and going, and the directory
// itself going, named as fsnotify names them; writes and mode changes of
// an entry make no event (the event after them is the next entry's).
func TestDirWatch(t *testing.T) {
	dir := t.TempDir()
	sub := filepath.Join(dir, "infiniband")
	require.NoError(t, os.Mkdir(sub, 0o755))
	w, err := newDirWatch()
	require.NoError(t, err)
	defer w.close()
	require.NoError(t, w.add(dir))
	require.NoError(t, w.add(sub))
	// What the kernel holds for each watch: no event on an entry itself
	// (a write, a mode change, an open), whose watch would walk every
	// entry of the directory when added.
	masks := inotifyMasks(t, w.fd)
	require.Len(t, masks, 2)
	for _, m := range masks {
		require.Zero(t, m&(unix.IN_MODIFY|unix.IN_ATTRIB|unix.IN_ACCESS|unix.IN_OPEN|unix.IN_CLOSE_WRITE|unix.IN_CLOSE_NOWRITE), "mask %#x", m)
		require.NotZero(t, m&unix.IN_CREATE, "mask %#x", m)
	}
	next := func() fsnotify.Event {
		t.Helper()
		select {
		case ev := <-w.events:
			return ev
		case err := <-w.errors:
			t.Fatalf("watch error: %v", err)
		case <-time.After(5 * time.Second):
			t.Fatal("no event in 5 s")
		}
		return fsnotify.Event{}
	}
	want := func(name string, op fsnotify.Op) {
		t.Helper()
		require.Equal(t, fsnotify.Event{Name: name, Op: op}, next())
	}

	uverbs := filepath.Join(sub, "uverbs0")
	require.NoError(t, os.WriteFile(uverbs, nil, 0o600))
	want(uverbs, fsnotify.Create)
	require.NoError(t, os.WriteFile(uverbs, []byte("x"), 0o600))
	require.NoError(t, os.Chmod(uverbs, 0o666))
	require.NoError(t, os.Chtimes(uverbs, time.Now(), time.Now()))
	require.NoError(t, os.Rename(uverbs, uverbs+"x"))
	want(uverbs, fsnotify.Rename)
	want(uverbs+"x", fsnotify.Create)
	require.NoError(t, os.Remove(uverbs+"x"))
	want(uverbs+"x", fsnotify.Remove)

	// The directory goes: its own watch says so, and its parent's.
	require.NoError(t, os.Remove(sub))
	got := []fsnotify.Event{next(), next()}
	require.ElementsMatch(t, []fsnotify.Event{{Name: sub, Op: fsnotify.Remove}, {Name: sub, Op: fsnotify.Remove}}, got)
	// Made anew, it is watched again with add.
	require.NoError(t, os.Mkdir(sub, 0o755))
	want(sub, fsnotify.Create)
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return len(w.dirs) == 1 // the old watch is gone (IN_IGNORED)
	}, 5*time.Second, 10*time.Millisecond)
	require.NoError(t, w.add(sub))
	issm := filepath.Join(sub, "issm0")
	require.NoError(t, os.WriteFile(issm, nil, 0o600))
	want(issm, fsnotify.Create)

	w.close()
	w.close()
	require.ErrorIs(t, w.add(dir), fsnotify.ErrClosed)
}

// inotifyMasks are the masks of the inotify instance fd's watches, as
// /proc/self/fdinfo lists them.
func inotifyMasks(t *testing.T, fd int) []uint64 {
	t.Helper()
	info, err := os.ReadFile(fmt.Sprintf("/proc/self/fdinfo/%d", fd))
	require.NoError(t, err)
	var masks []uint64
	for _, line := range strings.Split(string(info), "\n") {
		if !strings.HasPrefix(line, "inotify ") {
			continue
		}
		for _, f := range strings.Fields(line) {
			if v, ok := strings.CutPrefix(f, "mask:"); ok {
				m, err := strconv.ParseUint(v, 16, 32)
				require.NoError(t, err, line)
				masks = append(masks, m)
			}
		}
	}
	return masks
}

// A directory that is not there is an error naming it.
func TestDirWatchMissing(t *testing.T) {
	w, err := newDirWatch()
	require.NoError(t, err)
	defer w.close()
	missing := filepath.Join(t.TempDir(), "dev")
	err = w.add(missing)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.ErrorContains(t, err, missing)
}
