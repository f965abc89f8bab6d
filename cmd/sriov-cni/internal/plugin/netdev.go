package plugin

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// This file brings a VF's netdev home for teardown: it finds the netdev
// wherever an ADD or a DEL, fastpath's or upstream sriov-cni's, may have
// left it and puts it back on the host as the state says it was.

// restoreLink brings the VF netdev back to the host under its original
// name, MTU and alias, from wherever it is (findNetdev), in one rtnetlink
// request (netns.MoveTo), then its MAC; and releases a temporary netns an
// older version pinned for the move. A name taken on the host meanwhile
// leaves the netdev the kernel's (homeName), with a warning.
func (p *Plugin) restoreLink(log *slog.Logger, store *Store, st *State, host, pod *netns.NS) error {
	viaPath := store.netnsPath(st.PCIAddress)
	via := openPin(log, viaPath)
	defer func() {
		if via != nil {
			via.Close()
		}
	}()
	where, name := p.findNetdev(st, host, pod, via)
	home, moved := name, false
	switch {
	case where == nil:
		log.Warn("VF netdev not found in the pod, the temporary or the host netns (a link that is not the VF's own is never touched); was the VF removed?", "netdev", st.HostName)
	case where == host:
		var err error
		if home, err = p.restoreInHost(log, st, host, name); err != nil {
			return err
		}
	default:
		home = homeName(log, st, host, where, name)
		alias := st.HostAlias
		cfg := netns.LinkConfig{Name: home, MTU: st.HostMTU, Alias: &alias}
		if _, err := netns.MoveTo(name, where, host, cfg); err != nil {
			return fmt.Errorf("return %s to the host as %s: %w", name, home, err)
		}
		log.Info("VF netdev returned to the host", "from", name, "name", home)
		moved = true
	}
	if err := unpinIfEmpty(log, viaPath); err != nil {
		return err
	}
	// The MAC of a netdev brought home, once home, where a VF driver that
	// refuses it can be reset (setNetdevMAC); a kill before leaves it
	// home, where the next teardown puts it back in place (restoreInHost).
	if mac, err := net.ParseMAC(st.HostMAC); moved && st.PodMAC != "" && err == nil {
		if err := p.setNetdevMAC(st, host.Handle(), home, mac); err != nil {
			return fmt.Errorf("restore MAC of %s: %w", home, err)
		}
	}
	if where == nil || !st.HostUp {
		return nil
	}
	l, err := host.Handle().LinkByName(home)
	if err == nil {
		err = host.Handle().LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("set %s up: %w", home, err)
	}
	return nil
}

// homeName is the name the netdev found in from as name goes home under:
// the state's host name, unless it is unknown or another link took it on
// the host meanwhile; then the name it has, else dev<ifindex> as the
// kernel names a link it returns to a netns where its name is taken.
func homeName(log *slog.Logger, st *State, host, from *netns.NS, name string) string {
	want := st.HostName
	if want != "" && !taken(host, want) {
		return want
	}
	home := name
	if taken(host, home) {
		if l, err := from.Handle().LinkByName(name); err == nil {
			home = fmt.Sprintf("dev%d", l.Attrs().Index)
		}
	}
	if want != "" {
		log.Warn("VF netdev's original name is taken on the host; it keeps the kernel's", "hostName", want, "name", home)
	}
	return home
}

func taken(n *netns.NS, name string) bool {
	_, err := n.Handle().LinkByName(name)
	return err == nil
}

// findNetdev finds the VF's netdev wherever a finished, failed or killed
// ADD or DEL may have left it, the most specific place first:
//   - the pinned temporary netns, which never holds anything else;
//   - the pod netns: whose device is the VF (CNI_IFNAME first), else under
//     CNI_IFNAME or any name carrying the alias ADD set (the VF's host
//     name), for a netdev whose device cannot be told;
//   - the host netns: under a name sysfs lists for the VF (the kernel
//     returns a VF from a destroyed netns under whatever name it had
//     there), whose device is the VF, under CNI_IFNAME or any name with
//     that alias, or under its original name.
//
// A link found by a name or an alias is taken only when it is the VF's own
// (isVFNetdev): in the host netns by the kernel's word, elsewhere unless
// its device is known to be another. Nothing else is ever returned.
func (p *Plugin) findNetdev(st *State, host, pod, via *netns.NS) (*netns.NS, string) {
	if via != nil {
		links, _ := via.Handle().LinkList()
		for _, l := range links {
			if l.Attrs().Flags&net.FlagLoopback == 0 && p.isVFNetdev(via, l, st.PCIAddress, false) {
				return via, l.Attrs().Name
			}
		}
	}
	if pod != nil {
		// The kernel's word first: a link the pod dressed in the alias
		// is never taken while the VF's own netdev is there.
		if name := p.linkOf(pod, st.PCIAddress, st.IfName); name != "" {
			return pod, name
		}
		if name := p.withAlias(pod, st, st.IfName, false); name != "" {
			return pod, name
		}
	}
	h := host.Handle()
	ents, _ := os.ReadDir(filepath.Join(p.HostRoot, "sys/bus/pci/devices", st.PCIAddress, "net"))
	for _, e := range ents {
		if l, err := h.LinkByName(e.Name()); err == nil && p.isVFNetdev(host, l, st.PCIAddress, true) {
			return host, e.Name()
		}
	}
	if name := p.linkOf(host, st.PCIAddress); name != "" {
		return host, name
	}
	if name := p.withAlias(host, st, st.IfName, true); name != "" {
		return host, name
	}
	if l, err := h.LinkByName(st.HostName); st.HostName != "" && err == nil && p.isVFNetdev(host, l, st.PCIAddress, true) {
		return host, st.HostName
	}
	return nil, ""
}

