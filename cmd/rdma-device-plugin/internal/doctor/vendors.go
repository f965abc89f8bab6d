package doctor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// connectX is the family of every Mellanox/NVIDIA function.
var connectX, _ = nic.FamilyOf("mlx5_core")

// isConnectX reports whether d is a Mellanox/NVIDIA function: its checks
// and fixes are the mlx5 ones, bound or not.
func isConnectX(d *nic.Device) bool { return d.Vendor == pci.VendorMellanox }

// familyOf is d's driver family: ConnectX for every Mellanox/NVIDIA
// function; for a VF the family of its PF's driver (a VF bound to
// vfio-pci or to nothing has none of its own, and iavf serves both E810
// and X710 VFs); otherwise the family of d's own driver. False for a
// driver no family has.
func (h *host) familyOf(d *nic.Device) (nic.Family, bool) {
	if isConnectX(d) {
		return connectX, true
	}
	if f, ok := h.families[d.PCIAddress]; ok {
		return f.Family, f.known
	}
	f, known := nic.FamilyOf(d.Driver)
	if d.IsVF() {
		if pf, ok := h.snap.Device(d.PFAddress); ok {
			if pff, ok := nic.FamilyOf(pf.Driver); ok {
				f, known = pff, true
			}
		}
	}
	if h.families == nil {
		h.families = map[string]family{}
	}
	h.families[d.PCIAddress] = family{f, known}
	return f, known
}

// family is a function's family as familyOf found it.
type family struct {
	nic.Family
	known bool
}

// mayHaveRDMA reports whether the kernel can give d an RDMA device:
// false only where d's family is known to give it none.
func (h *host) mayHaveRDMA(d *nic.Device) bool {
	f, ok := h.familyOf(d)
	return !ok || f.HasRDMA(d.IsVF())
}

// rdmaHint is what to check when d has no RDMA device: which module to
// load, or that the kernel gives it none.
func (h *host) rdmaHint(d *nic.Device) string {
	f, ok := h.familyOf(d)
	if !ok {
		return "is its vendor's RDMA driver loaded?"
	}
	return f.RDMAHint(d.IsVF())
}

// rdmaOffHint is what to look at when d's RDMA driver is loaded and d
// still has no RDMA device, by RDMA driver.
func rdmaOffHint(f nic.Family, addr string) string {
	switch f.RDMADriver {
	case "mlx5_ib":
		return "RDMA may be off for this function: devlink dev param show pci/" + addr + " name enable_rdma"
	case "irdma":
		return "RDMA may be off on this PF: devlink dev param show pci/" + addr + " name enable_roce (and enable_iwarp)"
	case "bnxt_re":
		return "the NIC's firmware may not give this function RoCE (bnxt_en adds the bnxt_en.rdma device bnxt_re binds to only when it does)"
	}
	return "check dmesg for " + f.RDMADriver + " errors"
}

// driverOf is the PCI driver d should be bound to as a netdevice: its
// family's PF or VF driver; "" when its family is unknown.
func (h *host) driverOf(d *nic.Device) string {
	f, ok := h.familyOf(d)
	switch {
	case !ok:
		return ""
	case d.IsVF():
		return f.VFDriver
	}
	return f.PFDriver
}

// bindFix is the command that binds d to its netdevice driver, for a
// function bound to nothing (other: "") or to other.
func (h *host) bindFix(d *nic.Device, other string) string {
	drv := h.driverOf(d)
	if other == "" {
		if drv == "" {
			return fmt.Sprintf("echo %s > /sys/bus/pci/drivers_probe (the kernel binds the driver its IDs match; keep sriov_drivers_autoprobe at 1 on its PF)", d.PCIAddress)
		}
		return fmt.Sprintf("echo %s > /sys/bus/pci/drivers/%s/bind (and keep sriov_drivers_autoprobe at 1 on its PF)", d.PCIAddress, drv)
	}
	bind := fmt.Sprintf("echo %s > /sys/bus/pci/drivers/%s/bind", d.PCIAddress, drv)
	if drv == "" {
		bind = fmt.Sprintf("echo %s > /sys/bus/pci/drivers_probe", d.PCIAddress)
	}
	return fmt.Sprintf("rebind it: echo %s > /sys/bus/pci/drivers/%s/unbind; %s (driverctl unset-override %s if driverctl pinned it)", d.PCIAddress, other, bind, d.PCIAddress)
}

// dmesgFix is where to look when a function of d's family has no netdev.
func (h *host) dmesgFix(d *nic.Device, addr string) string {
	drv := h.driverOf(d)
	if drv == "" {
		drv = "its driver's"
	}
	return "check dmesg for " + drv + " errors on " + addr
}

// wantsRDMA reports whether selector s of p takes only functions with an
// RDMA device: isRdma, or any selector of a shared pool.
func wantsRDMA(p *pool.Pool, s *pool.Selector) bool { return p.Kind == pool.Shared || s.IsRdma }

// selectsButRDMA reports whether s would select d if d had an RDMA
// device: s without isRdma, with d's link type read from its PCI class
// where it has no RDMA device to say.
func selectsButRDMA(s pool.Selector, d *nic.Device) bool {
	s.IsRdma = false
	c := *d
	if c.RDMADevice == "" && c.LinkType == "" {
		c.LinkType = classLinkType(d.Class)
	}
	return s.Matches(&c)
}

