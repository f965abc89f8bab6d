package provision

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// DriverNetdevice is the driver a netdevice VF of a ConnectX PF is bound
// to. Provisioning does not bind by this name (see DriverByID), and the
// pools a policy feeds take a netdevice VF on any driver but vfio-pci.
const DriverNetdevice = "mlx5_core"

// DriverByID, as the driver of a bind step, is the driver the kernel
// matches for the VF by its vendor and device IDs, whichever it is
// (igbvf, iavf, bnxt_en, mlx5_core, …): the VF is probed with its
// driver_override clear while its PF's sriov_drivers_autoprobe is 1, so
// that the PCI core lets the drivers' own ID tables choose
// (pci_device_can_probe, drivers/pci/pci-driver.c). Sysfs shows no
// driver's ID table, so the name cannot be found beforehand, and a
// driver_override naming a driver would bind it even to IDs it does not
// list (pci_match_device gives such a driver a dummy ID).
const DriverByID = ""

// DriverVFIO is the driver of a vfio-pci VF.
const DriverVFIO = pci.DriverVFIO

// Node is what a plan is made from: the node as discovery saw it and what
// the caller knows about it.
type Node struct {
	// Root is the host root; the plan reads a few sysfs attributes below
	// it that discovery does not keep (sriov_drivers_autoprobe, MTU, node
	// GUIDs).
	Root     string
	Snapshot *nic.Snapshot
	// Labels are the node's labels; nil when unknown, and then every
	// policy's nodeSelector is taken to match.
	Labels map[string]string
	// LabelsErr says why the labels, which should be known (the node's
	// name is), could not be read. A policy with a nodeSelector is then
	// not applied (it may be meant for other nodes); one without is.
	LabelsErr error
	// DefaultRoutes are the netdevs that carry the node's default route.
	DefaultRoutes []string
	// InUse says who holds a VF, by PCI address ("pod ns/name").
	InUse map[string]string
	// Records are the write-ahead records of an interrupted run, by PF.
	Records map[string]Record
}

// Group is which VFs of a PF one policy owns.
type Group struct {
	Policy       string
	ResourceName string
	DeviceType   string
	IsRdma       bool
	// ExcludeTopology is the policy's, for its pool.
	ExcludeTopology bool
	// Ranges are inclusive VF index ranges; nil means every VF.
	Ranges [][2]int
}

func (g *Group) contains(i int) bool { return pool.VFSet{Ranges: g.Ranges}.Contains(i) }

// PF is the plan for one PF that a policy selects.
type PF struct {
	Address, Netdev, Vendor, DeviceID string
	LinkType                          string // rdma.LinkLayer… of the PF
	TotalVFs, NumVFs                  int    // what the PF has now
	Want                              int    // numVfs of the policy that owns it
	// Policy owns the PF (sets Want and MTU); Priority is its priority.
	Policy   string
	Priority int
	Groups   []Group
	MTU      int
	External bool // externallyManaged: nothing is written
	// Autoprobe is the sriov_drivers_autoprobe the PF is left with: as
	// found, or, after an interrupted run, as that run's record says it
	// was found (1, the kernel's default, for a record that does not say).
	Autoprobe bool
	// Steps change the PF to what the policy wants, in order; none when
	// it is there already, or when Refused.
	Steps []Step
	// Refused says why the PF is left as it is although it differs; its
	// errors wrap ErrBusy, ErrTotalVFs, ErrFirmware or ErrLinkType.
	Refused  error
	Warnings []string
}

// Plan is what provisioning would do on a node.
type Plan struct {
	Policies []Policy
	PFs      []PF // by PCI address
	Warnings []string
	// LabelsErr is the node's (Node.LabelsErr): its policies with a
	// nodeSelector were left out.
	LabelsErr error
}

// PF returns the plan of the PF at addr.
func (p *Plan) PF(addr string) (*PF, bool) {
	for i := range p.PFs {
		if p.PFs[i].Address == addr {
			return &p.PFs[i], true
		}
	}
	return nil, false
}

// Changes counts the steps of the plan.
func (p *Plan) Changes() int {
	n := 0
	for i := range p.PFs {
		n += len(p.PFs[i].Steps)
	}
	return n
}

