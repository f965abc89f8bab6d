package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// This file undoes, on DEL, an attachment that upstream sriov-cni made
// before fastpath replaced it on the node (README, "Coming from the
// Network Operator", step 4): such a DEL finds no state of fastpath's, but
// upstream's cache, <stateDir>/<ContainerID>-<IfName> (upstream's default
// directory is fastpath's default stateDir), holds what upstream changed
// and what it found before. DEL brings the netdev back to the host under
// its original name, restores the VF's settings on the PF, releases the
// address and only then removes the cache. A failed restore keeps the
// cache for the runtime's next DEL; the failures are counted in
// <cache>.fastpath-attempts (a decimal number) and, at maxDelAttempts,
// DEL gives up as it does on its own state. A cache that cannot be
// trusted is set aside as <cache>.bad and DEL goes on as without it.

// upstreamCache is what fastpath reads of upstream's cache: the JSON of
// its NetConf, whose untagged Go fields appear under their Go names. Every
// field is optional (upstream's versions differ): a missing one is left
// alone.
type upstreamCache struct {
	DeviceID    string           `json:"deviceID"`
	DPDKMode    bool             `json:"DPDKMode"`
	Master      string           `json:"Master"`
	VFID        *int             `json:"VFID"`
	OrigVfState upstreamVFState  `json:"OrigVfState"`
	Vlan        *int             `json:"vlan"`
	MAC         string           `json:"mac"`
	SpoofChk    string           `json:"spoofchk"`
	Trust       string           `json:"trust"`
	LinkState   string           `json:"link_state"`
	MinTxRate   *int             `json:"min_tx_rate"`
	MaxTxRate   *int             `json:"max_tx_rate"`
	Runtime     upstreamRuntimes `json:"runtimeConfig"`
}

type upstreamRuntimes struct {
	MAC string `json:"mac"`
}

// upstreamVFState is upstream's OrigVfState: the VF as upstream's ADD
// found it.
type upstreamVFState struct {
	HostIFName   string  `json:"HostIFName"`
	SpoofChk     *bool   `json:"SpoofChk"`
	Trust        *bool   `json:"Trust"`
	AdminMAC     *string `json:"AdminMAC"`
	EffectiveMAC *string `json:"EffectiveMAC"`
	Vlan         *int    `json:"Vlan"`
	VlanQoS      *int    `json:"VlanQoS"`
	VlanProto    *string `json:"VlanProto"`
	MinTxRate    *int    `json:"MinTxRate"`
	MaxTxRate    *int    `json:"MaxTxRate"`
	LinkState    *uint32 `json:"LinkState"`
}

