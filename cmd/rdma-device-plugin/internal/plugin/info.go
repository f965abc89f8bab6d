package plugin

import (
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// DeviceInfo is one PCI function in PCIDEVICE_<PREFIX>_<NAME>_INFO, the
// device plugin's and the DRA driver's alike (NewDeviceInfo).
//
// Generic, RDMA and VFIO are what sriov-network-device-plugin puts there,
// under its info providers' names and keys (pkg/infoprovider: generic,
// rdma, vfio), so that a pod written for it (jq '.[].rdma.uverbs') reads
// the same value here; the other fields are fastpath's own.
type DeviceInfo struct {
	PCIAddress   string   `json:"pciAddress"`
	RDMADevice   string   `json:"rdmaDevice,omitempty"`
	CharDevices  []string `json:"charDevices,omitempty"`
	VFIODevices  []string `json:"vfioDevices,omitempty"`
	Netdev       string   `json:"netdev,omitempty"`
	PFPCIAddress string   `json:"pfPciAddress,omitempty"`
	PFNetdev     string   `json:"pfNetdev,omitempty"`
	LinkType     string   `json:"linkType,omitempty"`
	NUMANode     int      `json:"numaNode"`

	Generic GenericInfo `json:"generic"`
	RDMA    *RDMAInfo   `json:"rdma,omitempty"`
	VFIO    *VFIOInfo   `json:"vfio,omitempty"`
}

// GenericInfo is sriov-network-device-plugin's "generic" object, which it
// gives every device.
type GenericInfo struct {
	DeviceID string `json:"deviceID"` // the PCI address
}

// RDMAInfo is sriov-network-device-plugin's "rdma" object, for a function
// with an RDMA device: the container paths of its char devices and, as
// from its v3.10.0, the RDMA device's name. A char device the function
// lacks is left out, as there. Fields are in the order that plugin's map
// marshals its keys.
type RDMAInfo struct {
	Issm    string `json:"issm,omitempty"`
	RDMACM  string `json:"rdma_cm,omitempty"`
	RDMADev string `json:"rdma_dev,omitempty"`
	Umad    string `json:"umad,omitempty"`
	Uverbs  string `json:"uverbs,omitempty"`
}

// VFIOInfo is sriov-network-device-plugin's "vfio" object, for a function
// bound to vfio-pci: the container paths of /dev/vfio/vfio and of the
// function's IOMMU group.
type VFIOInfo struct {
	DevMount string `json:"dev-mount,omitempty"`
	Mount    string `json:"mount"`
}

// vfioContainer is the VFIO container device every vfio-pci function
// comes with.
const vfioContainer = "/dev/vfio/vfio"

// NewDeviceInfo is d's entry in PCIDEVICE_<PREFIX>_<NAME>_INFO; rdmaCM is
// the node's rdma_cm, "" when it has none (or the caller gives it no
// function).
func NewDeviceInfo(d *nic.Device, rdmaCM string) DeviceInfo {
	info := DeviceInfo{
		PCIAddress: d.PCIAddress, RDMADevice: d.RDMADevice, CharDevices: charDevicePaths(d, rdmaCM), VFIODevices: d.VFIODevices,
		Netdev: d.Netdev, PFPCIAddress: d.PFAddress, PFNetdev: d.PFNetdev, LinkType: d.LinkType, NUMANode: d.NUMANode,
		Generic: GenericInfo{DeviceID: d.PCIAddress},
	}
	if d.UsesRDMA() {
		r := &RDMAInfo{RDMADev: d.RDMADevice, RDMACM: rdmaCM}
		// The first of each kind: CharDevices are sorted by port, and an
		// mlx5 function has one.
		for _, c := range d.CharDevices {
			var f *string
			switch c.Kind {
			case rdma.KindUverbs:
				f = &r.Uverbs
			case rdma.KindUmad:
				f = &r.Umad
			case rdma.KindIssm:
				f = &r.Issm
			}
			if f != nil && *f == "" {
				*f = c.Path
			}
		}
		info.RDMA = r
	}
	if d.IsVFIO() {
		v := &VFIOInfo{Mount: vfioContainer}
		for _, p := range d.VFIODevices {
			if p != vfioContainer {
				v.DevMount = p
			}
		}
		info.VFIO = v
	}
	return info
}
