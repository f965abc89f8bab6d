package netns

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// Unpin releases a namespace bound to the file path (as fastpath's CNI
// pinned one per move in versions before MoveTo) and removes the file. A
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
