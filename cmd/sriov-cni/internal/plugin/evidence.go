package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// A state file is evidence of what an ADD did, never an instruction: a
// file in the state dir may be stale, damaged or forged (a crash, an older
// version, a restored backup, an admin's mistake, an attack), and the
// teardown it drives renames links and sends settings to a PF as root.
// So nothing in a state acts until the kernel confirms it, by the VF's PCI
// address, which is the one thing a state is filed under:
//
//   - pciAddress is a VF: sysfs has it, with a physfn link;
//   - pfAddress, when given, is that physfn, and vfIndex is the N of the
//     PF's virtfnN link to the VF;
//   - pfNetdev, when given, is one of the PF's own netdevs (in the PF's
//     net/ directory, which lists the netdevs whose device link is the PF);
//   - rdmaDevice, when given and sysfs lists the VF's RDMA device, is that
//     one.
//
// A state that fails any of these (checkState) is set aside, as a damaged
// one is (<pci>.json.bad, with a log line naming the field and both
// values), and nothing it names is acted on: DEL, GC and ADD's reclaim
// restore instead what can be found by the PCI address alone
// (recoveryState: the netdev from sysfs or the pod, RDMA device from
// sysfs), so a real VF is never stranded by a bad file; what only the file
// knew (the VF's settings on the PF before ADD, its MTU and MAC) is lost
// with it. CHECK reports it as an error.
//
// Independently of the state, teardown touches (renames, moves, sets MTU,
// MAC or alias on) only a link that is the VF's own (isVFNetdev): in the
// host netns, the kernel must say so, by the link's parent device
// (IFLA_PARENT_DEV_NAME, or ethtool's bus-info before 5.15) or, for a link
// the kernel gives no parent, by sysfs listing its name in the VF's net/
// directory; a link that is not is left untouched and logged. A leftover
// <pci>.netns is opened only when it is a network namespace bound to the
// file and not the plugin's own (netns.OpenPin), and a state's netns that
// is the plugin's own is never taken for the pod's.

// errMismatch words a state field the kernel contradicts.
func errMismatch(field string, state, kernel any) error {
	return fmt.Errorf("%w: %s %v does not match the kernel's %v", ErrBadState, field, state, kernel)
}

// checkState checks st against sysfs under p.HostRoot (see above); every
// error wraps ErrBadState.
func (p *Plugin) checkState(st *State) error {
	d, err := nic.NewScanner(p.HostRoot).Device(st.PCIAddress)
	switch {
	case err != nil:
		return fmt.Errorf("%w: VF %s: %v", ErrBadState, st.PCIAddress, err)
	case !d.IsVF():
		return fmt.Errorf("%w: %s is not a VF (no physfn link)", ErrBadState, st.PCIAddress)
	case st.PFAddress != "" && st.PFAddress != d.PFAddress:
		return errMismatch("pfAddress", st.PFAddress, d.PFAddress)
	case d.VFIndex < 0:
		return fmt.Errorf("%w: PF %s does not list VF %s among its virtfnN links", ErrBadState, d.PFAddress, st.PCIAddress)
	case st.VFIndex != d.VFIndex:
		return errMismatch("vfIndex", st.VFIndex, d.VFIndex)
	case st.RDMADevice != "" && d.RDMADevice != "" && st.RDMADevice != d.RDMADevice:
		return errMismatch("rdmaDevice", st.RDMADevice, d.RDMADevice)
	}
	if st.PFNetdev != "" {
		// The PF's net/ lists the netdevs whose device link is the PF.
		_, err := os.Lstat(filepath.Join(p.HostRoot, "sys/bus/pci/devices", d.PFAddress, "net", st.PFNetdev))
		if errors.Is(err, fs.ErrNotExist) {
			return errMismatch("pfNetdev", st.PFNetdev, fmt.Sprintf("netdevs of PF %s (%s)", d.PFAddress, d.PFNetdev))
		}
		if err != nil {
			return fmt.Errorf("%w: pfNetdev %s: %v", ErrBadState, st.PFNetdev, err)
		}
	}
	return nil
}

// loadState is Store.Load and checkState: the state of vf only when the
// kernel confirms it; ErrBadState otherwise.
func (p *Plugin) loadState(store *Store, vf string) (*State, error) {
	st, err := store.Load(vf)
	if err != nil {
		return nil, err
	}
	if err := p.checkState(st); err != nil {
		return nil, fmt.Errorf("state %s: %w", store.path(vf), err)
	}
	return st, nil
}

// isVFNetdev reports whether l, a link in n, is the netdev of vf. In the
// host netns (host true) the kernel must say so: l's parent device is vf,
// or l has none the kernel names and sysfs lists its name among vf's
// netdevs (the same fact, as /sys/class/net/<name>/device). In a pod's or
// a pinned netns, a link of no known device (a virtual one, as the tests'
// stand-ins are) may be: only a link whose device is another is not.
func (p *Plugin) isVFNetdev(n *netns.NS, l netlink.Link, vf string, host bool) bool {
	dev := p.netdevPCI(n, l, true)
	switch {
	case dev != "":
		return dev == vf
	case !host:
		return true
	}
	_, err := os.Lstat(filepath.Join(p.HostRoot, "sys/bus/pci/devices", vf, "net", l.Attrs().Name))
	return err == nil
}

// podNetns opens the netns at path for teardown as the pod's: nil, logged,
// when it cannot be opened or is the plugin's own (the host's), which is
// never taken for a pod's.
func podNetns(log *slog.Logger, path string) *netns.NS {
	if path == "" {
		return nil
	}
	if own, err := netns.IsCurrent(path); err == nil && own {
		log.Warn("the attachment's netns is the plugin's own (the host's); not taken for the pod's", "netns", path)
		return nil
	}
	n, err := netns.Open(path)
	if err != nil {
		return nil
	}
	return n
}

// openPin opens the leftover <pci>.netns an older version pinned at path
// (netns.OpenPin): nil when there is none, or when it is not a network
// namespace bound to the file or is the plugin's own, which is logged and
// never followed.
func openPin(log *slog.Logger, path string) *netns.NS {
	n, err := netns.OpenPin(path)
	switch {
	case err == nil:
		return n
	case errors.Is(err, netns.ErrNotPin):
		log.Warn("leftover pinned netns ignored: not one this plugin made", "err", err)
	case !errors.Is(err, fs.ErrNotExist):
		log.Warn("leftover pinned netns unreadable; ignored", "err", err)
	}
	return nil
}
