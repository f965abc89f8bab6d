// Package links is link watching in the host netns, which the device
// plugin's health (internal/plugin) and the DRA driver's (internal/dra)
// share: Source streams Events, Netlink is the real one (rtnetlink, no
// capability needed) and linkstest.Chan the one tests feed by hand.
package links

import "context"

// Event is a change of one network interface in the host netns.
type Event struct {
	Name string
	// Up is the operational state: true for oper-up (or unknown with
	// IFF_UP, which some drivers report).
	Up bool
	// Deleted is set when the interface left the netns (removed, or moved
	// into a pod's netns).
	Deleted bool
}

// Source delivers link events. The real one subscribes to netlink in
// the host netns; tests inject events through a channel.
type Source interface {
	// Subscribe streams events until ctx ends; the channel is closed then.
	// Existing links are sent first.
	Subscribe(ctx context.Context) (<-chan Event, error)
}
