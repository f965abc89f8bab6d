package sriov

import (
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// netlinkPFLink is PFLink over rtnetlink.
type netlinkPFLink struct{ h *netlink.Handle }

var _ PFLink = (*netlinkPFLink)(nil)

// NewNetlinkPFLink returns the real PF calls over handle h, a handle in
// the netns of the PF netdevs (the host's).
func NewNetlinkPFLink(h *netlink.Handle) PFLink { return &netlinkPFLink{h: h} }

func (n *netlinkPFLink) link(pf string) (netlink.Link, error) {
	l, err := n.h.LinkByName(pf)
	if err != nil {
		return nil, fmt.Errorf("PF %s: %w", pf, err)
	}
	return l, nil
}

func (n *netlinkPFLink) VF(pf string, vf int) (VFConfig, error) {
	l, err := n.link(pf)
	if err != nil {
		return VFConfig{}, err
	}
	for _, v := range l.Attrs().Vfs {
		if v.ID != vf {
			continue
		}
		c := VFConfig{
			Vlan: v.Vlan, QoS: v.Qos, Proto: v.VlanProto, SpoofChk: v.Spoofchk, Trust: v.Trust != 0,
			LinkState: v.LinkState, MinTxRate: int(v.MinTxRate), MaxTxRate: int(v.MaxTxRate),
		}
		if len(v.Mac) > 0 {
			c.MAC = v.Mac.String()
		}
		return c, nil
	}
	return VFConfig{}, fmt.Errorf("PF %s reports no VF %d (%d VFs in IFLA_VFINFO_LIST; is it an SR-IOV PF with sriov_numvfs set?)", pf, vf, len(l.Attrs().Vfs))
}

func (n *netlinkPFLink) SetVFVlan(pf string, vf, vlan, qos, proto int) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfVlanQosProto(l, vf, vlan, qos, proto)
}

func (n *netlinkPFLink) SetVFMAC(pf string, vf int, mac net.HardwareAddr) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfHardwareAddr(l, vf, mac)
}

func (n *netlinkPFLink) SetVFSpoofChk(pf string, vf int, on bool) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfSpoofchk(l, vf, on)
}

func (n *netlinkPFLink) SetVFTrust(pf string, vf int, on bool) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfTrust(l, vf, on)
}

func (n *netlinkPFLink) SetVFLinkState(pf string, vf int, state uint32) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfState(l, vf, state)
}

func (n *netlinkPFLink) SetVFRate(pf string, vf, minMbps, maxMbps int) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfRate(l, vf, minMbps, maxMbps)
}

func (n *netlinkPFLink) SetVFGUID(pf string, vf int, guid net.HardwareAddr) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	if err := n.h.LinkSetVfGUID(l, vf, guid, nl.IFLA_VF_IB_NODE_GUID); err != nil {
		return fmt.Errorf("node GUID: %w", err)
	}
	if err := n.h.LinkSetVfGUID(l, vf, guid, nl.IFLA_VF_IB_PORT_GUID); err != nil {
		// The node GUID is changed already and IFLA_VF_INFO does not
		// report it, so it cannot be put back from here: the caller
		// restores the setting as a whole.
		return fmt.Errorf("port GUID (node GUID set already): %w: %w", ErrPartlyApplied, err)
	}
	return nil
}
