package nic

// Family is a NIC driver family as fastpath knows it: the netdevice
// drivers of its PFs and VFs and the kernel module that gives them RDMA
// devices. Discovery serves functions of any vendor and driver; a family
// only adds the right hint to a warning (which module to load) and tells
// the doctor which modules a node with such functions needs.
type Family struct {
	Name string // "ConnectX", "Intel E810"
	// PFDriver and VFDriver are the PCI drivers of the family's PFs and
	// netdevice VFs (one driver for both on ConnectX and Broadcom).
	PFDriver, VFDriver string
	// RDMADriver is the module that creates the RDMA devices of the
	// family's functions, "" where the family has none in the kernel
	// (igb, ixgbe). VFRDMA says whether its VFs get one too.
	RDMADriver string
	VFRDMA     bool
}

// families are the in-tree drivers of SR-IOV NICs that fastpath has been
// checked against: ConnectX in the fixtures and on users' nodes, igb in
// the real-kernel guest (make e2e-kernel), the others from the kernel
// sources (see docs/vendors.md for where each puts its RDMA device).
var families = []Family{
	{Name: "ConnectX", PFDriver: "mlx5_core", VFDriver: "mlx5_core", RDMADriver: "mlx5_ib", VFRDMA: true},
	{Name: "Intel E810", PFDriver: "ice", VFDriver: "iavf", RDMADriver: "irdma"},
	{Name: "Intel X710", PFDriver: "i40e", VFDriver: "iavf", RDMADriver: "irdma"},
	{Name: "Broadcom NetXtreme-E", PFDriver: "bnxt_en", VFDriver: "bnxt_en", RDMADriver: "bnxt_re", VFRDMA: true},
	{Name: "Intel 82599/X540/X550", PFDriver: "ixgbe", VFDriver: "ixgbevf"},
	{Name: "Intel 82576/I350", PFDriver: "igb", VFDriver: "igbvf"},
}

// FamilyOf returns the family of a function bound to driver: a PF
// driver, or a VF driver of a family whose VF driver is its own (iavf
// serves E810 and X710 VFs alike: it names the first). False for a
// driver no family has (vfio-pci, none, an unknown vendor's).
func FamilyOf(driver string) (Family, bool) {
	for _, f := range families {
		if f.PFDriver == driver || f.VFDriver == driver {
			return f, true
		}
	}
	return Family{}, false
}

// RDMAHint is what to check when a function bound to driver has no RDMA
// device: the module to load, or why the kernel gives it none. A driver
// that is a family's VF driver alone (iavf, igbvf) is taken as a VF's.
func RDMAHint(driver string) string {
	f, ok := FamilyOf(driver)
	if !ok {
		return "is its vendor's RDMA driver loaded?"
	}
	return f.RDMAHint(driver == f.VFDriver && driver != f.PFDriver)
}

// RDMAHint is what to check when a PF (vf false) or VF of f has no RDMA
// device: the module to load, or why the kernel gives it none.
func (f Family) RDMAHint(vf bool) string {
	if f.HasRDMA(vf) {
		return "is " + f.RDMADriver + " loaded?"
	}
	return f.NoRDMAReason()
}

// NoRDMAReason says why the kernel gives no RDMA device to f's functions
// (all of them, or its VFs, where HasRDMA says so).
func (f Family) NoRDMAReason() string {
	if f.RDMADriver == "" {
		return f.Name + " functions (" + f.Drivers() + ") have no RDMA in the kernel"
	}
	return f.RDMADriver + " gives RDMA devices to " + f.PFDriver + " PFs only, not to their VFs (" + f.VFDriver + ")"
}

// Drivers are f's PCI drivers as a user knows them: "igb, igbvf",
// "bnxt_en".
func (f Family) Drivers() string {
	if f.VFDriver == f.PFDriver {
		return f.PFDriver
	}
	return f.PFDriver + ", " + f.VFDriver
}

// HasRDMA reports whether the kernel gives a function of the family an
// RDMA device once its RDMA driver is loaded: a PF where the family has
// an RDMA driver, a VF where that driver serves VFs too (ConnectX and
// Broadcom; not the iavf VFs of E810 and X710 in 6.12, and nothing of
// igb or ixgbe).
func (f Family) HasRDMA(vf bool) bool {
	return f.RDMADriver != "" && (!vf || f.VFRDMA)
}
