package plugin

import "context"

// LinkEvent is a change of one network interface in the host netns.
type LinkEvent struct {
	Name string
	// Up is the operational state: true for oper-up (or unknown with
	// IFF_UP, which some drivers report).
	Up bool
	// Deleted is set when the interface left the netns (removed, or moved
	// into a pod's netns).
	Deleted bool
}

// LinkSource delivers link events. The real one subscribes to netlink in
// the host netns; tests inject events through a channel.
type LinkSource interface {
	// Subscribe streams events until ctx ends; the channel is closed then.
	// Existing links are sent first.
	Subscribe(ctx context.Context) (<-chan LinkEvent, error)
}
