package plugin

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// RDMA netns modes (rdma system show netns).
const (
	RDMAModeExclusive = "exclusive"
	RDMAModeShared    = "shared"
)

// ErrNoRDMANetlink is returned when the kernel has no RDMA netlink (ib_core
// not loaded, or no RDMA support at all).
var ErrNoRDMANetlink = errors.New("RDMA netlink unavailable (is ib_core loaded?)")

// RDMA is what the plugin does with RDMA devices, over RDMA netlink.
type RDMA interface {
	// NetnsMode is the RDMA subsystem's netns mode: RDMAModeExclusive
	// (each RDMA device lives in one netns and must move with its
	// netdev) or RDMAModeShared (every device is visible in every netns).
	NetnsMode() (string, error)
	// Move moves the RDMA device dev from one netns to another.
	Move(dev string, from, to *netns.NS) error
	// Present reports whether dev is in the netns.
	Present(dev string, in *netns.NS) (bool, error)
}

// netlinkRDMA is RDMA over the kernel's RDMA netlink.
type netlinkRDMA struct{}

var _ RDMA = netlinkRDMA{}

// NewNetlinkRDMA returns the real RDMA calls.
func NewNetlinkRDMA() RDMA { return netlinkRDMA{} }

func rdmaHandle(n *netns.NS) (*netlink.Handle, error) {
	var h *netlink.Handle
	var err error
	if n == nil {
		h, err = netlink.NewHandle(unix.NETLINK_RDMA)
	} else {
		h, err = n.NewHandle(unix.NETLINK_RDMA)
	}
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		return nil, fmt.Errorf("%w: %v", ErrNoRDMANetlink, err)
	}
	return h, err
}

func (netlinkRDMA) NetnsMode() (string, error) {
	h, err := rdmaHandle(nil)
	if err != nil {
		return "", err
	}
	defer h.Close()
	mode, err := h.RdmaSystemGetNetnsMode()
	if err != nil {
		return "", fmt.Errorf("read RDMA netns mode: %w", err)
	}
	return mode, nil
}

func (netlinkRDMA) Move(dev string, from, to *netns.NS) error {
	h, err := rdmaHandle(from)
	if err != nil {
		return err
	}
	defer h.Close()
	l, err := h.RdmaLinkByName(dev)
	if err != nil {
		return fmt.Errorf("RDMA device %s in %s: %w", dev, from.Path(), err)
	}
	if err := h.RdmaLinkSetNsFd(l, uint32(to.Fd())); err != nil {
		return fmt.Errorf("move RDMA device %s to %s: %w", dev, to.Path(), err)
	}
	return nil
}

func (netlinkRDMA) Present(dev string, in *netns.NS) (bool, error) {
	h, err := rdmaHandle(in)
	if err != nil {
		return false, err
	}
	defer h.Close()
	links, err := h.RdmaLinkList()
	if err != nil {
		return false, fmt.Errorf("list RDMA devices in %s: %w", in.Path(), err)
	}
	for _, l := range links {
		if l.Attrs.Name == dev {
			return true, nil
		}
	}
	return false, nil
}