// neverServed is a pool's functions of one family that it would take but
// for an RDMA device the kernel never gives them.
type neverServed struct {
	family nic.Family
	vf     bool
	addrs  []string
}

// neverRDMA gathers, by family, the functions no pool holds that p would
// take but for an RDMA device their family never has: iavf VFs in an
// isRdma pool, igb functions anywhere RDMA is asked for.
func (h *host) neverRDMA(p *pool.Pool) []*neverServed {
	var out []*neverServed
	for i := range h.snap.Devices {
		d := &h.snap.Devices[i]
		if d.RDMADevice != "" || !candidate(p, d) || h.mayHaveRDMA(d) || h.inPool(d.PCIAddress) {
			continue
		}
		if !slices.ContainsFunc(p.Selectors, func(s pool.Selector) bool { return wantsRDMA(p, &s) && selectsButRDMA(s, d) }) {
			continue
		}
		f, _ := h.familyOf(d)
		k := slices.IndexFunc(out, func(n *neverServed) bool { return n.family.Name == f.Name && n.vf == d.IsVF() })
		if k < 0 {
			k = len(out)
			out = append(out, &neverServed{family: f, vf: d.IsVF()})
		}
		out[k].addrs = append(out[k].addrs, d.PCIAddress)
	}
	return out
}

// checkNeverRDMA says once per pool and family that the pool asks for
// RDMA devices a family's functions never have.
func (h *host) checkNeverRDMA(p *pool.Pool) {
	st := Warn
	if len(p.Devices) == 0 {
		st = Fail
	}
	asks := "asks for functions with an RDMA device (isRdma)"
	if p.Kind == pool.Shared {
		asks = "is a shared pool, which takes functions with an RDMA device only"
	}
	for _, n := range h.neverRDMA(p) {
		one, many := n.family.Name+" function", n.family.Name+" functions"
		if n.vf {
			one, many = n.family.Name+" VF", n.family.Name+" VFs"
		}
		fix := "drop isRdma from the pool meant for them (they serve Ethernet only), and give RDMA pods functions of a NIC with RDMA"
		switch {
		case p.Kind == pool.Shared:
			fix = "a shared pool shares RDMA devices: select functions of a NIC with RDMA, and serve these from an exclusive pool (resourceList) without isRdma"
		case n.family.RDMADriver != "":
			fix = fmt.Sprintf("for RDMA, share the %s PFs' RDMA devices through a shared pool (configList), or use a NIC whose VFs have RDMA; for Ethernet-only VFs, drop isRdma", n.family.PFDriver)
		}
		h.addf("pool", st, p.ResourceName(), fix,
			"%s %s, but %s it selects (%s) can never have one: %s — the pool can never be served on this NIC",
			p.ResourceName(), asks, plural(len(n.addrs), one, many), words.List(n.addrs, 4), n.family.NoRDMAReason())
	}
}

// planRDMA works out which RDMA drivers the node needs: mlx5_ib wherever
// it has ConnectX functions (as before other vendors were served); for
// another family, its RDMA driver where, without a config, one of its
// functions can have an RDMA device or, with one, a pool holds one of its
// functions with an RDMA device or asks for RDMA on one that can have it.
// rdmaCore says whether the RDMA core modules and char devices are
// checked at all: not on a node whose pools are all Ethernet.
func (h *host) planRDMA() {
	for i := range h.snap.Devices {
		d := &h.snap.Devices[i]
		used := d.RDMADevice != "" && (h.opts.Config == nil || h.inPool(d.PCIAddress))
		h.rdmaCore = h.rdmaCore || used
		f, ok := h.familyOf(d)
		if !ok || !f.HasRDMA(d.IsVF()) || slices.ContainsFunc(h.rdmaFamilies, func(g nic.Family) bool { return g.RDMADriver == f.RDMADriver }) {
			continue
		}
		if isConnectX(d) || used || h.opts.Config == nil || h.poolWantsRDMA(d) {
			h.rdmaFamilies = append(h.rdmaFamilies, f)
			h.rdmaCore = true
		}
	}
	slices.SortStableFunc(h.rdmaFamilies, func(a, b nic.Family) int {
		// mlx5_ib first, as the module checks have always listed it.
		return boolRank(a.Name != connectX.Name) - boolRank(b.Name != connectX.Name)
	})
}

func boolRank(b bool) int {
	if b {
		return 1
	}
	return 0
}

// poolWantsRDMA reports whether a pool would take d, given an RDMA
// device, where it takes only functions with one.
func (h *host) poolWantsRDMA(d *nic.Device) bool {
	for k := range h.pools {
		p := &h.pools[k]
		if candidate(p, d) && slices.ContainsFunc(p.Selectors, func(s pool.Selector) bool { return wantsRDMA(p, &s) && selectsButRDMA(s, d) }) {
			return true
		}
	}
	return false
}

// noRDMAFamilies names the families of the node that have no RDMA at all,
// for the note that the RDMA modules were not checked.
func (h *host) noRDMAFamilies() []string {
	var out []string
	for i := range h.snap.Devices {
		f, ok := h.familyOf(&h.snap.Devices[i])
		if ok && f.RDMADriver == "" {
			if s := f.Name + " (" + f.Drivers() + ")"; !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// rdmaDriverNames are the RDMA drivers the node needs, "mlx5_ib irdma".
func (h *host) rdmaDriverNames() string {
	var names []string
	for _, f := range h.rdmaFamilies {
		names = append(names, f.RDMADriver)
	}
	return strings.Join(names, " ")
}