// parseUpstreamCache decodes upstream's cache. Every error means the file
// cannot be trusted (ErrBadState).
func parseUpstreamCache(data []byte) (*upstreamCache, error) {
	uc := &upstreamCache{}
	if err := json.Unmarshal(data, uc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	o := &uc.OrigVfState
	switch {
	case !pci.ValidAddress(uc.DeviceID):
		return nil, fmt.Errorf("%w: deviceID %q is not a PCI address", ErrBadState, uc.DeviceID)
	case o.HostIFName != "" && ifname.Check(o.HostIFName) != nil:
		return nil, fmt.Errorf("%w: OrigVfState.HostIFName: %v", ErrBadState, ifname.Check(o.HostIFName))
	case uc.Master != "" && ifname.Check(uc.Master) != nil:
		return nil, fmt.Errorf("%w: Master: %v", ErrBadState, ifname.Check(uc.Master))
	case uc.VFID != nil && *uc.VFID < 0:
		return nil, fmt.Errorf("%w: VFID %d", ErrBadState, *uc.VFID)
	}
	if o.VlanProto != nil {
		if _, err := upstreamVlanProto(*o.VlanProto); err != nil {
			return nil, fmt.Errorf("%w: OrigVfState.VlanProto: %v", ErrBadState, err)
		}
	}
	return uc, nil
}

func upstreamVlanProto(s string) (int, error) {
	switch strings.ToLower(s) {
	case "", "802.1q":
		return sriov.VlanProto8021Q, nil
	case "802.1ad":
		return sriov.VlanProto8021AD, nil
	}
	return 0, fmt.Errorf("%q: want 802.1q or 802.1ad", s)
}

// restorePlan is the VF settings on the PF upstream changed and whose
// values before are in the cache, in the order ADD applies them, with
// those values over base (the VF's settings now, for what the cache does
// not hold of a setting that takes several values).
func (uc *upstreamCache) restorePlan(base sriov.VFConfig) ([]sriov.Setting, *sriov.VFConfig) {
	o, orig := &uc.OrigVfState, base
	var out []sriov.Setting
	if uc.Vlan != nil && o.Vlan != nil {
		orig.Vlan, orig.QoS, orig.Proto = *o.Vlan, 0, sriov.VlanProto8021Q
		if o.VlanQoS != nil {
			orig.QoS = *o.VlanQoS
		}
		if o.VlanProto != nil {
			orig.Proto, _ = upstreamVlanProto(*o.VlanProto)
		}
		out = append(out, sriov.SettingVlan)
	}
	if (uc.MAC != "" || uc.Runtime.MAC != "") && o.AdminMAC != nil {
		orig.MAC = *o.AdminMAC
		out = append(out, sriov.SettingMAC)
	}
	if uc.SpoofChk != "" && o.SpoofChk != nil {
		orig.SpoofChk = *o.SpoofChk
		out = append(out, sriov.SettingSpoofChk)
	}
	if uc.Trust != "" && o.Trust != nil {
		orig.Trust = *o.Trust
		out = append(out, sriov.SettingTrust)
	}
	if uc.LinkState != "" && o.LinkState != nil {
		orig.LinkState = *o.LinkState
		out = append(out, sriov.SettingLinkState)
	}
	if (uc.MinTxRate != nil || uc.MaxTxRate != nil) && (o.MinTxRate != nil || o.MaxTxRate != nil) {
		if o.MinTxRate != nil {
			orig.MinTxRate = *o.MinTxRate
		}
		if o.MaxTxRate != nil {
			orig.MaxTxRate = *o.MaxTxRate
		}
		out = append(out, sriov.SettingTxRate)
	}
	return out, &orig
}

// upstreamPath is where upstream caches the attachment (containerID,
// ifName), or "" when those cannot name a file in the state dir.
func (s *Store) upstreamPath(containerID, ifName string) string {
	name := containerID + "-" + ifName
	if containerID == "" || ifName == "" || strings.HasPrefix(name, ".") || filepath.Base(name) != name {
		return ""
	}
	return filepath.Join(s.dir, name)
}

// readUpstream reads upstream's cache at path: fs.ErrNotExist when there
// is none, ErrBadState when it cannot be trusted.
func readUpstream(path string) (*upstreamCache, error) {
	data, err := readOwnFile(path, "upstream cache "+path)
	if err != nil {
		return nil, err
	}
	uc, err := parseUpstreamCache(data)
	if err != nil {
		return nil, fmt.Errorf("upstream cache %s: %w", path, err)
	}
	return uc, nil
}

// loadUpstream reads upstream's cache of the attachment. A cache that
// cannot be trusted is set aside as <cache>.bad and logged; like a cache
// that cannot be read, it is then as if absent (nil): a foreign file never
// wedges a DEL.
func (s *Store) loadUpstream(log *slog.Logger, args *skel.CmdArgs) (*upstreamCache, string) {
	path := s.upstreamPath(args.ContainerID, args.IfName)
	if path == "" {
		return nil, ""
	}
	uc, err := readUpstream(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, ""
	case errors.Is(err, ErrBadState):
		s.setAsideUpstream(log, path, err)
		return nil, ""
	case err != nil:
		log.Error("upstream sriov-cni's cache unreadable; DEL goes on without it", "err", err)
		return nil, ""
	}
	return uc, path
}

func (s *Store) setAsideUpstream(log *slog.Logger, path string, why error) {
	to, err := setAside(path)
	if err != nil {
		log.Error("upstream sriov-cni's cache cannot be trusted, nor set aside; DEL goes on without it", "err", why, "setAsideErr", err)
		return
	}
	log.Error("upstream sriov-cni's cache cannot be trusted; set aside, DEL goes on without it", "err", why, "to", to)
}

// removeUpstream removes upstream's cache and fastpath's attempt count.
func removeUpstream(path string) error {
	_ = os.Remove(path + upstreamAttemptsSuffix)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove upstream sriov-cni's cache: %w", err)
	}
	return nil
}

// upstreamAttemptsSuffix names the file beside upstream's cache that
// counts DELs that failed to restore its VF.
const upstreamAttemptsSuffix = ".fastpath-attempts"

