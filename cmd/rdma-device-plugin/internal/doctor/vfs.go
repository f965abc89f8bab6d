package doctor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// named reports whether a selector of p names the PF (by netdev in
// pfNames or address in rootDevices).
func named(p *pool.Pool, pf *nic.Device) bool {
	for _, s := range p.Selectors {
		for _, set := range append(slices.Clone(s.PFNames), s.RootDevices...) {
			if set.PF == pf.PCIAddress || (pf.Netdev != "" && set.PF == pf.Netdev) {
				return true
			}
		}
	}
	return false
}

// wouldBeVF is the VF a PF would have once sriov_numvfs is raised: its
// device ID from sriov_vf_device, bound like its PF (sriov_drivers_autoprobe),
// with an RDMA device when the PF has one.
func (h *host) wouldBeVF(pf *nic.Device) (nic.Device, bool) {
	id, err := read(h.sys("bus", "pci", "devices", pf.PCIAddress, "sriov_vf_device"))
	if err != nil || id == "" {
		return nic.Device{}, false
	}
	return nic.Device{
		PCIAddress: pf.PCIAddress + "#0", Vendor: pf.Vendor, DeviceID: fmt.Sprintf("%04s", id), Class: pf.Class,
		Driver: pf.Driver, NUMANode: pf.NUMANode, PFAddress: pf.PCIAddress, VFIndex: 0,
		Netdev: "(vf netdev)", PFNetdev: pf.Netdev, LinkType: pf.LinkType, RDMADevice: pf.RDMADevice,
	}, true
}

// hasVFsIn reports whether a PF of the same model and link type as pf
// has VFs in p: rails are built alike, so one without VFs is a mistake.
func hasVFsIn(p *pool.Pool, pf *nic.Device, snap *nic.Snapshot) bool {
	for _, d := range p.Devices {
		if !d.IsVF() {
			continue
		}
		if peer, ok := snap.Device(d.PFAddress); ok && peer.DeviceID == pf.DeviceID && peer.LinkType == pf.LinkType {
			return true
		}
	}
	return false
}

func (h *host) checkVFs() {
	if h.opts.Config == nil {
		return
	}
	for i := range h.snap.Devices {
		pf := &h.snap.Devices[i]
		if pf.IsVF() {
			continue
		}
		for k := range h.pools {
			p := &h.pools[k]
			if p.Kind != pool.Exclusive {
				continue
			}
			isNamed := named(p, pf)
			if pf.TotalVFs == 0 {
				if isNamed {
					h.addf("sriov", Fail, pf.PCIAddress, fmt.Sprintf("mlxconfig -d %s set SRIOV_EN=1 NUM_OF_VFS=16, then a firmware reset or reboot", pf.PCIAddress),
						"%s names this PF, but it has no SR-IOV capability (sriov_totalvfs missing): SR-IOV is off in its firmware", p.ResourceName())
				}
				continue
			}
			if pf.NumVFs > 0 {
				continue
			}
			vf, ok := h.wouldBeVF(pf)
			if !ok || !slices.ContainsFunc(p.Selectors, func(s pool.Selector) bool { return s.Matches(&vf) }) {
				continue
			}
			if len(p.Devices) > 0 && !isNamed && !hasVFsIn(p, pf, h.snap) {
				continue // another kind of NIC the selector would also take (a storage NIC): not meant for VFs
			}
			st := Warn
			if len(p.Devices) == 0 || isNamed {
				st = Fail
			}
			h.addf("sriov", st, pf.PCIAddress+" ("+orDash(pf.Netdev)+")",
				fmt.Sprintf("echo N > /sys/bus/pci/devices/%s/sriov_numvfs (N <= %d), from the node's provisioning (udev rule or systemd unit) so that it survives a reboot, or let the plugin create them from a SriovNetworkNodePolicy (--policy, deployments/components/provision)", pf.PCIAddress, pf.TotalVFs),
				"sriov_numvfs is 0 (of %d): %s would take this PF's VFs but it has none", pf.TotalVFs, p.ResourceName())
		}
	}
	h.checkExpectedVFs()
	h.checkPoolVFs()
}

