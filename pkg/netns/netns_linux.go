package netns

import (
	"errors"
	"fmt"
	"net"
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

// Temp creates an empty namespace that lives until Close.
func Temp() (*NS, error) {
	n, err := ns.TempNetNS()
	if err != nil {
		return nil, fmt.Errorf("netns: create temporary: %w", err)
	}
	return wrap(n)
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

// LinkConfig is what Move sets on a link while it is in the temporary
// namespace. Zero values leave the attribute alone.
type LinkConfig struct {
	Name  string           // new name; "" keeps the name
	MAC   net.HardwareAddr // new MAC
	MTU   int              // new MTU
	Alias *string          // new alias ("" clears it)
}

// ErrLinkNotFound is returned when the link to move is not in the source
// namespace.
var ErrLinkNotFound = errors.New("link not found")

// Move moves the link named name from one namespace to another through a
// temporary namespace, applying cfg on the way. On error, every step done
// is undone and the link is back in from under its name, MAC and MTU. The
// link is left down (moving a link always takes it down); it returns the
// link as seen in to.
func Move(name string, from, to *NS, cfg LinkConfig) (netlink.Link, error) {
	tmp, err := Temp()
	if err != nil {
		return nil, err
	}
	// Closing a namespace that still holds the link would destroy a
	// virtual link and send a physical one to the initial namespace: the
	// rollbacks in MoveVia run before this.
	defer tmp.Close()
	return MoveVia(name, from, tmp, to, cfg)
}

// MoveVia is Move through the namespace via, which the caller made for this
// one move (Temp or Pin) and which holds no other link. from may be via
// itself: the link is finished from there (a move a killed process left
// half-done). On error the link is back in from, as in Move.
func MoveVia(name string, from, via, to *NS, cfg LinkConfig) (_ netlink.Link, err error) {
	link, err := from.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("%s in %s: %w", name, from.Path(), ErrLinkNotFound)
		}
		return nil, fmt.Errorf("look up %s in %s: %w", name, from.Path(), err)
	}
	orig := link.Attrs()
	origMAC, origMTU, origAlias := append(net.HardwareAddr(nil), orig.HardwareAddr...), orig.MTU, orig.Alias

	tmp := via
	if from != via {
		if err = from.h.LinkSetNsFd(link, tmp.Fd()); err != nil {
			return nil, fmt.Errorf("move %s to a temporary netns: %w", name, err)
		}
	}
	cur := name
	defer func() {
		if err == nil {
			return
		}
		if l, lerr := tmp.h.LinkByName(cur); lerr == nil {
			if cur != name {
				_ = tmp.h.LinkSetName(l, name)
			}
			if cfg.MAC != nil && len(origMAC) > 0 {
				_ = tmp.h.LinkSetHardwareAddr(l, origMAC)
			}
			if cfg.MTU != 0 {
				_ = tmp.h.LinkSetMTU(l, origMTU)
			}
			if cfg.Alias != nil {
				_ = tmp.h.LinkSetAlias(l, origAlias)
			}
			if from != via {
				_ = tmp.h.LinkSetNsFd(l, from.Fd())
			}
		}
	}()

	l, err := tmp.h.LinkByName(cur)
	if err != nil {
		return nil, fmt.Errorf("look up %s in the temporary netns: %w", name, err)
	}
	if cfg.Name != "" && cfg.Name != cur {
		if err = tmp.h.LinkSetName(l, cfg.Name); err != nil {
			return nil, fmt.Errorf("rename %s to %s: %w", name, cfg.Name, err)
		}
		cur = cfg.Name
	}
	if cfg.MAC != nil {
		if err = tmp.h.LinkSetHardwareAddr(l, cfg.MAC); err != nil {
			return nil, fmt.Errorf("set MAC %s on %s: %w", cfg.MAC, name, err)
		}
	}
	if cfg.MTU != 0 {
		if err = tmp.h.LinkSetMTU(l, cfg.MTU); err != nil {
			return nil, fmt.Errorf("set MTU %d on %s: %w", cfg.MTU, name, err)
		}
	}
	if cfg.Alias != nil {
		if err = tmp.h.LinkSetAlias(l, *cfg.Alias); err != nil {
			return nil, fmt.Errorf("set alias on %s: %w", name, err)
		}
	}
	if err = tmp.h.LinkSetNsFd(l, to.Fd()); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("move %s into %s: an interface named %s is already there: %w", name, to.Path(), cur, err)
		}
		return nil, fmt.Errorf("move %s into %s: %w", name, to.Path(), err)
	}
	moved, err := to.h.LinkByName(cur)
	if err != nil {
		// The link is in to but cannot be read back: bring it back
		// to the temporary namespace so the rollback can finish.
		if back, lerr := to.h.LinkByIndex(l.Attrs().Index); lerr == nil {
			_ = to.h.LinkSetNsFd(back, tmp.Fd())
		}
		return nil, fmt.Errorf("look up %s in %s after the move: %w", cur, to.Path(), err)
	}
	return moved, nil
}
