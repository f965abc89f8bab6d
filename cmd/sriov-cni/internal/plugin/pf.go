package plugin

import (
	"errors"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// PF is what the plugin does to a VF through its PF's netdev: read the VF's
// settings and change them (rtnetlink IFLA_VF_* on the PF).
type PF interface {
	VF(pf string, vf int) (VFConfig, error)
	SetVFVlan(pf string, vf, vlan, qos, proto int) error
	SetVFMAC(pf string, vf int, mac net.HardwareAddr) error
	SetVFSpoofChk(pf string, vf int, on bool) error
	SetVFTrust(pf string, vf int, on bool) error
	SetVFLinkState(pf string, vf int, state uint32) error
	SetVFRate(pf string, vf, minMbps, maxMbps int) error
	// SetVFGUID sets an InfiniBand VF's node and port GUID.
	SetVFGUID(pf string, vf int, guid net.HardwareAddr) error
}

// VFConfig is a VF's settings as the PF reports them. GUID is not in
// IFLA_VF_INFO; the plugin reads it from sysfs.
type VFConfig struct {
	MAC       string `json:"mac,omitempty"`
	Vlan      int    `json:"vlan"`
	QoS       int    `json:"qos"`
	Proto     int    `json:"proto"`
	SpoofChk  bool   `json:"spoofchk"`
	Trust     bool   `json:"trust"`
	LinkState uint32 `json:"linkState"`
	MinTxRate int    `json:"minTxRate"`
	MaxTxRate int    `json:"maxTxRate"`
	GUID      string `json:"guid,omitempty"`
}

// vfStep is one VF setting to apply.
type vfStep struct {
	name  string
	apply func() error
}

// vfSteps lists, in the order they are applied, the steps that change what
// want asks for. orig (the VF's settings before) fills what want leaves
// out of a setting that takes several values.
func vfSteps(p PF, pf string, vf int, want *vfSettings, orig *VFConfig) []vfStep {
	var steps []vfStep
	add := func(name string, apply func() error) { steps = append(steps, vfStep{name: name, apply: apply}) }
	if want.Vlan != nil {
		qos, proto := 0, VlanProto8021Q
		if want.VlanQoS != nil {
			qos = *want.VlanQoS
		}
		if want.VlanProto != nil {
			proto = *want.VlanProto
		}
		add("vlan", func() error { return p.SetVFVlan(pf, vf, *want.Vlan, qos, proto) })
	}
	if want.MAC != nil {
		add("mac", func() error { return p.SetVFMAC(pf, vf, want.MAC) })
	}
	if want.SpoofChk != nil {
		add("spoofchk", func() error { return p.SetVFSpoofChk(pf, vf, *want.SpoofChk) })
	}
	if want.Trust != nil {
		add("trust", func() error { return p.SetVFTrust(pf, vf, *want.Trust) })
	}
	if want.LinkState != nil {
		add("link_state", func() error { return p.SetVFLinkState(pf, vf, *want.LinkState) })
	}
	if want.MinTxRate != nil || want.MaxTxRate != nil {
		lo, hi := orig.MinTxRate, orig.MaxTxRate
		if want.MinTxRate != nil {
			lo = *want.MinTxRate
		}
		if want.MaxTxRate != nil {
			hi = *want.MaxTxRate
		}
		add("tx_rate", func() error {
			if hi != 0 && lo > hi {
				return fmt.Errorf("min_tx_rate %d would be above the VF's max_tx_rate %d", lo, hi)
			}
			return p.SetVFRate(pf, vf, lo, hi)
		})
	}
	if want.GUID != nil {
		add("guid", func() error { return p.SetVFGUID(pf, vf, want.GUID) })
	}
	return steps
}

// restoreVFSetting puts the setting of step name back to orig.
func restoreVFSetting(p PF, pf string, vf int, name string, orig *VFConfig) error {
	switch name {
	case "vlan":
		proto := orig.Proto
		if proto == 0 {
			proto = VlanProto8021Q
		}
		return p.SetVFVlan(pf, vf, orig.Vlan, orig.QoS, proto)
	case "mac":
		mac, err := net.ParseMAC(orig.MAC)
		if err != nil {
			mac = make(net.HardwareAddr, 6) // was unset: the all-zero admin MAC
		}
		return p.SetVFMAC(pf, vf, mac)
	case "spoofchk":
		return p.SetVFSpoofChk(pf, vf, orig.SpoofChk)
	case "trust":
		return p.SetVFTrust(pf, vf, orig.Trust)
	case "link_state":
		return p.SetVFLinkState(pf, vf, orig.LinkState)
	case "tx_rate":
		return p.SetVFRate(pf, vf, orig.MinTxRate, orig.MaxTxRate)
	case "guid":
		g, err := net.ParseMAC(orig.GUID)
		if err != nil || len(g) != 8 {
			return fmt.Errorf("original GUID %q unknown, cannot put it back", orig.GUID)
		}
		return p.SetVFGUID(pf, vf, g)
	}
	return fmt.Errorf("unknown VF setting %q in state", name)
}

// applyVF applies the steps in order. On a failure it restores, newest
// first, what it had changed and returns the error naming the step; on
// success it returns the names of the applied steps.
func applyVF(p PF, pf string, vf int, steps []vfStep, orig *VFConfig) (applied []string, err error) {
	for _, s := range steps {
		if err = s.apply(); err != nil {
			rerr := restoreVF(p, pf, vf, applied, orig)
			return nil, errors.Join(fmt.Errorf("set %s: %w", s.name, err), rerr)
		}
		applied = append(applied, s.name)
	}
	return applied, nil
}

// restoreVF restores the settings named in applied, newest first. It tries
// every one and returns every failure.
func restoreVF(p PF, pf string, vf int, applied []string, orig *VFConfig) error {
	var errs []error
	for i := len(applied) - 1; i >= 0; i-- {
		if err := restoreVFSetting(p, pf, vf, applied[i], orig); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", applied[i], err))
		}
	}
	return errors.Join(errs...)
}

