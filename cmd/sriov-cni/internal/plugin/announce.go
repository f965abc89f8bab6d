package plugin

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/mdlayher/arp"
	"github.com/mdlayher/ethernet"
	"github.com/mdlayher/ndp"
)

// announce tells the segment that the pod's addresses now live behind the
// VF's MAC: a gratuitous ARP per IPv4 address and an unsolicited neighbor
// advertisement per IPv6 address, so switches and peers stop sending to
// wherever the address was before. It runs in the pod's netns. Only for
// Ethernet links: IPoIB resolves through the subnet manager's multicast
// groups, not through these frames.
func announce(ifName string, ips []*current.IPConfig) error {
	ifi, err := net.InterfaceByName(ifName)
	if err != nil {
		return fmt.Errorf("announce on %s: %w", ifName, err)
	}
	if len(ifi.HardwareAddr) != 6 {
		return nil
	}
	var errs []error
	var v4, v6 []netip.Addr
	for _, c := range ips {
		a, ok := netip.AddrFromSlice(c.Address.IP)
		if !ok {
			continue
		}
		if a.Unmap().Is4() {
			v4 = append(v4, a.Unmap())
		} else {
			v6 = append(v6, a)
		}
	}
	if len(v4) > 0 {
		errs = append(errs, gratuitousARP(ifi, v4))
	}
	for _, a := range v6 {
		errs = append(errs, unsolicitedNA(ifi, a))
	}
	return errors.Join(errs...)
}

func gratuitousARP(ifi *net.Interface, addrs []netip.Addr) error {
	c, err := arp.Dial(ifi)
	if err != nil {
		return fmt.Errorf("gratuitous ARP on %s: %w", ifi.Name, err)
	}
	defer c.Close()
	if err := c.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
		return fmt.Errorf("gratuitous ARP on %s: %w", ifi.Name, err)
	}
	for _, a := range addrs {
		// A request for our own address, target hardware unknown: the
		// form every stack takes as an update (RFC 5227 §3).
		p, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, a, ethernet.Broadcast, a)
		if err != nil {
			return fmt.Errorf("gratuitous ARP for %s: %w", a, err)
		}
		if err := c.WriteTo(p, ethernet.Broadcast); err != nil {
			return fmt.Errorf("gratuitous ARP for %s on %s: %w", a, ifi.Name, err)
		}
	}
	return nil
}

func unsolicitedNA(ifi *net.Interface, a netip.Addr) error {
	// Bind to the address itself: an advertisement's source must be one
	// of the interface's addresses, and a tentative one fails here.
	c, _, err := ndp.Listen(ifi, ndp.Addr(a.String()))
	if err != nil {
		return fmt.Errorf("unsolicited NA for %s on %s: %w", a, ifi.Name, err)
	}
	defer c.Close()
	if err := c.SetWriteDeadline(time.Now().Add(time.Second)); err != nil {
		return fmt.Errorf("unsolicited NA for %s: %w", a, err)
	}
	m := &ndp.NeighborAdvertisement{
		Override:      true,
		TargetAddress: a,
		Options:       []ndp.Option{&ndp.LinkLayerAddress{Direction: ndp.Target, Addr: ifi.HardwareAddr}},
	}
	if err := c.WriteTo(m, nil, netip.IPv6LinkLocalAllNodes()); err != nil {
		return fmt.Errorf("unsolicited NA for %s on %s: %w", a, ifi.Name, err)
	}
	return nil
}
