package netns

import (
	"fmt"
	"runtime"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NS is an open network namespace with a netlink handle in it.
type NS struct {
	ns ns.NetNS
	h  *netlink.Handle
	// current: opened by Current, so handles are made without setns.
	current bool
}

// Open opens the namespace at path (a /proc/<pid>/ns/net or a bind mount
// under /var/run/netns).
func Open(path string) (*NS, error) {
	n, err := ns.GetNS(path)
	if err != nil {
		return nil, fmt.Errorf("netns %s: %w", path, err)
	}
	return wrap(n)
}

// Current opens the calling thread's namespace (the host's, for a CNI
// plugin). Its handle is made without entering the namespace (the caller is
// in it already), so an unprivileged process can open and read its own.
func Current() (*NS, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n, err := ns.GetCurrentNS()
	if err != nil {
		return nil, fmt.Errorf("netns: open current: %w", err)
	}
	h, err := netlink.NewHandle(unix.NETLINK_ROUTE)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("netns %s: netlink handle: %w", n.Path(), err)
	}
	return &NS{ns: n, h: h, current: true}, nil
}

// IsCurrent reports whether path names the calling thread's network
// namespace (a CNI_NETNS of /proc/self/ns/net, say): the same nsfs inode.
func IsCurrent(path string) (bool, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var want, self unix.Stat_t
	if err := unix.Stat(path, &want); err != nil {
		return false, fmt.Errorf("netns %s: %w", path, err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &self); err != nil {
		return false, fmt.Errorf("netns: own namespace: %w", err)
	}
	return want.Dev == self.Dev && want.Ino == self.Ino, nil
}

func wrap(n ns.NetNS) (*NS, error) {
	h, err := netlink.NewHandleAt(vnetns.NsHandle(int(n.Fd())), unix.NETLINK_ROUTE)
	if err != nil {
		n.Close()
		return nil, fmt.Errorf("netns %s: netlink handle: %w", n.Path(), err)
	}
	return &NS{ns: n, h: h}, nil
}

// Handle is the rtnetlink handle in the namespace.
func (n *NS) Handle() *netlink.Handle { return n.h }

// NewHandle opens a netlink handle in the namespace for other netlink
// families (unix.NETLINK_RDMA, say); the caller closes it.
func (n *NS) NewHandle(families ...int) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if n.current {
		runtime.LockOSThread()
		h, err = netlink.NewHandle(families...)
		runtime.UnlockOSThread()
	} else {
		h, err = netlink.NewHandleAt(vnetns.NsHandle(n.Fd()), families...)
	}
	if err != nil {
		return nil, fmt.Errorf("netns %s: netlink handle: %w", n.Path(), err)
	}
	return h, nil
}

// Fd is the namespace's file descriptor.
func (n *NS) Fd() int { return int(n.ns.Fd()) }

// Path is the path the namespace was opened from.
func (n *NS) Path() string { return n.ns.Path() }

// Do runs f on a thread switched into the namespace (for code that only
// works in the current namespace, such as sockets and sysctls).
func (n *NS) Do(f func() error) error {
	return n.ns.Do(func(ns.NetNS) error { return f() })
}

// Close releases the handle and the namespace.
func (n *NS) Close() error {
	n.h.Close()
	return n.ns.Close()
}