// inPool reports whether any pool holds the function at addr.
func (h *host) inPool(addr string) bool {
	for _, p := range h.pools {
		if slices.ContainsFunc(p.Devices, func(d nic.Device) bool { return d.PCIAddress == addr }) {
			return true
		}
	}
	return false
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// reason explains why a VF the pool expects is left out, from the
// selector fields it fails for lack of something.
func reason(d *nic.Device, failed []string) (why, fix string) {
	switch {
	case slices.Contains(failed, "drivers") && d.Driver == "":
		return "bound to no driver", fmt.Sprintf("echo %s > /sys/bus/pci/drivers/mlx5_core/bind (and keep sriov_drivers_autoprobe at 1 on its PF)", d.PCIAddress)
	case slices.Contains(failed, "drivers"):
		return "bound to " + d.Driver + ", not the selector's driver",
			fmt.Sprintf("rebind it: echo %s > /sys/bus/pci/drivers/%s/unbind; echo %s > /sys/bus/pci/drivers/mlx5_core/bind (driverctl unset-override %s if driverctl pinned it)", d.PCIAddress, d.Driver, d.PCIAddress, d.PCIAddress)
	case slices.Contains(failed, "isRdma") || slices.Contains(failed, "linkTypes"):
		return "no RDMA device", fmt.Sprintf("modprobe mlx5_ib; if it is loaded, RDMA may be off for this function: devlink dev param show pci/%s name enable_rdma", d.PCIAddress)
	case slices.Contains(failed, "ifNames"):
		return "no netdev", "check dmesg for mlx5_core errors on " + d.PCIAddress
	}
	return "its PF has no netdev", "check dmesg for mlx5_core errors on " + d.PFAddress
}

// checkExpectedVFs reports functions a pool would take but for
// something missing (a driver, an RDMA device, a netdev), grouped by what
// is missing, and VF indices a pool names that do not exist.
func (h *host) checkExpectedVFs() {
	type group struct {
		addrs, pools []string
		fix          string
		st           Status
	}
	groups := map[string]*group{}
	var order []string
	for k := range h.pools {
		p := &h.pools[k]
		st := Warn
		if len(p.Devices) == 0 {
			st = Fail
		}
		for i := range h.snap.Devices {
			d := &h.snap.Devices[i]
			if !candidate(p, d) || h.inPool(d.PCIAddress) {
				continue
			}
			for _, s := range p.Selectors {
				failed, onlyMissing := rejection(s, d)
				if len(failed) == 0 && d.Driver == "" {
					failed = []string{"drivers"} // pool.Build leaves unbound functions out
				}
				if len(failed) == 0 || !onlyMissing {
					continue
				}
				why, fix := reason(d, failed)
				g := groups[why]
				if g == nil {
					g = &group{fix: fix, st: st}
					groups[why] = g
					order = append(order, why)
				}
				if !slices.Contains(g.addrs, d.PCIAddress) {
					g.addrs = append(g.addrs, d.PCIAddress)
				}
				if !slices.Contains(g.pools, p.ResourceName()) {
					g.pools = append(g.pools, p.ResourceName())
				}
				if st == Fail {
					g.st = Fail
				}
				break
			}
		}
		h.checkVFRanges(p, st)
	}
	for _, why := range order {
		g := groups[why]
		fix := g.fix
		if len(g.addrs) > 1 {
			fix = strings.ReplaceAll(fix, g.addrs[0], "<each>")
		}
		h.addf("sriov", g.st, list(g.addrs, 4), fix, "%s: %s — left out of %s", plural(len(g.addrs), "function", "functions"), why,
			strings.Join(g.pools, " and "))
	}
}

// checkVFRanges reports VF indices a pool's pfNames/rootDevices ranges
// name that the PF does not have.
func (h *host) checkVFRanges(p *pool.Pool, st Status) {
	for _, s := range p.Selectors {
		for _, set := range append(slices.Clone(s.PFNames), s.RootDevices...) {
			var pf *nic.Device
			for i := range h.snap.Devices {
				d := &h.snap.Devices[i]
				if !d.IsVF() && (d.PCIAddress == set.PF || d.Netdev == set.PF) {
					pf = d
				}
			}
			if pf == nil || set.Ranges == nil || pf.NumVFs == 0 {
				continue // no such PF (the selector check says so) or no VFs (the numvfs check does)
			}
			hi := 0
			for _, r := range set.Ranges {
				hi = max(hi, r[1])
			}
			if hi >= pf.NumVFs {
				h.addf("sriov", st, set.PF, fmt.Sprintf("raise sriov_numvfs of %s to %d (<= %d), or narrow the range", pf.PCIAddress, hi+1, pf.TotalVFs),
					"%s expects VFs up to index %d of %s, which has %s (sriov_numvfs %d)", p.ResourceName(), hi, set.PF, plural(pf.NumVFs, "VF", "VFs"), pf.NumVFs)
			}
		}
	}
}

// checkPoolVFs reports a pool's own VFs that lack what a pod needs: a
// netdev for the CNI to move (unless a pod holds it already), an RDMA
// device for NCCL.
func (h *host) checkPoolVFs() {
	for k := range h.pools {
		p := &h.pools[k]
		if p.Kind != pool.Exclusive {
			continue
		}
		var noNetdev, noRDMA []string
		for _, d := range p.Devices {
			if d.IsVFIO() {
				continue
			}
			if d.Netdev == "" && h.allocated[d.PCIAddress] == "" {
				noNetdev = append(noNetdev, d.PCIAddress)
			}
			if d.RDMADevice == "" {
				noRDMA = append(noRDMA, d.PCIAddress)
			}
		}
		if len(noNetdev) > 0 {
			h.addf("sriov", Warn, list(noNetdev, 4), "check dmesg for mlx5_core errors; rebind the VF to mlx5_core",
				"%s of %s: no netdev on the node, and no pod holds it (kubelet checkpoint): the CNI has nothing to move into a pod", plural(len(noNetdev), "VF", "VFs"), p.ResourceName())
		}
		if len(noRDMA) > 0 {
			h.addf("sriov", Warn, list(noRDMA, 4), "add \"isRdma\": true to the pool's selector, and load mlx5_ib",
				"%s of %s without an RDMA device: a pod given one gets no HCA and NCCL uses sockets", plural(len(noRDMA), "VF", "VFs"), p.ResourceName())
		}
	}
}
