package plugin

import "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/links"

// Link watching is package links', which the DRA driver shares; the names
// below keep the plugin's code as it was.
type (
	// LinkEvent is a change of one network interface in the host netns.
	LinkEvent = links.Event
	// LinkSource delivers link events.
	LinkSource = links.Source
	// NetlinkLinks subscribes to link changes over rtnetlink.
	NetlinkLinks = links.Netlink
)
