package doctor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
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
// device ID from sriov_vf_device, bound to its family's VF driver
// (sriov_drivers_autoprobe), with an RDMA device when the PF has one and
// its family gives VFs one too.
func (h *host) wouldBeVF(pf *nic.Device) (nic.Device, bool) {
	id, err := read(h.sys("bus", "pci", "devices", pf.PCIAddress, "sriov_vf_device"))
	if err != nil || id == "" {
		return nic.Device{}, false
	}
	driver, rdmaDev := pf.Driver, pf.RDMADevice
	if f, ok := h.familyOf(pf); ok && !isConnectX(pf) {
		driver = f.VFDriver
		if !f.HasRDMA(true) {
			rdmaDev = ""
		}
	}
	return nic.Device{
		PCIAddress: pf.PCIAddress + "#0", Vendor: pf.Vendor, DeviceID: fmt.Sprintf("%04s", id), Class: pf.Class,
		Driver: driver, NUMANode: pf.NUMANode, PFAddress: pf.PCIAddress, VFIndex: 0,
		Netdev: "(vf netdev)", PFNetdev: pf.Netdev, LinkType: pf.LinkType, RDMADevice: rdmaDev,
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
					h.addf("sriov", Fail, pf.PCIAddress, firmwareFix(pf, 16),
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
	if h.pooled == nil {
		h.pooled = map[string]bool{}
		for _, p := range h.pools {
			for _, d := range p.Devices {
				h.pooled[d.PCIAddress] = true
			}
		}
	}
	return h.pooled[addr]
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// firmwareFix turns SR-IOV on in a PF's firmware: mlxconfig on ConnectX,
// the vendor's own tool and the BIOS elsewhere.
func firmwareFix(pf *nic.Device, vfs int) string {
	if isConnectX(pf) {
		return fmt.Sprintf("mlxconfig -d %s set SRIOV_EN=1 NUM_OF_VFS=%d, then a firmware reset or reboot", pf.PCIAddress, vfs)
	}
	return "enable SR-IOV for " + pf.PCIAddress + " in the server's BIOS/UEFI and in the NIC's firmware (its vendor's tool), then reboot"
}

// reason explains why a VF the pool expects is left out, from the
// selector fields it fails for lack of something, with the fix for its
// family.
func (h *host) reason(d *nic.Device, failed []string) (why, fix string) {
	rdmaFailed := slices.Contains(failed, "isRdma") || slices.Contains(failed, "linkTypes")
	switch {
	case d.Driver == "": // no driver, no netdev and no RDMA device either
		return "bound to no driver", h.bindFix(d, "")
	case slices.Contains(failed, "drivers"):
		return "bound to " + d.Driver + ", not the selector's driver", h.bindFix(d, d.Driver)
	case rdmaFailed && d.IsVFIO():
		// vfio-pci hands the whole function to user space: no RDMA
		// device however the RDMA driver is.
		return "bound to vfio-pci, which gives no RDMA device", h.bindFix(d, d.Driver)
	case rdmaFailed:
		f, ok := h.familyOf(d)
		if !ok {
			return "no RDMA device", "load its vendor's RDMA driver (rdma link show lists the RDMA devices the kernel made)"
		}
		return "no RDMA device", fmt.Sprintf("modprobe %s; if it is loaded, %s", f.RDMADriver, rdmaOffHint(f, d.PCIAddress))
	case slices.Contains(failed, "ifNames"):
		return "no netdev", h.dmesgFix(d, d.PCIAddress)
	}
	pf := d
	if p, ok := h.snap.Device(d.PFAddress); ok {
		pf = p
	}
	return "its PF has no netdev", h.dmesgFix(pf, d.PFAddress)
}

// checkExpectedVFs reports functions a pool would take but for
// something missing (a driver, an RDMA device, a netdev), grouped by what
// is missing, and VF indices a pool names that do not exist.
func (h *host) checkExpectedVFs() {
	type group struct {
		why          string
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
				failed, onlyMissing := h.rejection(s, d)
				if len(failed) == 0 && d.Driver == "" {
					failed = []string{"drivers"} // pool.Build leaves unbound functions out
				}
				if len(failed) == 0 || !onlyMissing {
					continue
				}
				why, fix := h.reason(d, failed)
				key := why
				if f, ok := h.familyOf(d); ok && f.Name != connectX.Name {
					key += " (" + f.Name + ")" // each family its own line, with its own fix
				}
				g := groups[key]
				if g == nil {
					g = &group{why: why, fix: fix, st: st}
					groups[key] = g
					order = append(order, key)
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
	for _, key := range order {
		g := groups[key]
		fix := g.fix
		if len(g.addrs) > 1 {
			fix = strings.ReplaceAll(fix, g.addrs[0], "<each>")
		}
		h.addf("sriov", g.st, words.List(g.addrs, 4), fix, "%s: %s — left out of %s", plural(len(g.addrs), "function", "functions"), g.why,
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
		var netdevFixes, rdmaDrivers []string
		hasRDMA := slices.ContainsFunc(p.Devices, func(d nic.Device) bool { return d.RDMADevice != "" })
		for i := range p.Devices {
			d := &p.Devices[i]
			if d.IsVFIO() {
				continue
			}
			if d.Netdev == "" && h.allocated[d.PCIAddress] == "" {
				noNetdev = append(noNetdev, d.PCIAddress)
				fix := "check dmesg for its driver's errors; rebind the VF to its netdevice driver (echo <pci> > /sys/bus/pci/drivers_probe)"
				if drv := h.driverOf(d); drv != "" {
					fix = "check dmesg for " + drv + " errors; rebind the VF to " + drv
				}
				if !slices.Contains(netdevFixes, fix) {
					netdevFixes = append(netdevFixes, fix)
				}
			}
			// A pool of functions that never have RDMA (igbvf, iavf) is
			// an Ethernet pool; one that mixes them with RDMA devices
			// hands some pods no HCA.
			if d.RDMADevice == "" && (hasRDMA || h.mayHaveRDMA(d)) {
				noRDMA = append(noRDMA, d.PCIAddress)
				if f, ok := h.familyOf(d); ok && f.HasRDMA(d.IsVF()) && !slices.Contains(rdmaDrivers, f.RDMADriver) {
					rdmaDrivers = append(rdmaDrivers, f.RDMADriver)
				}
			}
		}
		if len(noNetdev) > 0 {
			fix := strings.Join(netdevFixes, "; ")
			if len(noNetdev) == 1 {
				fix = strings.ReplaceAll(fix, "<pci>", noNetdev[0])
			}
			h.addf("sriov", Warn, words.List(noNetdev, 4), fix,
				"%s of %s: no netdev on the node, and no pod holds it (kubelet checkpoint): the CNI has nothing to move into a pod", plural(len(noNetdev), "VF", "VFs"), p.ResourceName())
		}
		if len(noRDMA) > 0 {
			fix := "add \"isRdma\": true to the pool's selector"
			if len(rdmaDrivers) > 0 {
				fix += ", and load " + strings.Join(rdmaDrivers, " and ")
			}
			h.addf("sriov", Warn, words.List(noRDMA, 4), fix,
				"%s of %s without an RDMA device: a pod given one gets no HCA and NCCL uses sockets", plural(len(noRDMA), "VF", "VFs"), p.ResourceName())
		}
	}
}
