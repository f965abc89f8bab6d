package netns

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// LinkConfig is what MoveTo gives a link as it arrives. Zero values leave
// the attribute alone.
type LinkConfig struct {
	Name  string  // new name; "" keeps the name
	MTU   int     // new MTU
	Alias *string // new alias ("" clears it)
}

// ErrLinkNotFound is returned when the link to move is not in the source
// namespace.
var ErrLinkNotFound = errors.New("link not found")

// MoveTo moves the link named name from one namespace into another and
// gives it cfg there, in one rtnetlink request: RTM_SETLINK with
// IFLA_NET_NS_FD, IFLA_IFNAME, IFLA_MTU and IFLA_IFALIAS, as `ip link set
// DEV netns NS name NAME mtu N alias A` sends it. The kernel carries the
// request out under one hold of the RTNL lock (do_setlink in
// net/core/rtnetlink.c: the namespace change first, then the MTU, the
// name and the alias, in the target), so no process ever sees the link
// half-way and a process killed around the call leaves it either in from
// under its own name or in to as cfg says. A name of the link's that is
// taken in to is no clash: __dev_change_net_namespace names it cfg.Name
// as it arrives.
//
// A cfg.Name taken in to is refused before anything changes. A part the
// kernel refuses after the move (an MTU out of the driver's range, say)
// sends the link back to from under its own name, MTU and alias. The link
// arrives down (a move takes it down); MoveTo returns it as seen in to. A
// MAC is not part of the request: a VF driver may refuse one (igbvf), and
// the caller sets it once the link is there.
func MoveTo(name string, from, to *NS, cfg LinkConfig) (netlink.Link, error) {
	link, err := from.h.LinkByName(name)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil, fmt.Errorf("%s in %s: %w", name, from.Path(), ErrLinkNotFound)
		}
		return nil, fmt.Errorf("look up %s in %s: %w", name, from.Path(), err)
	}
	orig := link.Attrs()
	arrive := name
	if cfg.Name != "" && cfg.Name != name {
		if _, err := to.h.LinkByName(cfg.Name); err == nil {
			return nil, fmt.Errorf("move %s into %s: an interface named %s is already there: %w", name, to.Path(), cfg.Name, unix.EEXIST)
		}
		arrive = cfg.Name
	}
	if err := from.setLink(orig.Index, to, cfg); err != nil {
		moveErr := fmt.Errorf("move %s into %s as %s: %w", name, to.Path(), arrive, err)
		if errors.Is(err, unix.EEXIST) {
			moveErr = fmt.Errorf("move %s into %s: an interface named %s is already there: %w", name, to.Path(), arrive, err)
		}
		// Refused before the move, or the kernel moved it and then
		// refused a later attribute: then it is in to, under its own
		// name or cfg.Name, and goes back.
		if l := find(to, orig.HardwareAddr, name, arrive); l != nil {
			alias := orig.Alias
			back := LinkConfig{Name: name, MTU: orig.MTU, Alias: &alias}
			if berr := to.setLink(l.Attrs().Index, from, back); berr != nil {
				return nil, fmt.Errorf("%w; and back into %s: %w", moveErr, from.Path(), berr)
			}
		}
		return nil, moveErr
	}
	moved, err := to.h.LinkByName(arrive)
	if err != nil {
		return nil, fmt.Errorf("look up %s in %s after the move: %w", arrive, to.Path(), err)
	}
	return moved, nil
}

// find is the link in n named one of names whose MAC is mac, nil when none.
func find(n *NS, mac []byte, names ...string) netlink.Link {
	for _, name := range names {
		if l, err := n.h.LinkByName(name); err == nil && bytes.Equal(l.Attrs().HardwareAddr, mac) {
			return l
		}
	}
	return nil
}

// setLink sends the one RTM_SETLINK that moves the link with ifindex index,
// in n, into to with cfg, on a route socket in n.
func (n *NS) setLink(index int, to *NS, cfg LinkConfig) error {
	at := vnetns.NsHandle(n.Fd())
	if n.current {
		at = vnetns.None() // the thread's own: no setns
	}
	s, err := nl.GetNetlinkSocketAt(at, vnetns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("route socket in %s: %w", n.Path(), err)
	}
	defer s.Close()
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(index)
	req.AddData(msg)
	req.AddData(nl.NewRtAttr(unix.IFLA_NET_NS_FD, nl.Uint32Attr(uint32(to.Fd()))))
	if cfg.Name != "" {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFNAME, nl.ZeroTerminated(cfg.Name)))
	}
	if cfg.MTU != 0 {
		req.AddData(nl.NewRtAttr(unix.IFLA_MTU, nl.Uint32Attr(uint32(cfg.MTU))))
	}
	if cfg.Alias != nil {
		req.AddData(nl.NewRtAttr(unix.IFLA_IFALIAS, []byte(*cfg.Alias)))
	}
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}
