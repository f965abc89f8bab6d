package plugin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetlinkLinks subscribes to RTM_NEWLINK/RTM_DELLINK in a netns (the
// caller's when NS is nil). It needs no capability: the DaemonSet drops
// them all.
type NetlinkLinks struct {
	NS *netns.NsHandle
	// OnError is told about a broken subscription (then the channel closes).
	OnError func(error)
}

var _ LinkSource = (*NetlinkLinks)(nil)

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
func (n *NetlinkLinks) Subscribe(ctx context.Context) (<-chan LinkEvent, error) {
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
	out := make(chan LinkEvent, 64)
	go func() {
		defer close(out)
		defer close(done)
		send := func(ev LinkEvent) bool {
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
			if !send(linkEvent(l.Attrs(), false)) {
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
				if !send(linkEvent(u.Attrs(), u.Header.Type == unix.RTM_DELLINK)) {
					return
				}
			}
		}
	}()
	return out, nil
}

// list dumps the links of the netns.
func (n *NetlinkLinks) list() ([]netlink.Link, error) {
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

func linkEvent(a *netlink.LinkAttrs, deleted bool) LinkEvent {
	return LinkEvent{
		Name:    a.Name,
		Deleted: deleted,
		Up:      a.OperState == netlink.OperUp || a.OperState == netlink.OperUnknown && a.Flags&net.FlagUp != 0,
	}
}

// DefaultRouteNetdevs are the netdevs that carry a default route (IPv4 or
// IPv6, the main table, each path of a multipath route) in a netns (the
// caller's when ns is nil), for pool.WithDefaultRoutes: the node's own
// network, which no exclusive pool may hand a pod. Reading routes and
// links needs no capability.
func DefaultRouteNetdevs(ns *netns.NsHandle) ([]string, error) {
	h := &netlink.Handle{}
	if ns != nil {
		var err error
		if h, err = netlink.NewHandleAt(*ns); err != nil {
			return nil, fmt.Errorf("netlink handle: %w", err)
		}
		defer h.Close()
	}
	routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return nil, fmt.Errorf("list routes: %w", err)
	}
	var names []string
	add := func(index int) error {
		if index == 0 {
			return nil
		}
		l, err := h.LinkByIndex(index)
		if err != nil {
			return fmt.Errorf("link %d of a default route: %w", index, err)
		}
		if n := l.Attrs().Name; !slices.Contains(names, n) {
			names = append(names, n)
		}
		return nil
	}
	for _, r := range routes {
		if r.Dst != nil {
			if ones, _ := r.Dst.Mask.Size(); ones != 0 {
				continue
			}
		}
		if err := add(r.LinkIndex); err != nil {
			return nil, err
		}
		for _, p := range r.MultiPath {
			if err := add(p.LinkIndex); err != nil {
				return nil, err
			}
		}
	}
	return names, nil
}
