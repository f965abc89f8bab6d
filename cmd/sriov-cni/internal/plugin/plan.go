package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// This file decides; it reads and changes nothing. ADD gathers what it
// needs to know (add.go), plans from it here, journals the plan, and only
// then applies it.

// verdict is what ADD does with a candidate VF, given its state file.
type verdict int

const (
	vfFree       verdict = iota // no attachment: take it
	vfStale                     // state from before the last boot: drop it, take the VF
	vfBadState                  // a state that cannot be trusted: set it aside, take the VF
	vfBusy                      // attached to another attachment: try the next candidate
	vfOwn                       // attached to this very attachment: ADD twice
	vfUnreadable                // the state cannot be read (I/O): fail
)

// judge decides about a candidate from its state (or the error loading it).
func judge(st *State, loadErr error, network, containerID, ifName, boot string) verdict {
	switch {
	case errors.Is(loadErr, fs.ErrNotExist):
		return vfFree
	case errors.Is(loadErr, ErrBadState):
		return vfBadState
	case loadErr != nil:
		return vfUnreadable
	case st.stale(boot):
		return vfStale
	case st.is(network, containerID, ifName):
		return vfOwn
	}
	return vfBusy
}

// ownerFacts is what ADD read about the attachment that holds a busy VF,
// to tell whether its pod is gone (reclaim.go reads them).
type ownerFacts struct {
	// NetnsErr is lstat's answer for the attachment's netns path.
	NetnsErr error
	// Netdev is the name under which the VF's netdev was found outside
	// every pod (teardown's search): in the host netns, or in the
	// plugin's own pinned temporary netns (InTemp); "" when in neither.
	Netdev string
	InTemp bool
}

// ownerVerdict is what ADD makes of the attachment that holds a VF.
type ownerVerdict int

const (
	ownerAlive ownerVerdict = iota // its netns is there, or that it is gone cannot be shown
	ownerHeld                      // its netns path is gone but the netns lives on: the VF stays
	ownerGone                      // its pod is gone without a DEL: tear it down, take the VF
)

// judgeOwner decides whether the attachment st, which holds a VF in this
// boot, is provably dead, and says why. Dead takes all of: the same boot
// (a state of an earlier one is dropped, not torn down), its netns path
// gone (ENOENT; any other answer, such as a permission error, proves
// nothing), and the VF's netdev back outside every pod — the kernel
// returns a physical VF to the host netns when its netns is destroyed, so
// a netdev still elsewhere means a process or an open fd keeps that netns
// alive. A vfio-pci VF has no netdev to show it, and stays held.
func judgeOwner(st *State, boot string, f ownerFacts) (ownerVerdict, string) {
	switch {
	case st.VFIO:
		return ownerAlive, "a vfio-pci VF has no netdev to show that its pod is gone"
	case boot == "" || st.BootID != boot:
		return ownerAlive, "the boot it was attached in cannot be told"
	case st.Netns == "":
		return ownerAlive, "no netns recorded"
	case f.NetnsErr == nil:
		return ownerAlive, fmt.Sprintf("its netns %s is there", st.Netns)
	case !errors.Is(f.NetnsErr, fs.ErrNotExist):
		return ownerAlive, fmt.Sprintf("its netns %s cannot be checked: %v", st.Netns, f.NetnsErr)
	case f.Netdev == "":
		return ownerHeld, fmt.Sprintf("its netns %s is gone, but the VF's netdev is not back in the host netns: "+
			"a process or an open fd still holds that netns (lsns -t net finds it)", st.Netns)
	case f.InTemp:
		return ownerGone, fmt.Sprintf("its netns %s is gone and the VF's netdev is in the plugin's temporary netns, in no pod", st.Netns)
	}
	return ownerGone, fmt.Sprintf("its netns %s is gone and the VF's netdev is back in the host netns as %s", st.Netns, f.Netdev)
}

// addFacts is what ADD read about the node, before changing anything. A
// read that did not apply is left zero.
type addFacts struct {
	VF        string
	HostRoot  string
	BootID    string
	Device    nic.Device
	DeviceErr error
	// RDMAMode is the RDMA netns mode, read when the VF has an RDMA device.
	RDMAMode    string
	RDMAModeErr error
	// HostLink is the VF's netdev in the host netns, looked up by the name
	// sysfs gives.
	HostLink    *netlink.LinkAttrs
	HostLinkErr error
	// VFOrig is the VF's settings on the PF, read when the conf changes
	// some.
	VFOrig    *sriov.VFConfig
	VFOrigErr error
	// GUID is the VF's current GUID (sysfs node_guid), read when the conf
	// sets one; "" when unknown.
	GUID string
}

// note is a line to log.
type note struct {
	level slog.Level
	msg   string
	args  []any
}

// addPlan is what ADD will do: the first journal entry, and the VF
// settings to apply in order.
type addPlan struct {
	State    *State
	Device   nic.Device
	Settings []sriov.Setting
	Notes    []note
}