func upstreamAttempts(path string) int {
	b, err := os.ReadFile(path + upstreamAttemptsSuffix)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// delUpstream undoes, with vf's lock held and no state of fastpath's for
// vf, the attachment upstream sriov-cni made, when its cache is there and
// names vf. It reports whether there was such a cache; when there was,
// err is DEL's answer.
func (p *Plugin) delUpstream(ctx context.Context, log *slog.Logger, c *NetConf, store *Store, args *skel.CmdArgs, lock *Lock, vf string) (bool, error) {
	uc, path := store.loadUpstream(log, args)
	if uc == nil {
		return false, nil
	}
	if uc.DeviceID != vf {
		store.setAsideUpstream(log, path, fmt.Errorf("%w: names VF %s, DEL is of VF %s", ErrBadState, uc.DeviceID, vf))
		return false, nil
	}
	log = log.With("upstreamCache", path)
	log.Info("attachment made by upstream sriov-cni: undoing it from its cache", "dpdk", uc.DPDKMode, "hostName", uc.OrigVfState.HostIFName)
	host, err := netns.Current()
	if err != nil {
		return true, fail(0, vf, "open host netns", err)
	}
	defer host.Close()

	var errs []error
	d, derr := nic.NewScanner(p.HostRoot).Device(vf)
	if !uc.DPDKMode {
		if err := p.restoreUpstreamLink(log, store, uc, vf, host, args); err != nil {
			errs = append(errs, err)
		}
	}
	if err := p.restoreUpstreamVF(uc, d, derr, host); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		restoreErr := fail(0, vf, "restore upstream sriov-cni's attachment", errors.Join(errs...))
		n := upstreamAttempts(path) + 1
		if n < maxDelAttempts {
			if err := os.WriteFile(path+upstreamAttemptsSuffix, []byte(strconv.Itoa(n)+"\n"), 0o600); err != nil {
				log.Error("count of failed DELs not saved", "err", err)
			}
			return true, restoreErr
		}
		log.Error("giving up on restoring the VF upstream sriov-cni attached after repeated failures; its cache dropped",
			"attempts", n, "err", restoreErr)
	}

	var ipamErr error
	if c.IPAM.Type != "" {
		if err := p.ipamDel(ctx, args, c.IPAM.Type, lock); err != nil {
			pr := &Pending{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
				IPAMType: c.IPAM.Type, PCIAddress: vf}
			if prev, perr := store.LoadPending(c.Name, args.ContainerID, args.IfName); perr == nil {
				pr = prev
			}
			if ipamErr = store.pend(log, pr, err); !errors.Is(ipamErr, ErrIPAMPending) {
				// Not recorded: the cache keeps the address for the next DEL.
				return true, ipamErr
			}
		} else if err := store.RemovePending(c.Name, args.ContainerID, args.IfName); err != nil {
			log.Warn("pending address release record left", "err", err)
		}
	}
	if err := removeUpstream(path); err != nil {
		return true, errors.Join(ipamErr, fail(types.ErrIOFailure, vf, "remove upstream cache", err))
	}
	log.Info("detached upstream sriov-cni's attachment")
	return true, ipamErr
}

// restoreUpstreamVF puts back the VF settings on the PF that upstream
// changed (restorePlan). The PF is sysfs's, else the cache's Master/VFID.
func (p *Plugin) restoreUpstreamVF(uc *upstreamCache, d nic.Device, derr error, host *netns.NS) error {
	pf, idx := d.PFNetdev, d.VFIndex
	if derr != nil || pf == "" {
		if uc.Master == "" || uc.VFID == nil {
			settings, _ := uc.restorePlan(sriov.VFConfig{})
			if len(settings) == 0 {
				return nil
			}
			return fmt.Errorf("VF settings: PF netdev unknown (sysfs: %v; the cache has no Master and VFID)", derr)
		}
		pf, idx = uc.Master, *uc.VFID
	}
	pfl := p.NewPFLink(host.Handle())
	base, err := pfl.VF(pf, idx)
	if err != nil {
		base = sriov.VFConfig{Proto: sriov.VlanProto8021Q}
	}
	settings, orig := uc.restorePlan(base)
	if len(settings) == 0 {
		return nil
	}
	if err := sriov.RestoreAll(pfl, pf, idx, settings, orig); err != nil {
		return fmt.Errorf("VF settings on PF %s: %w", pf, err)
	}
	return nil
}

// netdevPCI is the PCI address of the device behind l, a link in n, or
// "": the kernel's IFLA_PARENT_DEV_NAME on the pci bus; with deep, on a
// kernel without it (before 5.15), ethtool's bus-info.
func (p *Plugin) netdevPCI(n *netns.NS, l netlink.Link, deep bool) string {
	if p.NetdevPCI != nil {
		return p.NetdevPCI(l)
	}
	a := l.Attrs()
	switch {
	case a.ParentDevBus == "pci":
		return a.ParentDev
	case a.ParentDevBus != "" || !deep:
		return ""
	}
	var bus string
	_ = n.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		info, err := unix.IoctlGetEthtoolDrvinfo(fd, a.Name)
		if err != nil {
			return err
		}
		bus = unix.ByteSliceToString(info.Bus_info[:])
		return nil
	})
	if !pci.ValidAddress(bus) {
		return ""
	}
	return bus
}

