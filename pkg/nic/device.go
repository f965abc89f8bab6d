// Package nic is the joined host view of a node's NIC functions that the
// device plugin and the CNI share: every ConnectX PF and VF (with or
// without SR-IOV, bound to mlx5_core, vfio-pci or nothing), and every other
// vendor's SR-IOV PF and VF and function with an RDMA device, with its PF,
// VF index, netdev, RDMA device and char devices, joined from pkg/pci and
// pkg/rdma under an injected root.
package nic

import (
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// Device is one NIC function (a PF or a VF) as discovery saw
// it. Paths in CharDevices and VFIODevices are as seen on the host, without
// any --host-root prefix.
type Device struct {
	PCIAddress string `json:"pciAddress"`
	Vendor     string `json:"vendor"` // "15b3", "8086", no 0x
	DeviceID   string `json:"device"` // "101e", no 0x
	Class      string `json:"class"`  // "0x020700"
	Model      string `json:"model,omitempty"`
	Driver     string `json:"driver"`   // "" when unbound
	NUMANode   int    `json:"numaNode"` // -1 when unknown; a VF inherits its PF's
	// PFAddress is "" for a PF. VFIndex is -1 for a PF.
	PFAddress string `json:"pfAddress"`
	VFIndex   int    `json:"vfIndex"`
	// TotalVFs and NumVFs are the PF's sriov_totalvfs / sriov_numvfs (0 on VFs).
	TotalVFs int `json:"totalVFs,omitempty"`
	NumVFs   int `json:"numVFs,omitempty"`
	// Netdev is the function's own netdev (switchdev representors excluded), "" when none.
	Netdev string `json:"netdev"`
	// PFNetdev is the netdev of the PF (for a PF, its own).
	PFNetdev string `json:"pfNetdev,omitempty"`
	// LinkType is rdma.LinkLayerInfiniBand or rdma.LinkLayerEthernet: the
	// link layer of the RDMA device's first port or, for a function
	// without an RDMA device (vfio-pci, unbound, mlx5_ib not loaded), what
	// its PCI class says (0x0207xx InfiniBand, 0x0200xx Ethernet).
	LinkType   string `json:"linkType"`
	RDMADevice string `json:"rdmaDevice"`
	// CharDevices are the RDMA char devices that belong to RDMADevice
	// (uverbsN, umadN, issmN) and are present under /dev/infiniband. The
	// node-wide rdma_cm is not one of them: see Snapshot.RDMACM.
	CharDevices []rdma.CharDevice `json:"charDevices"`
	// IOMMUGroup and VFIODevices (/dev/vfio/vfio and /dev/vfio/<group>)
	// are set for functions bound to vfio-pci.
	IOMMUGroup  string   `json:"iommuGroup,omitempty"`
	VFIODevices []string `json:"vfioDevices,omitempty"`
	// UpstreamBridges are the PCI bridges above the function, nearest first.
	UpstreamBridges []string `json:"upstreamBridges,omitempty"`
	// PCIeRoot is the PCIe root complex the function hangs off, the value
	// of the Kubernetes standard device attribute
	// resource.kubernetes.io/pcieRoot ("pci0000:15"), "" when unknown
	// (see pci.Function.PCIeRoot).
	PCIeRoot string `json:"pcieRoot"`
}

// IsVF reports whether d is a virtual function.
func (d *Device) IsVF() bool { return d.PFAddress != "" }

// IsVFIO reports whether d is bound to vfio-pci.
func (d *Device) IsVFIO() bool { return d.Driver == pci.DriverVFIO }

// UsesRDMA reports whether d is used through its RDMA device: it has one
// and is not bound to vfio-pci. Such a function comes with rdma_cm and is
// named in NCCL_IB_HCA.
func (d *Device) UsesRDMA() bool { return d.RDMADevice != "" && !d.IsVFIO() }

// HasUverbs reports whether one of d's char devices is its uverbs, what
// a verbs application (NCCL) opens: without it an RDMA device hands out
// nothing usable (ib_uverbs not loaded, a driver reloading, a /dev that
// is not the node's).
func (d *Device) HasUverbs() bool {
	for _, c := range d.CharDevices {
		if c.Kind == rdma.KindUverbs {
			return true
		}
	}
	return false
}

// CharDevicePaths are the host paths of d's CharDevices.
func (d *Device) CharDevicePaths() []string {
	out := make([]string, len(d.CharDevices))
	for i, c := range d.CharDevices {
		out[i] = c.Path
	}
	return out
}
