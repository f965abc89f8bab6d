// Package gpustandin is a stand-in GPU DRA driver for tests: it publishes
// a host's NVIDIA GPUs (PCI vendor 10de, display class) with the standard
// resource.kubernetes.io/pcieRoot, pciBusID and numaNode attributes, read
// with Kubernetes' own deviceattribute helper as a real GPU driver does,
// so that a claim can align a GPU with one of fastpath's VFs. No GPU is
// needed: the fixture hosts' sysfs lays them out as the kernel does.
package gpustandin

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
)

// DriverName is the stand-in's DRA driver.
const DriverName = "gpu.e2e.fastpath-k8s.io"

// VendorNVIDIA is the PCI vendor of the GPUs it publishes.
const VendorNVIDIA = "10de"

// GPU is one GPU of the host.
type GPU struct {
	PCIAddress string
	Device     resourceapi.Device
}

// DeviceName is a GPU's device name in the ResourceSlice: "gpu-0000-19-00-0".
func DeviceName(pciAddress string) string {
	return "gpu-" + strings.NewReplacer(":", "-", ".", "-").Replace(pciAddress)
}

// GPUs lists the NVIDIA display-class functions under root (root/sys), by
// PCI address, with their attributes. An attribute the helper cannot read
// is left out, as the DRA conventions want.
func GPUs(root string) ([]GPU, error) {
	sys := filepath.Join(root, "sys")
	dir := filepath.Join(sys, "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("gpustandin: %w", err)
	}
	var out []GPU
	for _, e := range entries {
		addr := e.Name()
		vendor, err1 := os.ReadFile(filepath.Join(dir, addr, "vendor"))
		class, err2 := os.ReadFile(filepath.Join(dir, addr, "class"))
		if err1 != nil || err2 != nil {
			continue
		}
		if strings.TrimSpace(string(vendor)) != "0x"+VendorNVIDIA || !strings.HasPrefix(strings.TrimSpace(string(class)), "0x03") {
			continue
		}
		fs := deviceattribute.WithFSFromRoot(sys)
		attrs := map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
		if a, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(addr, fs); err == nil {
			attrs[a.Name] = a.Value
		}
		if a, err := deviceattribute.GetPCIBusIDAttribute(addr); err == nil {
			attrs[a.Name] = a.Value
		}
		if a, err := deviceattribute.GetNUMANodeAttributeByPCIBusID(addr, deviceattribute.ScalarAttribute, fs); err == nil {
			attrs[a.Name] = a.Value
		}
		out = append(out, GPU{PCIAddress: addr, Device: resourceapi.Device{Name: DeviceName(addr), Attributes: attrs}})
	}
	slices.SortFunc(out, func(a, b GPU) int { return strings.Compare(a.PCIAddress, b.PCIAddress) })
	return out, nil
}
