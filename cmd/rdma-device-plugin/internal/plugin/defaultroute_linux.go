package plugin

import (
	"fmt"
	"slices"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

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