// withAlias is the link in n (the host netns when host) whose alias is the
// VF's host name, which ADD sets in the pod, and that is the VF's own
// (isVFNetdev): the one named name first, else any; "" when the state has
// no host name.
func (p *Plugin) withAlias(n *netns.NS, st *State, name string, host bool) string {
	alias := st.HostName
	if alias == "" {
		return ""
	}
	h := n.Handle()
	if l, err := h.LinkByName(name); err == nil && l.Attrs().Alias == alias && p.isVFNetdev(n, l, st.PCIAddress, host) {
		return name
	}
	links, _ := h.LinkList()
	for _, l := range links {
		if l.Attrs().Alias == alias && p.isVFNetdev(n, l, st.PCIAddress, host) {
			return l.Attrs().Name
		}
	}
	return ""
}

// restoreInHost puts back, in place, the name, MAC, MTU and alias of the
// VF netdev found in the host netns as name, and returns the name it has
// now: its original one unless another link took that meanwhile.
func (p *Plugin) restoreInHost(log *slog.Logger, st *State, host *netns.NS, name string) (string, error) {
	h := host.Handle()
	l, err := h.LinkByName(name)
	if err != nil {
		return "", fmt.Errorf("look up %s: %w", name, err)
	}
	home := name
	switch {
	case st.HostName == "" || name == st.HostName:
	case taken(host, st.HostName):
		log.Warn("VF netdev's original name is taken on the host; it keeps the kernel's", "hostName", st.HostName, "name", name)
	default:
		if err := h.LinkSetDown(l); err != nil {
			return "", fmt.Errorf("set %s down: %w", name, err)
		}
		if err := h.LinkSetName(l, st.HostName); err != nil {
			return "", fmt.Errorf("rename %s to %s: %w", name, st.HostName, err)
		}
		home = st.HostName
		log.Info("VF netdev renamed to its original name", "from", name, "name", home)
	}
	a := l.Attrs()
	if mac, err := net.ParseMAC(st.HostMAC); st.PodMAC != "" && err == nil {
		if err := p.setNetdevMAC(st, h, home, mac); err != nil {
			return "", fmt.Errorf("restore MAC of %s: %w", home, err)
		}
	}
	if st.HostMTU != 0 && a.MTU != st.HostMTU {
		if err := h.LinkSetMTU(l, st.HostMTU); err != nil {
			return "", fmt.Errorf("restore MTU of %s: %w", home, err)
		}
	}
	if a.Alias != st.HostAlias {
		if err := h.LinkSetAlias(l, st.HostAlias); err != nil {
			return "", fmt.Errorf("restore alias of %s: %w", home, err)
		}
	}
	return home, nil
}

// setNetdevMAC sets the own MAC of the VF netdev named name, in the netns
// of h, to mac (nothing when it has it). A VF driver may refuse that
// change while the PF holds an administrative MAC for the VF: igb NACKs
// the VF's request (igb_rcv_msg_from_vf, igb_main.c), and igbvf falls
// back to the MAC the PF gave at its last reset (e1000_rar_set_vf,
// igbvf/vf.c) and answers EADDRNOTAVAIL (igbvf_set_mac). Such a driver
// takes the PF's MAC at its next reset, which closing the netdev does
// (igbvf_close -> igbvf_down -> igbvf_reset, igbvf/netdev.c). So on
// EADDRNOTAVAIL the netdev is closed (opened first when down, left as it
// was) and its MAC looked at again: the change is done if the PF holds
// mac for the VF, as it does once ADD set it there and once teardown put
// back a MAC the PF held.
func (p *Plugin) setNetdevMAC(st *State, h *netlink.Handle, name string, mac net.HardwareAddr) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if l.Attrs().HardwareAddr.String() == mac.String() {
		return nil
	}
	if p.VFDriver != nil {
		err = p.VFDriver.MACChange(st, mac)
	}
	if err == nil {
		err = h.LinkSetHardwareAddr(l, mac)
	}
	if !errors.Is(err, unix.EADDRNOTAVAIL) {
		return err
	}
	if rerr := p.resetVF(st, h, l); rerr != nil {
		return fmt.Errorf("%w; reset of the VF to take its PF's MAC: %w", err, rerr)
	}
	now, lerr := h.LinkByIndex(l.Attrs().Index)
	if lerr != nil {
		return fmt.Errorf("%w; look up %s after a reset of the VF: %w", err, name, lerr)
	}
	if got := now.Attrs().HardwareAddr.String(); got != mac.String() {
		return fmt.Errorf("%w (after a reset of the VF, which takes the MAC its PF holds for it, it has %s)", err, got)
	}
	return nil
}

// resetVF closes the VF netdev l (opening it first when it is down) and
// leaves it up or down as it was: closing resets an igbvf VF.
func (p *Plugin) resetVF(st *State, h *netlink.Handle, l netlink.Link) error {
	up := l.Attrs().Flags&net.FlagUp != 0
	if !up {
		if err := h.LinkSetUp(l); err != nil {
			return err
		}
	}
	if err := h.LinkSetDown(l); err != nil {
		return err
	}
	if p.VFDriver != nil {
		if err := p.VFDriver.Closed(st, h, l); err != nil {
			return err
		}
	}
	if up {
		return h.LinkSetUp(l)
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