// selects reports whether p selects the PF d, whether it names it (by
// pfNames or rootDevices) and which of its VFs (nil: all).
func selects(p *Policy, d *nic.Device) (ok, named bool, ranges [][2]int) {
	if p.Vendor != "" && p.Vendor != d.Vendor {
		return false, false, nil
	}
	if p.DeviceID != "" && p.DeviceID != d.DeviceID {
		return false, false, nil
	}
	if len(p.RootDevices) > 0 {
		i := slices.IndexFunc(p.RootDevices, func(s pool.VFSet) bool { return s.PF == d.PCIAddress })
		if i < 0 {
			return false, false, nil
		}
		named, ranges = true, p.RootDevices[i].Ranges
	}
	if len(p.PFNames) > 0 {
		i := slices.IndexFunc(p.PFNames, func(s pool.VFSet) bool { return d.Netdev != "" && s.PF == d.Netdev })
		if i < 0 {
			return false, false, nil
		}
		named = true
		if r := p.PFNames[i].Ranges; r != nil {
			ranges = r
		}
	}
	return true, named, ranges
}

func nodeSelected(p *Policy, labels map[string]string) bool {
	if labels == nil {
		return true
	}
	for k, v := range p.NodeSelector {
		if got, ok := labels[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func overlaps(a, b [][2]int) bool {
	if a == nil || b == nil {
		return true
	}
	for _, x := range a {
		for _, y := range b {
			if x[0] <= y[1] && y[0] <= x[1] {
				return true
			}
		}
	}
	return false
}

// NewPlan matches the policies against the node's PFs, in the operator's
// order: by priority, 99 (lowest) first, then by name, each one that
// selects a PF overriding what came before on it (lower number, higher
// priority) — unless both give disjoint VF ranges (pfNames "ens1#0-3")
// at the same priority, which partitions the PF's VFs between them. A
// policy that matches no PF, and a PF that carries the default route and
// is not named by pfNames or rootDevices, are warnings.
func NewPlan(policies []Policy, node Node) *Plan {
	plan := &Plan{Policies: policies, LabelsErr: node.LabelsErr}
	order := slices.Clone(policies)
	sort.SliceStable(order, func(i, j int) bool {
		if order[i].Priority != order[j].Priority {
			return order[i].Priority > order[j].Priority
		}
		return order[i].Name < order[j].Name
	})
	routes := map[string]bool{}
	for _, r := range node.DefaultRoutes {
		routes[r] = true
	}
	byAddr := map[string]*PF{}
	for i := range order {
		p := &order[i]
		if node.LabelsErr != nil && len(p.NodeSelector) > 0 {
			plan.Warnings = append(plan.Warnings, fmt.Sprintf("policy %s: nodeSelector %v: not applied, this node's labels are unknown: %v", p.Name, p.NodeSelector, node.LabelsErr))
			continue
		}
		if !nodeSelected(p, node.Labels) {
			plan.Warnings = append(plan.Warnings, fmt.Sprintf("policy %s: nodeSelector %v does not match this node's labels: not applied", p.Name, p.NodeSelector))
			continue
		}
		matched := 0
		for j := range node.Snapshot.Devices {
			d := &node.Snapshot.Devices[j]
			if d.IsVF() {
				continue
			}
			ok, named, ranges := selects(p, d)
			if !ok {
				continue
			}
			if d.Netdev != "" && routes[d.Netdev] && !named {
				plan.Warnings = append(plan.Warnings, fmt.Sprintf("policy %s: PF %s (%s) carries the node's default route: left alone unless the policy names it in pfNames or rootDevices", p.Name, d.PCIAddress, d.Netdev))
				continue
			}
			matched++
			g := Group{Policy: p.Name, ResourceName: p.ResourceName, DeviceType: p.DeviceType, IsRdma: p.IsRdma,
				ExcludeTopology: p.ExcludeTopology, Ranges: ranges}
			pf := byAddr[d.PCIAddress]
			switch {
			case pf == nil:
				pf = &PF{Address: d.PCIAddress, Netdev: d.Netdev, Vendor: d.Vendor, DeviceID: d.DeviceID, LinkType: d.LinkType,
					TotalVFs: d.TotalVFs, NumVFs: d.NumVFs}
				byAddr[d.PCIAddress] = pf
			case pf.Priority == p.Priority && ranges != nil && !slices.ContainsFunc(pf.Groups, func(o Group) bool { return overlaps(o.Ranges, ranges) }):
				pf.Groups = append(pf.Groups, g)
				pf.Want = max(pf.Want, p.NumVFs)
				continue
			default:
				pf.Warnings = append(pf.Warnings, fmt.Sprintf("policy %s (priority %d) overrides %s (priority %d) on this PF", p.Name, p.Priority, pf.Policy, pf.Priority))
			}
			pf.Policy, pf.Priority, pf.Want, pf.MTU, pf.External = p.Name, p.Priority, p.NumVFs, p.MTU, p.ExternallyManaged
			pf.Groups = []Group{g}
			if p.LinkType != "" && linkTypeOf(d.LinkType) != p.LinkType {
				pf.Refused = fmt.Errorf("%w: policy %s wants linkType %s but the PF's port is %s: fastpath does not change a port's link type (mlxconfig -d %s set LINK_TYPE_P1=%s, then reboot)",
					ErrLinkType, p.Name, p.LinkType, d.LinkType, d.PCIAddress, map[string]string{LinkTypeEth: "ETH", LinkTypeIB: "IB"}[p.LinkType])
			} else {
				pf.Refused = nil
			}
		}
		if matched == 0 {
			plan.Warnings = append(plan.Warnings, fmt.Sprintf("policy %s matches no PF on this node", p.Name))
		}
	}
	for _, addr := range slices.Sorted(maps.Keys(byAddr)) {
		pf := byAddr[addr]
		if pf.Refused == nil {
			planSteps(pf, node, policyNamed(policies, pf.Policy))
		}
		plan.PFs = append(plan.PFs, *pf)
	}
	checkGUIDs(plan)
	return plan
}

func policyNamed(ps []Policy, name string) *Policy {
	for i := range ps {
		if ps[i].Name == name {
			return &ps[i]
		}
	}
	return nil
}

func linkTypeOf(layer string) string {
	if layer == rdma.LinkLayerInfiniBand {
		return LinkTypeIB
	}
	return LinkTypeEth
}

// driverOf is the driver VF k of pf is to be bound to: vfio-pci, or
// DriverByID.
func (pf *PF) driverOf(k int) string {
	for _, g := range pf.Groups {
		if g.contains(k) && g.DeviceType == DeviceTypeVFIO {
			return DriverVFIO
		}
	}
	return DriverByID
}

// PolicyOf is the policy that owns VF k of the PF, "" when none does.
func (pf *PF) PolicyOf(k int) string {
	for _, g := range pf.Groups {
		if g.contains(k) {
			return g.Policy
		}
	}
	return ""
}

// Summary is one line on what the plan does to the PF.
func (pf *PF) Summary() string {
	switch {
	case pf.Refused != nil:
		return "refused: " + pf.Refused.Error()
	case pf.External && pf.NumVFs < pf.Want:
		return fmt.Sprintf("externally managed: has %d VFs, policy wants %d; nothing written", pf.NumVFs, pf.Want)
	case pf.External:
		return "externally managed: nothing written"
	case len(pf.Steps) == 0:
		return "up to date"
	}
	count := map[StepKind]int{}
	for _, s := range pf.Steps {
		count[s.Kind]++
	}
	var parts []string
	if count[StepMTU] > 0 {
		parts = append(parts, fmt.Sprintf("MTU %d", pf.MTU))
	}
	switch {
	case count[StepNumVFs] == 2:
		parts = append(parts, fmt.Sprintf("sriov_numvfs %d -> 0 -> %d", pf.NumVFs, pf.Want))
	case count[StepNumVFs] == 1:
		parts = append(parts, fmt.Sprintf("sriov_numvfs %d -> %d", pf.NumVFs, pf.Want))
	}
	for _, k := range []struct {
		kind StepKind
		name string
	}{{StepUnbind, "unbind"}, {StepGUID, "GUID"}, {StepBind, "bind"}} {
		if n := count[k.kind]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k.name))
		}
	}
	return fmt.Sprintf("%d steps: %s", len(pf.Steps), strings.Join(parts, ", "))
}
