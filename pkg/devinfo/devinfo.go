// Package devinfo writes k8snetworkplumbingwg device-info-spec
// (v1.1.0) files of type "pci": how the device plugin tells a CNI, and a CNI
// tells the pod, which PCI function and RDMA device an attachment uses.
package devinfo

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
)

// Version is the device-info-spec version written.
const Version = "1.1.0"

// Info is a device-info-spec document.
type Info struct {
	Type    string `json:"type"`
	Version string `json:"version"`
	PCI     *PCI   `json:"pci,omitempty"`
}

// PCI is the "pci" member of Info.
type PCI struct {
	PCIAddress   string `json:"pci-address"`
	RDMADevice   string `json:"rdma-device,omitempty"`
	PFPCIAddress string `json:"pf-pci-address,omitempty"`
}

// NewPCI returns a document for one PCI function.
func NewPCI(addr, rdmaDevice, pfAddr string) Info {
	return Info{Type: "pci", Version: Version, PCI: &PCI{PCIAddress: addr, RDMADevice: rdmaDevice, PFPCIAddress: pfAddr}}
}

// Write stores info at path atomically with mode perm.
func Write(path string, info Info, perm os.FileMode) error {
	data, err := json.Marshal(info)
	if err != nil {
		return fmt.Errorf("devinfo %s: %w", path, err)
	}
	if err := atomicfile.Write(path, data, perm); err != nil {
		return fmt.Errorf("devinfo: %w", err)
	}
	return nil
}
