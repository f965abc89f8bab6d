package provision

import (
	"fmt"
	"slices"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// Resources are the exclusive pools the plan's policies feed, one per
// resourceName, in policy order: each takes, of the PFs the plan gives
// the policy, the VFs of its VF ranges that are bound to the driver its
// deviceType asks for: vfio-pci, or for netdevice any other (and with
// isRdma, that have an RDMA device). A
// policy that got no PF on this node still has its pool, empty unless
// its pfNames or rootDevices name PFs that show up later, so that pods
// asking for it wait rather than fail. prefix is the resource prefix
// (pool.DefaultExclusivePrefix, or what --resource-prefix says).
func Resources(plan *Plan, prefix string) []pool.Resource {
	var out []pool.Resource
	index := map[string]int{}
	for _, p := range plan.Policies {
		if _, ok := index[p.ResourceName]; !ok {
			index[p.ResourceName] = len(out)
			out = append(out, pool.Resource{Prefix: prefix, Name: p.ResourceName, Kind: pool.Exclusive,
				DeviceType: "netDevice", ServedBy: pool.ServedByDevicePlugin, ExcludeTopology: p.ExcludeTopology,
				Source: "policy " + p.Name})
		}
	}
	for _, pf := range plan.PFs {
		for _, g := range pf.Groups {
			r := &out[index[g.ResourceName]]
			r.Selectors = append(r.Selectors, selectorOf(g, []pool.VFSet{{PF: pf.Address, Ranges: g.Ranges}}, nil))
		}
	}
	for i := range out {
		if len(out[i].Selectors) > 0 {
			continue
		}
		// No PF here: the policy's own names, if it has any.
		for _, p := range plan.Policies {
			if p.ResourceName != out[i].Name || (len(p.PFNames) == 0 && len(p.RootDevices) == 0) {
				continue
			}
			out[i].Selectors = append(out[i].Selectors, selectorOf(Group{DeviceType: p.DeviceType, IsRdma: p.IsRdma}, p.RootDevices, p.PFNames))
		}
	}
	return slices.DeleteFunc(out, func(r pool.Resource) bool { return len(r.Selectors) == 0 })
}

// allVFs is a VF range holding every VF, so that a selector takes VFs of
// the PF and never the PF itself (a VF set without ranges selects the PF
// too, as sriov-network-device-plugin's rootDevices do).
var allVFs = [][2]int{{0, 4095}}

func vfsOnly(sets []pool.VFSet) []pool.VFSet {
	out := slices.Clone(sets)
	for i := range out {
		if out[i].Ranges == nil {
			out[i].Ranges = allVFs
		}
	}
	return out
}

func selectorOf(g Group, roots, names []pool.VFSet) pool.Selector {
	s := pool.Selector{RootDevices: vfsOnly(roots), PFNames: vfsOnly(names), IsRdma: g.IsRdma}
	if g.DeviceType == DeviceTypeVFIO {
		s.Drivers = []string{DriverVFIO}
	} else {
		// A netdevice VF is on the driver its IDs select, of any
		// vendor (DriverByID); an unbound one the pool leaves out
		// with a warning.
		s.NotDrivers = []string{DriverVFIO}
	}
	return s
}

// Merge adds the policies' resources to a pool config (nil: a config of
// none) and returns the result; a resource the config defines already
// keeps the config's definition, with a warning.
func Merge(cfg *pool.Config, extra []pool.Resource) *pool.Config {
	out := &pool.Config{PeriodicUpdateInterval: pool.DefaultPeriodicUpdateInterval}
	if cfg != nil {
		c := *cfg
		out = &c
		out.Resources = slices.Clone(cfg.Resources)
		out.Warnings = slices.Clone(cfg.Warnings)
	}
	nccl := slices.ContainsFunc(out.Resources, func(r pool.Resource) bool { return r.NCCLEnv })
	for _, r := range extra {
		if i := slices.IndexFunc(out.Resources, func(c pool.Resource) bool { return c.ResourceName() == r.ResourceName() }); i >= 0 {
			out.Warnings = append(out.Warnings, fmt.Sprintf("%s: resource %s is defined by %s too; the pool config's definition is used", r.Source, r.ResourceName(), out.Resources[i].Source))
			continue
		}
		if !nccl {
			r.NCCLEnv, nccl = true, true
		}
		out.Resources = append(out.Resources, r)
	}
	return out
}