// netlinkPF is PF over rtnetlink in the host network namespace.
type netlinkPF struct{ h *netlink.Handle }

var _ PF = (*netlinkPF)(nil)

// NewNetlinkPF returns the real PF calls on handle h (the host netns).
func NewNetlinkPF(h *netlink.Handle) PF { return &netlinkPF{h: h} }

func (n *netlinkPF) link(pf string) (netlink.Link, error) {
	l, err := n.h.LinkByName(pf)
	if err != nil {
		return nil, fmt.Errorf("PF %s: %w", pf, err)
	}
	return l, nil
}

func (n *netlinkPF) VF(pf string, vf int) (VFConfig, error) {
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

func (n *netlinkPF) SetVFVlan(pf string, vf, vlan, qos, proto int) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfVlanQosProto(l, vf, vlan, qos, proto)
}

func (n *netlinkPF) SetVFMAC(pf string, vf int, mac net.HardwareAddr) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfHardwareAddr(l, vf, mac)
}

func (n *netlinkPF) SetVFSpoofChk(pf string, vf int, on bool) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfSpoofchk(l, vf, on)
}

func (n *netlinkPF) SetVFTrust(pf string, vf int, on bool) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfTrust(l, vf, on)
}

func (n *netlinkPF) SetVFLinkState(pf string, vf int, state uint32) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfState(l, vf, state)
}

func (n *netlinkPF) SetVFRate(pf string, vf, minMbps, maxMbps int) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	return n.h.LinkSetVfRate(l, vf, minMbps, maxMbps)
}

func (n *netlinkPF) SetVFGUID(pf string, vf int, guid net.HardwareAddr) error {
	l, err := n.link(pf)
	if err != nil {
		return err
	}
	if err := n.h.LinkSetVfGUID(l, vf, guid, nl.IFLA_VF_IB_NODE_GUID); err != nil {
		return fmt.Errorf("node GUID: %w", err)
	}
	if err := n.h.LinkSetVfGUID(l, vf, guid, nl.IFLA_VF_IB_PORT_GUID); err != nil {
		return fmt.Errorf("port GUID: %w", err)
	}
	return nil
}
