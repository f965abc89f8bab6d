package plugin

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
)

// dirWatch watches directories for entries that come and go (created,
// removed, renamed in or out) and for the directories themselves going,
// and for nothing else: the host's /dev and /dev/infiniband, where RDMA
// char devices appear and disappear with the driver.
//
// fsnotify asks inotify for writes and attribute changes too, and a watch
// for events on a directory's entries makes the kernel walk every cached
// entry of it when it is added (fsnotify_set_children_dentry_flags). A
// node of a thousand VFs has over three thousand char devices in
// /dev/infiniband: 0.3 ms of a start on that walk, for events the plugin
// has no use for (a device's presence is what it serves, not its mode or
// times). Creation, removal and renames are reported on the directory
// itself, so this watch costs no walk.
//
// Events come as fsnotify's, named as it names them (<dir>/<entry>, or
// <dir> for the directory itself), so that one classify serves both
// watches. Events lost (the kernel's queue overflowed) are
// fsnotify.ErrEventOverflow on errors.
type dirWatch struct {
	fd     int // the inotify instance, for inotify_add_watch
	file   *os.File
	events chan fsnotify.Event
	errors chan error
	done   chan struct{}

	mu     sync.Mutex
	closed bool
	dirs   map[int]string // by watch descriptor
}

// dirWatchMask is what dirWatch asks inotify for: entries created, moved
// in, removed and moved out, and the directory itself removed or moved.
const dirWatchMask = unix.IN_CREATE | unix.IN_MOVED_TO | unix.IN_DELETE | unix.IN_MOVED_FROM |
	unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR

func newDirWatch() (*dirWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return nil, os.NewSyscallError("inotify_init1", err)
	}
	w := &dirWatch{
		fd: fd, file: os.NewFile(uintptr(fd), "inotify"),
		events: make(chan fsnotify.Event), errors: make(chan error), done: make(chan struct{}),
		dirs: map[int]string{},
	}
	go w.read()
	return w, nil
}

// add watches dir (again: a directory that was removed and made anew is a
// new watch).
func (w *dirWatch) add(dir string) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return fsnotify.ErrClosed
	}
	wd, err := unix.InotifyAddWatch(w.fd, dir, dirWatchMask)
	if err != nil {
		return &os.PathError{Op: "inotify_add_watch", Path: dir, Err: err}
	}
	w.dirs[wd] = filepath.Clean(dir)
	return nil
}

// close stops the watch; the reader ends and the channels stay open.
func (w *dirWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.closed = true
	close(w.done)
	w.file.Close()
}

// read turns inotify records into events until the watch is closed.
func (w *dirWatch) read() {
	// Room for many records at once: a name is at most NAME_MAX bytes.
	buf := make([]byte, 64*(unix.SizeofInotifyEvent+unix.NAME_MAX+1))
	for {
		n, err := w.file.Read(buf)
		if err != nil {
			if !errors.Is(err, os.ErrClosed) {
				// Not seen: the watch ends, and periodic rescans
				// are what is left.
				w.send(fsnotify.Event{}, fmt.Errorf("read inotify: %w; char devices coming and going are noticed at the next periodic rescan only", err))
			}
			return
		}
		for rest := buf[:n]; len(rest) >= unix.SizeofInotifyEvent; {
			wd := int(int32(binary.NativeEndian.Uint32(rest[0:])))
			mask := binary.NativeEndian.Uint32(rest[4:])
			size := unix.SizeofInotifyEvent + int(binary.NativeEndian.Uint32(rest[12:]))
			if size > len(rest) {
				break // the kernel returns whole records; not seen
			}
			name := string(bytes.TrimRight(rest[unix.SizeofInotifyEvent:size], "\x00"))
			rest = rest[size:]
			if mask&unix.IN_Q_OVERFLOW != 0 {
				// Events were lost: any directory may have changed.
				if !w.send(fsnotify.Event{}, fsnotify.ErrEventOverflow) {
					return
				}
				continue
			}
			ev, ok := w.event(wd, mask, name)
			if ok && !w.send(ev, nil) {
				return
			}
		}
	}
}

// event is the record of watch wd as an event; false for none.
func (w *dirWatch) event(wd int, mask uint32, name string) (fsnotify.Event, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	dir, ok := w.dirs[wd]
	if mask&unix.IN_IGNORED != 0 {
		delete(w.dirs, wd) // the directory went, or the watch was removed
		return fsnotify.Event{}, false
	}
	if !ok {
		return fsnotify.Event{}, false
	}
	ev := fsnotify.Event{Name: dir}
	if name != "" {
		ev.Name = dir + "/" + name
	}
	switch {
	case mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0:
		ev.Op = fsnotify.Create
	case mask&(unix.IN_DELETE|unix.IN_DELETE_SELF) != 0:
		ev.Op = fsnotify.Remove
	case mask&(unix.IN_MOVED_FROM|unix.IN_MOVE_SELF) != 0:
		ev.Op = fsnotify.Rename
	default:
		return fsnotify.Event{}, false
	}
	return ev, true
}

// send hands out an event, or err when not nil; false once the watch is
// closed.
func (w *dirWatch) send(ev fsnotify.Event, err error) bool {
	if err != nil {
		select {
		case w.errors <- err:
			return true
		case <-w.done:
			return false
		}
	}
	select {
	case w.events <- ev:
		return true
	case <-w.done:
		return false
	}
}
