package sriov

import (
	"errors"
	"fmt"
	"net"
)

// PFLink is what can be done to a VF through its PF's netdev: read the VF's
// settings and change them (rtnetlink IFLA_VF_* on the PF). The netlink
// implementation is NewNetlinkPFLink; tests fake it.
type PFLink interface {
	VF(pf string, vf int) (VFConfig, error)
	SetVFVlan(pf string, vf, vlan, qos, proto int) error
	SetVFMAC(pf string, vf int, mac net.HardwareAddr) error
	SetVFSpoofChk(pf string, vf int, on bool) error
	SetVFTrust(pf string, vf int, on bool) error
	SetVFLinkState(pf string, vf int, state uint32) error
	SetVFRate(pf string, vf, minMbps, maxMbps int) error
	// SetVFGUID sets an InfiniBand VF's node and port GUID, in that
	// order; a failure after the node GUID is set wraps ErrPartlyApplied.
	SetVFGUID(pf string, vf int, guid net.HardwareAddr) error
}

// ErrPartlyApplied marks a failed change of a setting that takes more than
// one call, of which the first took effect: the setting is changed
// half-way and must be restored although the change failed. SetVFGUID
// sets the node GUID, then the port GUID.
var ErrPartlyApplied = errors.New("setting partly applied")

// VFConfig is a VF's settings as the PF reports them. GUID is not in
// IFLA_VF_INFO; callers read it from sysfs.
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

// Setting names one VF setting on the PF, as a journal records it.
type Setting string

// The VF settings, in the order Changes lists them.
const (
	SettingVlan      Setting = "vlan"
	SettingMAC       Setting = "mac"
	SettingSpoofChk  Setting = "spoofchk"
	SettingTrust     Setting = "trust"
	SettingLinkState Setting = "link_state"
	SettingTxRate    Setting = "tx_rate"
	SettingGUID      Setting = "guid"
)

// Known reports whether s is one of the settings above.
func (s Setting) Known() bool {
	switch s {
	case SettingVlan, SettingMAC, SettingSpoofChk, SettingTrust, SettingLinkState, SettingTxRate, SettingGUID:
		return true
	}
	return false
}

// Link states, as IFLA_VF_LINK_STATE values.
const (
	LinkStateAuto    = 0
	LinkStateEnable  = 1
	LinkStateDisable = 2
)

// VLAN protocols (ETH_P_8021Q, ETH_P_8021AD).
const (
	VlanProto8021Q  = 0x8100
	VlanProto8021AD = 0x88a8
)

// Settings are the VF settings wanted; nil leaves a setting alone.
type Settings struct {
	Vlan      *int
	VlanQoS   *int
	VlanProto *int
	MAC       net.HardwareAddr
	SpoofChk  *bool
	Trust     *bool
	LinkState *uint32
	MinTxRate *int
	MaxTxRate *int
	GUID      net.HardwareAddr
}

// Any reports whether anything is asked of the PF.
func (w *Settings) Any() bool {
	return w.Vlan != nil || w.VlanQoS != nil || w.VlanProto != nil || w.MAC != nil || w.SpoofChk != nil ||
		w.Trust != nil || w.LinkState != nil || w.MinTxRate != nil || w.MaxTxRate != nil || w.GUID != nil
}

// Changes lists, in the order they are to be applied, the settings that w
// changes. (A VLAN QoS or protocol takes effect with a VLAN only.)
func (w *Settings) Changes() []Setting {
	var out []Setting
	for _, c := range []struct {
		s  Setting
		on bool
	}{
		{SettingVlan, w.Vlan != nil},
		{SettingMAC, w.MAC != nil},
		{SettingSpoofChk, w.SpoofChk != nil},
		{SettingTrust, w.Trust != nil},
		{SettingLinkState, w.LinkState != nil},
		{SettingTxRate, w.MinTxRate != nil || w.MaxTxRate != nil},
		{SettingGUID, w.GUID != nil},
	} {
		if c.on {
			out = append(out, c.s)
		}
	}
	return out
}

