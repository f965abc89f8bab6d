package pool

import (
	"errors"
	"fmt"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// Selector matches functions; every field that is set must match (a field
// matches when any of its values does).
type Selector struct {
	Vendors      []string // "15b3", "8086"
	Devices      []string // PCI device IDs, "101e"
	Drivers      []string
	PCIAddresses []string
	PFNames      []VFSet // VFs of the PF with this netdev
	RootDevices  []VFSet // VFs of the PF at this PCI address
	IfNames      []string
	LinkTypes    []string // rdma.LinkLayerInfiniBand or rdma.LinkLayerEthernet
	IsRdma       bool     // only functions with an RDMA device
	// NotDrivers are drivers whose functions never match: a policy's
	// netdevice pool takes VFs on whatever driver their IDs select
	// (mlx5_core, iavf, igbvf, bnxt_en, …) but vfio-pci. Not a config key.
	NotDrivers []string
}

// VFSet is a PF (by netdev name or PCI address) and, optionally, which of
// its VFs: "ens2f0#0-11" or "0000:86:00.0#0,2-7".
type VFSet struct {
	PF string
	// Ranges are inclusive VF index ranges; nil means every VF.
	Ranges [][2]int
}

// Contains reports whether VF index i is in the set.
func (s VFSet) Contains(i int) bool {
	if s.Ranges == nil {
		return true
	}
	for _, r := range s.Ranges {
		if i >= r[0] && i <= r[1] {
			return true
		}
	}
	return false
}

func (s *Selector) empty() bool {
	return len(s.Vendors) == 0 && len(s.Devices) == 0 && len(s.Drivers) == 0 && len(s.NotDrivers) == 0 && len(s.PCIAddresses) == 0 &&
		len(s.PFNames) == 0 && len(s.RootDevices) == 0 && len(s.IfNames) == 0 && len(s.LinkTypes) == 0 && !s.IsRdma
}

// notDrivers are kernel modules people put in "drivers" that no PCI
// function is ever bound to.
var notDrivers = map[string]string{
	"mlx5_ib":   "mlx5_ib is the RDMA module, not a PCI driver",
	"mlx5_en":   "mlx5_en is part of mlx5_core, not a PCI driver",
	"ib_uverbs": "ib_uverbs is the RDMA verbs module, not a PCI driver",
	"ib_core":   "ib_core is the RDMA core module, not a PCI driver",
	"rdma_ucm":  "rdma_ucm is the RDMA CM module, not a PCI driver",
	"mlx4_ib":   "mlx4_ib is the RDMA module, not a PCI driver",
	// The RDMA drivers of other vendors bind to auxiliary devices of
	// their NIC driver's (ice, bnxt_en), never to a PCI function.
	"irdma":    "irdma is Intel's RDMA module (an auxiliary driver of ice), not a PCI driver",
	"bnxt_re":  "bnxt_re is Broadcom's RDMA module (an auxiliary driver of bnxt_en), not a PCI driver",
	"rdma_rxe": "rdma_rxe is soft-RoCE over a netdev, not a PCI driver",
	"siw":      "siw is soft-iWARP over a netdev, not a PCI driver",
}

func selector(f map[string]*value, cfg *Config) (Selector, error) {
	var s Selector
	var err error
	if v := f["vendors"]; v != nil {
		if s.Vendors, err = hexIDs(v); err != nil {
			return s, err
		}
		for i, id := range s.Vendors {
			// PCI reserves both: 0xffff is what a read of an absent
			// function returns, 0x0000 no vendor has.
			if id == "ffff" || id == "0000" {
				return s, fmt.Errorf("%s[%d]: %q can never match: no PCI function has vendor ID %s (want the NIC's vendor, e.g. 15b3 Mellanox/NVIDIA, 8086 Intel, 14e4 Broadcom)", v.path, i, id, id)
			}
		}
	}
	for _, k := range []string{"devices", "deviceIDs"} {
		if v := f[k]; v != nil {
			if s.Devices, err = hexIDs(v); err != nil {
				return s, err
			}
		}
	}
	if v := f["drivers"]; v != nil {
		if s.Drivers, err = v.strings(); err != nil {
			return s, err
		}
		for i, d := range s.Drivers {
			if why, ok := notDrivers[d]; ok {
				return s, fmt.Errorf("%s[%d]: %q can never match: %s; a VF is bound to its netdevice driver (mlx5_core, iavf, igbvf, bnxt_en) or to vfio-pci (DPDK)", v.path, i, d, why)
			}
			if d == "" {
				return s, fmt.Errorf("%s[%d]: empty driver name", v.path, i)
			}
		}
	}
	if v := f["pciAddresses"]; v != nil {
		list, err := v.strings()
		if err != nil {
			return s, err
		}
		for i, a := range list {
			a = strings.ToLower(strings.TrimSpace(a))
			if !pci.ValidAddress(a) {
				return s, fmt.Errorf("%s[%d]: %q is not a PCI address (want DDDD:BB:DD.F, e.g. 0000:18:00.1)", v.path, i, list[i])
			}
			s.PCIAddresses = append(s.PCIAddresses, a)
		}
	}
	if v := f["pfNames"]; v != nil {
		if s.PFNames, err = vfSets(v, false); err != nil {
			return s, err
		}
	}
	if v := f["rootDevices"]; v != nil {
		if s.RootDevices, err = vfSets(v, true); err != nil {
			return s, err
		}
	}
	if v := f["ifNames"]; v != nil {
		if s.IfNames, err = ifNames(v); err != nil {
			return s, err
		}
	}
	if v := f["linkTypes"]; v != nil {
		list, err := v.strings()
		if err != nil {
			return s, err
		}
		for i, l := range list {
			switch strings.ToLower(l) {
			case "ether", "ethernet", "eth", "roce":
				s.LinkTypes = append(s.LinkTypes, rdma.LinkLayerEthernet)
			case "infiniband", "ib":
				s.LinkTypes = append(s.LinkTypes, rdma.LinkLayerInfiniBand)
			default:
				return s, fmt.Errorf("%s[%d]: %q: want ether or infiniband", v.path, i, l)
			}
		}
	}
	if v := f["isRdma"]; v != nil {
		if s.IsRdma, err = v.boolean(); err != nil {
			return s, err
		}
	}
	return s, nil
}

func hexIDs(v *value) ([]string, error) {
	list, err := v.strings()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list))
	for i, s := range list {
		id := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "0x"), "0X"))
		if len(id) != 4 || strings.Trim(id, "0123456789abcdef") != "" {
			return nil, fmt.Errorf("%s[%d]: %q is not a PCI ID: want 4 hex digits, e.g. 15b3 or 101e", v.path, i, s)
		}
		out = append(out, id)
	}
	return out, nil
}