// planAdd checks the conf against the VF and decides every step of the
// attachment. Every refusal happens here, before anything changes.
func planAdd(c *NetConf, args *skel.CmdArgs, f *addFacts) (*addPlan, error) {
	vf := f.VF
	if f.DeviceErr != nil {
		if errors.Is(f.DeviceErr, pci.ErrNotFound) {
			return nil, fail(types.ErrInvalidNetworkConfig, vf, "read sysfs", fmt.Errorf("%w under %s", f.DeviceErr, filepath.Join(f.HostRoot, "sys/bus/pci/devices")))
		}
		return nil, fail(0, vf, "read sysfs", f.DeviceErr)
	}
	d := &f.Device
	if !d.IsVF() {
		return nil, fail(types.ErrInvalidNetworkConfig, vf, "check device", errors.New("is a PF, not a VF: give a VF's PCI address (the device plugin's mlnx_sriov_rdma pools hand out VFs)"))
	}
	if err := checkDevice(c, d); err != nil {
		return nil, fail(types.ErrInvalidNetworkConfig, vf, "check conf against the device", err)
	}
	if c.vf.Any() && d.PFNetdev == "" {
		return nil, fail(types.ErrInvalidNetworkConfig, vf, "check device", fmt.Errorf("VF settings need the PF's netdev, and PF %s has none", d.PFAddress))
	}
	plan := &addPlan{Device: *d}
	moveRDMA, n, err := rdmaPlan(c, d, f.RDMAMode, f.RDMAModeErr)
	if err != nil {
		return nil, fail(0, vf, "RDMA", err)
	}
	if n != nil {
		plan.Notes = append(plan.Notes, *n)
	}

	st := &State{
		Phase: PhaseAdding, BootID: f.BootID, Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
		PCIAddress: vf, PFAddress: d.PFAddress, PFNetdev: d.PFNetdev, VFIndex: d.VFIndex,
		LinkType: d.LinkType, VFIO: d.IsVFIO(), IPAMType: c.IPAM.Type,
	}
	if !d.IsVFIO() {
		if d.Netdev == "" {
			return nil, fail(0, vf, "find netdev", fmt.Errorf("no netdev under %s: is the VF attached to another pod, or its driver not bound?", filepath.Join(f.HostRoot, "sys/bus/pci/devices", vf, "net")))
		}
		if f.HostLink == nil {
			return nil, fail(0, vf, "find netdev", fmt.Errorf("%s is not in the host netns (attached to another pod?): %w", d.Netdev, f.HostLinkErr))
		}
		a := f.HostLink
		st.HostName, st.HostMAC, st.HostMTU, st.HostAlias = a.Name, a.HardwareAddr.String(), a.MTU, a.Alias
		st.HostUp = a.Flags&net.FlagUp != 0
		st.PodMTU = a.MTU
		if c.MTU != nil {
			st.PodMTU = *c.MTU
		}
		if c.vf.MAC != nil {
			st.PodMAC = c.vf.MAC.String()
		}
		if moveRDMA {
			st.RDMADevice = d.RDMADevice
		}
	}
	if c.vf.Any() {
		if f.VFOrigErr != nil || f.VFOrig == nil {
			return nil, fail(0, vf, "read VF settings on PF "+d.PFNetdev, f.VFOrigErr)
		}
		orig := *f.VFOrig
		if c.vf.GUID != nil {
			if f.GUID == "" {
				return nil, fail(types.ErrInvalidNetworkConfig, vf, "check conf against the device",
					errors.New("guid: the VF's current GUID cannot be read (its RDMA device's node_guid), so DEL could not put it back"))
			}
			orig.GUID = f.GUID
		}
		if _, _, err := c.vf.TxRate(&orig); err != nil && (c.vf.MinTxRate != nil || c.vf.MaxTxRate != nil) {
			return nil, fail(types.ErrInvalidNetworkConfig, vf, "check conf against the VF's settings on PF "+d.PFNetdev, err)
		}
		st.VFOrig = &orig
		plan.Settings = c.vf.Changes()
	}
	plan.State = st
	return plan, nil
}

// checkDevice checks the conf against what the VF is.
func checkDevice(c *NetConf, d *nic.Device) error {
	ib := d.LinkType == rdma.LinkLayerInfiniBand
	switch {
	case ib && c.vf.MAC != nil:
		return errors.New("an InfiniBand VF has no Ethernet MAC to set: set guid (or runtimeConfig.infinibandGUID) instead of mac")
	case !ib && d.LinkType != "" && c.vf.GUID != nil:
		return fmt.Errorf("guid is for InfiniBand VFs; this one's link layer is %s", d.LinkType)
	case ib && (c.vf.Vlan != nil || c.vf.VlanProto != nil):
		return errors.New("an InfiniBand VF has no VLAN: use a partition key on the subnet manager instead of vlan")
	case d.IsVFIO() && c.MTU != nil:
		return fmt.Errorf("the VF is bound to %s (no netdev): mtu cannot apply", pci.DriverVFIO)
	}
	return nil
}

// rdmaPlan decides whether the VF's RDMA device moves with the netdev,
// from the RDMA netns mode (or the error reading it).
func rdmaPlan(c *NetConf, d *nic.Device, mode string, modeErr error) (bool, *note, error) {
	if d.IsVFIO() {
		return false, nil, nil
	}
	if d.RDMADevice == "" {
		if c.RDMAIsolation {
			return false, nil, fmt.Errorf("rdmaIsolation is set but the VF (%s) has no RDMA device (%s)", d.Driver, nic.RDMAHint(d.Driver))
		}
		return false, nil, nil
	}
	switch {
	case modeErr != nil && c.RDMAIsolation:
		return false, nil, fmt.Errorf("rdmaIsolation is set but the RDMA netns mode cannot be read: %w", modeErr)
	case modeErr != nil:
		return false, &note{slog.LevelWarn, "RDMA device not moved: RDMA netns mode unknown; it stays visible in the host netns",
			[]any{"rdma", d.RDMADevice, "err", modeErr}}, nil
	case mode == RDMAModeExclusive:
		return true, nil, nil
	case c.RDMAIsolation:
		return false, nil, fmt.Errorf("rdmaIsolation is set but the RDMA subsystem is in %q netns mode: run `rdma system set netns exclusive` (before any pod starts)", mode)
	}
	return false, &note{slog.LevelInfo, "RDMA device left in place: RDMA netns mode is shared, every netns sees it",
		[]any{"rdma", d.RDMADevice, "mode", mode}}, nil
}