// TxRate is the rate pair to set: what w asks for, the other bound kept
// from orig. A min above a non-zero max is an error.
func (w *Settings) TxRate(orig *VFConfig) (minMbps, maxMbps int, err error) {
	minMbps, maxMbps = orig.MinTxRate, orig.MaxTxRate
	if w.MinTxRate != nil {
		minMbps = *w.MinTxRate
	}
	if w.MaxTxRate != nil {
		maxMbps = *w.MaxTxRate
	}
	if maxMbps != 0 && minMbps > maxMbps {
		return 0, 0, fmt.Errorf("min_tx_rate %d would be above the VF's max_tx_rate %d", minMbps, maxMbps)
	}
	return minMbps, maxMbps, nil
}

// Apply sets setting s of VF vf on PF netdev pf to what w asks; orig (the
// VF's settings before) fills what w leaves out of a setting that takes
// several values.
func Apply(l PFLink, pf string, vf int, s Setting, w *Settings, orig *VFConfig) error {
	switch s {
	case SettingVlan:
		if w.Vlan == nil {
			break
		}
		qos, proto := 0, VlanProto8021Q
		if w.VlanQoS != nil {
			qos = *w.VlanQoS
		}
		if w.VlanProto != nil {
			proto = *w.VlanProto
		}
		return l.SetVFVlan(pf, vf, *w.Vlan, qos, proto)
	case SettingMAC:
		if w.MAC == nil {
			break
		}
		return l.SetVFMAC(pf, vf, w.MAC)
	case SettingSpoofChk:
		if w.SpoofChk == nil {
			break
		}
		return l.SetVFSpoofChk(pf, vf, *w.SpoofChk)
	case SettingTrust:
		if w.Trust == nil {
			break
		}
		return l.SetVFTrust(pf, vf, *w.Trust)
	case SettingLinkState:
		if w.LinkState == nil {
			break
		}
		return l.SetVFLinkState(pf, vf, *w.LinkState)
	case SettingTxRate:
		lo, hi, err := w.TxRate(orig)
		if err != nil {
			return err
		}
		return l.SetVFRate(pf, vf, lo, hi)
	case SettingGUID:
		if w.GUID == nil {
			break
		}
		return l.SetVFGUID(pf, vf, w.GUID)
	default:
		return fmt.Errorf("unknown VF setting %q", s)
	}
	return fmt.Errorf("VF setting %s: nothing asked", s)
}

// Restore puts setting s of VF vf on PF netdev pf back to orig. Restoring a
// setting that was never changed sets what is already there.
func Restore(l PFLink, pf string, vf int, s Setting, orig *VFConfig) error {
	switch s {
	case SettingVlan:
		proto := orig.Proto
		if proto == 0 {
			proto = VlanProto8021Q
		}
		return l.SetVFVlan(pf, vf, orig.Vlan, orig.QoS, proto)
	case SettingMAC:
		mac, err := net.ParseMAC(orig.MAC)
		if err != nil {
			mac = make(net.HardwareAddr, 6) // was unset: the all-zero admin MAC
		}
		return l.SetVFMAC(pf, vf, mac)
	case SettingSpoofChk:
		return l.SetVFSpoofChk(pf, vf, orig.SpoofChk)
	case SettingTrust:
		return l.SetVFTrust(pf, vf, orig.Trust)
	case SettingLinkState:
		return l.SetVFLinkState(pf, vf, orig.LinkState)
	case SettingTxRate:
		return l.SetVFRate(pf, vf, orig.MinTxRate, orig.MaxTxRate)
	case SettingGUID:
		g, err := net.ParseMAC(orig.GUID)
		if err != nil || len(g) != 8 {
			return fmt.Errorf("original GUID %q unknown, cannot put it back", orig.GUID)
		}
		return l.SetVFGUID(pf, vf, g)
	}
	return fmt.Errorf("unknown VF setting %q", s)
}

// RestoreAll restores the settings in applied, newest first. It tries every
// one and returns every failure.
func RestoreAll(l PFLink, pf string, vf int, applied []Setting, orig *VFConfig) error {
	var errs []error
	for i := len(applied) - 1; i >= 0; i-- {
		if err := Restore(l, pf, vf, applied[i], orig); err != nil {
			errs = append(errs, fmt.Errorf("restore %s: %w", applied[i], err))
		}
	}
	return errors.Join(errs...)
}
