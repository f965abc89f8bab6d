package plugin

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// NetlinkLinks subscribes to RTM_NEWLINK/RTM_DELLINK in a netns (the
// caller's when NS is nil).
type NetlinkLinks struct {
	NS *netns.NsHandle
	// OnError is told about a broken subscription (then the channel closes).
	OnError func(error)
}

var _ LinkSource = (*NetlinkLinks)(nil)

// Subscribe lists existing links, then streams changes until ctx ends.
func (n *NetlinkLinks) Subscribe(ctx context.Context) (<-chan LinkEvent, error) {
	updates := make(chan netlink.LinkUpdate, 256)
	done := make(chan struct{})
	opts := netlink.LinkSubscribeOptions{
		ListExisting: true,
		Namespace:    n.NS,
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
		for {
			select {
			case <-ctx.Done():
				return
			case u, ok := <-updates:
				if !ok {
					return
				}
				a := u.Attrs()
				ev := LinkEvent{
					Name:    a.Name,
					Deleted: u.Header.Type == unix.RTM_DELLINK,
					Up: a.OperState == netlink.OperUp ||
						a.OperState == netlink.OperUnknown && a.Flags&net.FlagUp != 0,
				}
				select {
				case out <- ev:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
