package doctor

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// kernel asks the running kernel over netlink, in doctor's own network
// namespace.
type kernel struct{}

var _ Kernel = kernel{}

// NewKernel returns the real Kernel: use it only when the host root is
// this machine's / (the kernel's answers are about this machine).
func NewKernel() Kernel { return kernel{} }

func (kernel) RDMANetnsMode() (string, error) {
	h, err := netlink.NewHandle(unix.NETLINK_RDMA)
	if errors.Is(err, unix.EPROTONOSUPPORT) {
		return "", fmt.Errorf("%w: %v", ErrNoRDMANetlink, err)
	}
	if err != nil {
		return "", fmt.Errorf("RDMA netlink: %w", err)
	}
	defer h.Close()
	mode, err := h.RdmaSystemGetNetnsMode()
	if err != nil {
		return "", fmt.Errorf("read RDMA netns mode: %w", err)
	}
	return mode, nil
}

func (kernel) IPv4Addrs(netdev string) ([]string, error) {
	l, err := netlink.LinkByName(netdev)
	if err != nil {
		var notFound netlink.LinkNotFoundError
		if errors.As(err, &notFound) {
			return nil, fmt.Errorf("%s: %w", netdev, ErrNoLink)
		}
		return nil, fmt.Errorf("%s: %w", netdev, err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		return nil, fmt.Errorf("%s: list addresses: %w", netdev, err)
	}
	out := make([]string, 0, len(addrs))
	for _, a := range addrs {
		out = append(out, a.IP.String())
	}
	return out, nil
}