func ifNames(v *value) ([]string, error) {
	list, err := v.strings()
	if err != nil {
		return nil, err
	}
	for i, n := range list {
		if err := ifname.Check(n); err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", v.path, i, err)
		}
	}
	return list, nil
}

// vfSets parses pfNames ("ens2f0", "ens2f0#0-11") or rootDevices
// ("0000:86:00.0#0,2-7").
func vfSets(v *value, pciAddr bool) ([]VFSet, error) {
	list, err := v.strings()
	if err != nil {
		return nil, err
	}
	out := make([]VFSet, 0, len(list))
	for i, s := range list {
		set, err := ParseVFSet(s, pciAddr)
		if err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", v.path, i, err)
		}
		out = append(out, set)
	}
	return out, nil
}

// ParseVFSet parses one pfNames entry ("ens2f0", "ens2f0#0-11") or, with
// pciAddr, one rootDevices entry ("0000:86:00.0#0,2-7").
func ParseVFSet(s string, pciAddr bool) (VFSet, error) {
	pf, spec, hasRange := strings.Cut(s, "#")
	set := VFSet{PF: pf}
	if pciAddr {
		set.PF = strings.ToLower(pf)
		if !pci.ValidAddress(set.PF) {
			return set, fmt.Errorf("%q: %q is not a PCI address (rootDevices takes the PF's DDDD:BB:DD.F; interface names go in pfNames)", s, pf)
		}
	} else {
		if pci.ValidAddress(strings.ToLower(pf)) {
			return set, fmt.Errorf("%q is a PCI address: put it in rootDevices; pfNames takes the PF's netdev name", s)
		}
		if err := ifname.Check(pf); err != nil {
			return set, fmt.Errorf("%q: %w", s, err)
		}
	}
	if hasRange {
		var err error
		if set.Ranges, err = ranges(spec); err != nil {
			return set, fmt.Errorf("%q: %w", s, err)
		}
	}
	return set, nil
}

// maxVFIndex is above any PF's sriov_totalvfs.
const maxVFIndex = 4095

func ranges(spec string) ([][2]int, error) {
	if spec == "" {
		return nil, errors.New("empty VF range after '#': want e.g. 0-11 or 0,2-7")
	}
	var out [][2]int
	for _, part := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := vfIndex(lo, part)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = vfIndex(hi, part); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("VF range %q is reversed (want low-high)", part)
			}
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

func vfIndex(s, part string) (int, error) {
	if s == "" || len(s) > 4 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("VF range %q: %q is not a VF index (want a number 0-%d)", part, s, maxVFIndex)
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	if n > maxVFIndex {
		return 0, fmt.Errorf("VF range %q: index %d is above %d", part, n, maxVFIndex)
	}
	return n, nil
}
