package links

import (
	"context"
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Netlink subscribes to RTM_NEWLINK/RTM_DELLINK in a netns (the
// caller's when NS is nil). It needs no capability: the DaemonSet drops
// them all.
type Netlink struct {
	NS *netns.NsHandle
	// OnError is told about a broken subscription (then the channel closes).
	OnError func(error)
}

var _ Source = (*Netlink)(nil)

// Subscribe lists existing links, then streams changes until ctx ends.
//
// The existing links are listed on a socket of their own, not with the
// library's ListExisting: that sends the RTM_GETLINK dump on the
// subscribed socket addressed to the link multicast group, and the kernel
// lets a process send to a NETLINK_ROUTE group only with CAP_NET_ADMIN
// (netlink_sendmsg: NETLINK_ROUTE has no NL_CFG_F_NONROOT_SEND), so
// without it the subscription fails with EPERM. Joining the group and a
// plain dump need no capability. The subscription is made first and its
// events are delivered after the list, so a change made while the list is
// read is applied after it: the last state delivered is the kernel's. A
// list that fails is told to OnError and ends the stream.
func (n *Netlink) Subscribe(ctx context.Context) (<-chan Event, error) {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	opts := netlink.LinkSubscribeOptions{
		Namespace: n.NS,
		ErrorCallback: func(err error) {
			// Closing the subscription on ctx's end fails its pending
			// receive: that is a stop, not a fault.
			if n.OnError != nil && ctx.Err() == nil {
				n.OnError(err)
			}
		},
	}
	if err := netlink.LinkSubscribeWithOptions(updates, done, opts); err != nil {
		return nil, fmt.Errorf("netlink: subscribe to link updates: %w", err)
	}
	out := make(chan Event, 64)
	go func() {
		defer close(out)
		defer close(done)
		send := func(ev Event) bool {
			select {
			case out <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		// Listed here, not before Subscribe returns: a node with many
		// links (a veth per pod) takes a while to dump, and a start
		// need not wait for it.
		existing, err := n.list()
		if err != nil {
			if n.OnError != nil && ctx.Err() == nil {
				n.OnError(fmt.Errorf("netlink: list links: %w", err))
			}
			return
		}
		for _, l := range existing {
			if !send(event(l.Attrs(), false)) {
				return
			}
		}
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-updates:
				if !ok {
					return
				}
				if !send(event(u.Attrs(), u.Header.Type == unix.RTM_DELLINK)) {
					return
				}
			}
		}
	}()
	return out, nil
}

// list dumps the links of the netns.
func (n *Netlink) list() ([]netlink.Link, error) {
	var h *netlink.Handle
	var err error
	if n.NS != nil {
		h, err = netlink.NewHandleAt(*n.NS, unix.NETLINK_ROUTE)
	} else {
		h, err = netlink.NewHandle(unix.NETLINK_ROUTE)
	}
	if err != nil {
		return nil, err
	}
	defer h.Close()
	// A dump the kernel reports as interrupted (links changed while it
	// was read) is read again.
	for try := 1; ; try++ {
		links, err := h.LinkList()
		if errors.Is(err, netlink.ErrDumpInterrupted) && try < 5 {
			continue
		}
		return links, err
	}
}

func event(a *netlink.LinkAttrs, deleted bool) Event {
	return Event{
		Name:    a.Name,
		Deleted: deleted,
		Up:      a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown && a.Flags&net.FlagUp != 0,
	}
}
