package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"runtime"

	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Pin creates an empty network namespace bound to path, a new file
// (never one that exists, never through a symlink), so that it lives until
// Unpin whatever happens to the calling process. A link left in it by a
// process killed mid-move stays there, under the name it had, for the next
// caller to find.
func Pin(path string) (_ *NS, err error) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("netns: pin %s: %w", path, err)
	}
	f.Close()
	defer func() {
		if err != nil {
			_ = Unpin(path)
		}
	}()
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := vnetns.Get()
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("open own netns: %w", err)
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("create: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		err = unix.Mount(src, path, "", unix.MS_BIND, "")
		if err != nil {
			err = fmt.Errorf("bind-mount: %w", err)
		}
		// Back to where the thread was. If that fails, the thread stays
		// locked: a goroutine that exits locked takes its thread with it
		// rather than hand it, in the wrong namespace, to other goroutines.
		if vnetns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		errc <- err
	}()
	if err = <-errc; err != nil {
		return nil, fmt.Errorf("netns: pin %s: %w", path, err)
	}
	return Open(path)
}

// Unpin releases the namespace Pin bound to path and removes the file. A
// path that does not exist, or is not (or no longer) a mount, is fine. Links
// still in the namespace go with it — the kernel destroys virtual ones and
// sends physical ones to the initial namespace — so move them out first.
func Unpin(path string) error {
	var sfs unix.Statfs_t
	err := unix.Statfs(path, &sfs)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err == nil && sfs.Type == unix.NSFS_MAGIC {
		if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("netns: unpin %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("netns: unpin %s: %w", path, err)
	}
	return nil
}

// Links lists the names of the links in the namespace other than loopback.
func (n *NS) Links() ([]string, error) {
	links, err := n.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("netns %s: list links: %w", n.Path(), err)
	}
	var names []string
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback != 0 {
			continue
		}
		names = append(names, l.Attrs().Name)
	}
	return names, nil
}
