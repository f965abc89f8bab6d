package doctor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// VendorNVIDIA is the PCI vendor ID of NVIDIA GPUs.
const VendorNVIDIA = "10de"

// isGPU reports whether a PCI class is a display controller NVIDIA GPUs
// use: 3D controller (0x0302xx, data-centre GPUs) or VGA (0x0300xx).
func isGPU(class string) bool {
	return strings.HasPrefix(class, "0x0302") || strings.HasPrefix(class, "0x0300")
}

// Distances between a GPU and a NIC function, nearest first, as NCCL's
// topology names them.
const (
	distSwitch = iota // under one PCIe switch (PIX/PXB): GPUDirect RDMA
	distRoot          // same root complex, through the CPU (PHB)
	distNUMA          // same NUMA node, another root complex (NODE)
	distFar           // across the CPU interconnect (SYS)
)

var distWords = []string{"under its PCIe switch", "on its root complex only", "on its NUMA node only", "only on another NUMA node"}

func distance(g *pci.Function, d *nic.Device) int {
	for _, b := range d.UpstreamBridges {
		if slices.Contains(g.Bridges, b) {
			return distSwitch
		}
	}
	switch {
	case g.PCIeRoot != "" && g.PCIeRoot == d.PCIeRoot:
		return distRoot
	case g.NUMANode >= 0 && g.NUMANode == d.NUMANode:
		return distNUMA
	}
	return distFar
}

// checkGPUs: NCCL uses GPUDirect RDMA between a GPU and a NIC when they
// are close (NCCL_NET_GDR_LEVEL, by default under a common PCIe switch);
// a pod given VFs far from its GPUs stages every message through host
// memory.
func (h *host) checkGPUs() {
	const name = "gpu-affinity"
	fns, err := pci.New(h.root).Scan(func(f *pci.Function) bool { return f.Vendor == VendorNVIDIA })
	if err != nil {
		h.addf(name, Skip, "", "", "cannot list GPUs: %v", err)
		return
	}
	var gpus []pci.Function
	for _, f := range fns {
		if isGPU(f.Class) {
			gpus = append(gpus, f)
		}
	}
	if len(gpus) == 0 {
		h.add(name, Skip, "", "no NVIDIA GPU (vendor 10de, class 0302/0300) on this node", "")
		return
	}
	if h.opts.Config == nil {
		return
	}
	for _, p := range h.pools {
		if len(p.Devices) == 0 {
			continue
		}
		var far []string
		near := 0
		for i := range gpus {
			g := &gpus[i]
			best, count := distFar, 0
			for j := range p.Devices {
				switch d := distance(g, &p.Devices[j]); {
				case d < best:
					best, count = d, 1
				case d == best:
					count++
				}
			}
			if best == distSwitch {
				near += count
				continue
			}
			far = append(far, fmt.Sprintf("%s (NUMA %s): nearest %s", g.Address, numa(g.NUMANode), distWords[best]))
		}
		if len(far) == 0 {
			h.addf(name, OK, p.ResourceName(), "", "each of the %s has devices of the pool under its PCIe switch (%d in all): GPUDirect RDMA",
				plural(len(gpus), "GPU", "GPUs"), near)
			continue
		}
		h.addf(name, Warn, p.ResourceName(),
			"enable VFs on the NIC that shares each GPU's PCIe switch (its rail PF) and let the pool select them; a pod's VFs come from the pool, so a pool without near VFs gives every pod far ones",
			"no device of the pool under the PCIe switch of %d of %d GPUs — %s: NCCL cannot use GPUDirect RDMA for them (NCCL_NET_GDR_LEVEL) and stages traffic through host memory",
			len(far), len(gpus), words.List(far, 3))
	}
}

func numa(n int) string {
	if n < 0 {
		return "unknown"
	}
	return fmt.Sprint(n)
}
