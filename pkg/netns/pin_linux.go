package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"
)

// ErrNotPin marks a path that OpenPin refuses: not a namespace bound to a
// file (a symlink, a regular file, a directory, another filesystem's file,
// another kind of namespace), or the caller's own network namespace.
var ErrNotPin = errors.New("not a pinned network namespace")

// OpenPin opens the network namespace bound to the file path, as fastpath's
// CNI pinned one per move in versions before MoveTo, and nothing else: the
// path is never followed (O_NOFOLLOW), and what it names must be a file on
// nsfs (statfs f_type NSFS_MAGIC, include/uapi/linux/magic.h) that is a
// network namespace (NS_GET_NSTYPE, fs/nsfs.c) other than the caller's
// own. Whatever else is there is refused with ErrNotPin: a symlink to the
// host's namespace is never taken for a pod's or a temporary one.
func OpenPin(path string) (*NS, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("netns %s: %w: a symlink", path, ErrNotPin)
	case err != nil:
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	defer unix.Close(fd)
	var sfs unix.Statfs_t
	if err := unix.Fstatfs(fd, &sfs); err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	if sfs.Type != unix.NSFS_MAGIC {
		return nil, fmt.Errorf("netns %s: %w: not a namespace bind mount (filesystem type %#x)", path, ErrNotPin, sfs.Type)
	}
	if t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return nil, fmt.Errorf("netns %s: %w: not a network namespace", path, ErrNotPin)
	}
	own, err := IsCurrent("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, err
	}
	if own {
		return nil, fmt.Errorf("netns %s: %w: it is this process's own network namespace", path, ErrNotPin)
	}
	// The descriptor's magic link reopens the very file checked above.
	n, err := ns.GetNS("/proc/self/fd/" + strconv.Itoa(fd))
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	return wrap(n)
}

// Unpin releases a namespace bound to the file path (as fastpath's CNI
// pinned one per move in versions before MoveTo) and removes the file. A
// path that does not exist, or is not (or no longer) a mount, is fine; a
// symlink is removed, never followed. Links still in the namespace go with
// it — the kernel destroys virtual ones and sends physical ones to the
// initial namespace — so move them out first.
func Unpin(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err == nil && fi.Mode()&fs.ModeSymlink == 0 {
		var sfs unix.Statfs_t
		if err := unix.Statfs(path, &sfs); err == nil && sfs.Type == unix.NSFS_MAGIC {
			if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil && !errors.Is(err, unix.EINVAL) {
				return fmt.Errorf("netns: unpin %s: %w", path, err)
			}
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