// linkOf is the name of the link in n whose device is vf: one of names
// first (each checked, never trusted by its name alone), else any.
func (p *Plugin) linkOf(n *netns.NS, vf string, names ...string) string {
	h := n.Handle()
	for _, name := range names {
		if l, err := h.LinkByName(name); err == nil && p.netdevPCI(n, l, true) == vf {
			return name
		}
	}
	links, _ := h.LinkList()
	for _, l := range links {
		if p.netdevPCI(n, l, false) == vf {
			return l.Attrs().Name
		}
	}
	return ""
}

// restoreUpstreamLink brings the VF's netdev back to the host netns named
// OrigVfState.HostIFName, from the pod's netns (through the pinned
// temporary netns, where a killed DEL leaves it for the next) or from the
// host, where the kernel put it when the pod's netns died. A name taken on
// the host leaves the kernel's and is logged.
func (p *Plugin) restoreUpstreamLink(log *slog.Logger, store *Store, uc *upstreamCache, vf string, host *netns.NS, args *skel.CmdArgs) error {
	want := uc.OrigVfState.HostIFName
	var mac net.HardwareAddr
	if m := uc.OrigVfState.EffectiveMAC; m != nil && (uc.MAC != "" || uc.Runtime.MAC != "") {
		mac, _ = net.ParseMAC(*m)
	}
	viaPath := store.netnsPath(vf)
	var via *netns.NS
	if n, err := netns.Open(viaPath); err == nil {
		via = n
		defer via.Close()
	}
	var from *netns.NS
	var name string
	if via != nil {
		if name = p.linkOf(via, vf); name != "" {
			from = via
		}
	}
	if from == nil && args.Netns != "" {
		if pod, err := netns.Open(args.Netns); err == nil {
			defer pod.Close()
			if name = p.linkOf(pod, vf, args.IfName); name != "" {
				from = pod
			}
		}
	}
	if from == nil {
		// The kernel returned it from a pod's netns that died: sysfs
		// lists it for the VF under the name it had there.
		var listed []string
		ents, _ := os.ReadDir(filepath.Join(p.HostRoot, "sys/bus/pci/devices", vf, "net"))
		for _, e := range ents {
			listed = append(listed, e.Name())
		}
		if name = p.linkOf(host, vf, listed...); name == "" {
			log.Warn("VF netdev not found in the pod or the host netns; was the VF removed?", "hostName", want)
			return unpinIfEmpty(viaPath)
		}
		return restoreUpstreamInHost(log, host, name, want, mac)
	}

	target := want
	if target == "" || taken(host, target) {
		target = name
		if taken(host, target) {
			if l, err := from.Handle().LinkByName(name); err == nil {
				target = fmt.Sprintf("dev%d", l.Attrs().Index)
			}
		}
		if want != "" {
			log.Warn("VF netdev's original name is taken on the host; it keeps the kernel's", "hostName", want, "name", target)
		}
	}
	if l, err := from.Handle().LinkByName(name); err == nil {
		if err := from.Handle().LinkSetDown(l); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
	}
	if via == nil {
		n, err := pinForReturn(log, viaPath)
		if err != nil {
			return err
		}
		via = n
		defer via.Close()
	}
	if _, err := netns.MoveVia(name, from, via, host, netns.LinkConfig{Name: target, MAC: mac}); err != nil {
		return fmt.Errorf("return %s to the host as %s: %w", name, target, err)
	}
	log.Info("VF netdev returned to the host", "from", name, "name", target)
	return unpinIfEmpty(viaPath)
}

func taken(n *netns.NS, name string) bool {
	_, err := n.Handle().LinkByName(name)
	return err == nil
}

// restoreUpstreamInHost renames the VF's netdev, found on the host as
// name, to want (when it is free) and puts its MAC back.
func restoreUpstreamInHost(log *slog.Logger, host *netns.NS, name, want string, mac net.HardwareAddr) error {
	h := host.Handle()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if want != "" && name != want {
		if taken(host, want) {
			log.Warn("VF netdev's original name is taken on the host; it keeps the kernel's", "hostName", want, "name", name)
		} else {
			if err := h.LinkSetDown(l); err != nil {
				return fmt.Errorf("set %s down: %w", name, err)
			}
			if err := h.LinkSetName(l, want); err != nil {
				return fmt.Errorf("rename %s to %s: %w", name, want, err)
			}
			log.Info("VF netdev renamed to its original name", "from", name, "name", want)
		}
	}
	if mac != nil && l.Attrs().HardwareAddr.String() != mac.String() {
		if err := h.LinkSetHardwareAddr(l, mac); err != nil {
			return fmt.Errorf("restore MAC of %s: %w", name, err)
		}
	}
	return nil
}
