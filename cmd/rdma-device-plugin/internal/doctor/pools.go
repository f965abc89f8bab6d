package doctor

import (
	"fmt"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// field is one set field of a selector, as a selector of its own, so that
// pool.Selector.Matches stays the one rule of what matches.
type field struct {
	name string
	sel  pool.Selector
	// missing reports whether d fails the field for lack of something
	// (no driver, no RDMA device, no netdev) rather than for being other
	// hardware: a VF the pool would take once the node is fixed.
	missing func(d *nic.Device) bool
}

func (h *host) fields(s pool.Selector) []field {
	no := func(*nic.Device) bool { return false }
	var out []field
	add := func(set bool, name string, sel pool.Selector, missing func(*nic.Device) bool) {
		if set {
			out = append(out, field{name, sel, missing})
		}
	}
	add(len(s.Vendors) > 0, "vendors", pool.Selector{Vendors: s.Vendors}, no)
	add(len(s.Devices) > 0, "devices", pool.Selector{Devices: s.Devices}, no)
	add(len(s.Drivers) > 0, "drivers", pool.Selector{Drivers: s.Drivers}, func(d *nic.Device) bool {
		// Rebinding helps a function whose own netdevice driver the
		// selector names (or a ConnectX one, or one of a family fastpath
		// does not know), not an iavf VF a selector of mlx5_core passes over.
		drv := h.driverOf(d)
		return isConnectX(d) || drv == "" || slices.Contains(s.Drivers, drv)
	})
	add(len(s.PCIAddresses) > 0, "pciAddresses", pool.Selector{PCIAddresses: s.PCIAddresses}, no)
	add(len(s.PFNames) > 0, "pfNames", pool.Selector{PFNames: s.PFNames}, func(d *nic.Device) bool { return d.PFNetdev == "" })
	add(len(s.RootDevices) > 0, "rootDevices", pool.Selector{RootDevices: s.RootDevices}, no)
	add(len(s.IfNames) > 0, "ifNames", pool.Selector{IfNames: s.IfNames}, func(d *nic.Device) bool { return d.Netdev == "" })
	links := pool.Selector{LinkTypes: s.LinkTypes}
	add(len(s.LinkTypes) > 0, "linkTypes", links, func(d *nic.Device) bool {
		// Without an RDMA device there is no link layer; the PCI class
		// still tells an InfiniBand function from an Ethernet one.
		c := *d
		c.LinkType = classLinkType(d.Class)
		return d.LinkType == "" && links.Matches(&c) && h.mayHaveRDMA(d)
	})
	// An RDMA device is missing only where the kernel can give one: an
	// iavf or igbvf VF lacks none (checkNeverRDMA says so, once a pool).
	add(s.IsRdma, "isRdma", pool.Selector{IsRdma: true}, h.mayHaveRDMA)
	return out
}

// classLinkType is the link layer a PCI class implies: ConnectX VPI
// functions show class 0x0207 (InfiniBand) or 0x0200 (Ethernet) by port
// type.
func classLinkType(class string) string {
	switch {
	case strings.HasPrefix(class, "0x0207"):
		return rdma.LinkLayerInfiniBand
	case strings.HasPrefix(class, "0x0200"):
		return rdma.LinkLayerEthernet
	}
	return ""
}

// rejection is why one selector does not take d: the fields it fails,
// and whether each failure is a missing attribute.
func (h *host) rejection(s pool.Selector, d *nic.Device) (failed []string, onlyMissing bool) {
	onlyMissing = true
	for _, f := range h.fields(s) {
		if !f.sel.Matches(d) {
			failed = append(failed, f.name)
			onlyMissing = onlyMissing && f.missing(d)
		}
	}
	return failed, onlyMissing
}

// candidate reports whether a function is of the kind pool p hands out:
// VFs (or functions without SR-IOV) for an exclusive pool, functions with
// an RDMA device for a shared one.
func candidate(p *pool.Pool, d *nic.Device) bool {
	if p.Kind == pool.Exclusive {
		return d.IsVF() || d.NumVFs == 0
	}
	return !d.IsVF()
}

func (h *host) checkPools() {
	if h.opts.Config == nil {
		return
	}
	for _, w := range h.opts.Config.Warnings {
		h.add("config", Warn, h.opts.ConfigPath, w, "edit the pool config")
	}
	owner := map[string]string{}
	for _, p := range h.pools {
		for _, d := range p.Devices {
			if _, ok := owner[d.PCIAddress]; !ok && p.Kind == pool.Exclusive {
				owner[d.PCIAddress] = p.ResourceName()
			}
		}
	}
	for i := range h.pools {
		p := &h.pools[i]
		st := Warn
		if len(p.Devices) == 0 {
			st = Fail
		}
		for j, s := range p.Selectors {
			n, taken := 0, map[string]int{}
			for k := range h.snap.Devices {
				d := &h.snap.Devices[k]
				if !s.Matches(d) {
					continue
				}
				n++
				if o, ok := owner[d.PCIAddress]; ok && o != p.ResourceName() {
					taken[o]++
				}
			}
			subject := fmt.Sprintf("%s selectors[%d]", p.Source, j)
			if n == 0 {
				fix := "edit the selector in the pool config (rdma-device-plugin discover shows what the node has)"
				if slices.ContainsFunc(h.snap.Devices, func(d nic.Device) bool {
					failed, onlyMissing := h.rejection(s, &d)
					return len(failed) > 0 && onlyMissing && candidate(p, &d)
				}) {
					fix = "not a config mistake: the node's functions lack what the selector asks for (see the sriov findings)"
				}
				if h.neverOnly(p, s) {
					continue // checkNeverRDMA says it, once for the pool
				}
				h.add("pool", st, subject, p.ResourceName()+": "+h.explainNoMatch(s), fix)
				continue
			}
			if len(p.Devices) == 0 && len(taken) > 0 {
				var owners []string
				for o := range taken {
					owners = append(owners, o)
				}
				slices.Sort(owners)
				h.addf("pool", Fail, subject, "narrow the earlier pool's selectors, or move this pool before it",
					"%s: every function it selects is already in %s (the first exclusive pool that selects a function gets it)",
					p.ResourceName(), strings.Join(owners, ", "))
			}
		}
		h.checkNeverRDMA(p)
		if len(p.Devices) == 0 {
			continue
		}
		what := plural(len(p.Devices), "VF", "VFs")
		if p.Kind == pool.Shared {
			what = fmt.Sprintf("%s, %d containers at a time", plural(len(p.Devices), "HCA", "HCAs"), p.Capacity())
		}
		h.addf("pool", OK, p.ResourceName(), "", "%s pool: %s", p.Kind, what)
	}
}

// explainNoMatch says which of a selector's fields no function on the node
// satisfies.
func (h *host) explainNoMatch(s pool.Selector) string {
	var reasons []string
	for _, f := range h.fields(s) {
		n := 0
		for k := range h.snap.Devices {
			if f.sel.Matches(&h.snap.Devices[k]) {
				n++
			}
		}
		if n == 0 {
			reasons = append(reasons, fmt.Sprintf("%s %s: %s", f.name, value(s, f.name), h.have(f.name, s)))
		}
	}
	if len(reasons) == 0 {
		return "matches no function: each of its fields matches some function, but none matches all of them"
	}
	return "matches no function; " + strings.Join(reasons, "; ")
}

// value is a selector field's value as the config spells it.
func value(s pool.Selector, field string) string {
	sets := func(v []pool.VFSet) []string {
		var out []string
		for _, x := range v {
			out = append(out, x.PF)
		}
		return out
	}
	v := map[string][]string{"vendors": s.Vendors, "devices": s.Devices, "drivers": s.Drivers, "pciAddresses": s.PCIAddresses,
		"pfNames": sets(s.PFNames), "rootDevices": sets(s.RootDevices), "ifNames": s.IfNames, "linkTypes": s.LinkTypes}[field]
	if field == "isRdma" {
		return "true"
	}
	return "[" + strings.Join(v, ", ") + "]"
}

// have says what the node has for a selector field, e.g. the device IDs.
func (h *host) have(field string, s pool.Selector) string {
	var vals []string
	addVal := func(v string) {
		if v != "" && !slices.Contains(vals, v) {
			vals = append(vals, v)
		}
	}
	for _, d := range h.snap.Devices {
		switch field {
		case "vendors":
			addVal(d.Vendor)
		case "devices":
			addVal(d.DeviceID)
		case "drivers":
			addVal(d.Driver)
		case "pfNames":
			addVal(d.PFNetdev)
		case "ifNames":
			addVal(d.Netdev)
		case "linkTypes":
			addVal(d.LinkType)
		case "pciAddresses":
			addVal(d.PCIAddress)
		case "rootDevices":
			if !d.IsVF() && d.TotalVFs > 0 {
				addVal(d.PCIAddress)
			}
		}
	}
	slices.Sort(vals)
	if field == "isRdma" || (field == "linkTypes" && len(vals) == 0) {
		return "no function has an RDMA device (" + h.selectorRDMAHint(s) + ")"
	}
	if len(vals) == 0 {
		return "the node has none"
	}
	return "the node has " + words.List(vals, 8)
}

// selectorRDMAHint is what to check when no function has the RDMA device
// s asks for: the hints of the families of the functions s would select
// with one, or of the node's.
func (h *host) selectorRDMAHint(s pool.Selector) string {
	var hints []string
	add := func(d *nic.Device) {
		if hint := h.rdmaHint(d); !slices.Contains(hints, hint) {
			hints = append(hints, hint)
		}
	}
	for i := range h.snap.Devices {
		if d := &h.snap.Devices[i]; selectsButRDMA(s, d) {
			add(d)
		}
	}
	if len(hints) == 0 {
		for i := range h.snap.Devices {
			add(&h.snap.Devices[i])
		}
	}
	return strings.Join(hints, "; ")
}

// neverOnly reports whether the functions selector s of p would take
// with an RDMA device are all of families that never have one: the pool
// line of checkNeverRDMA is then all there is to say.
func (h *host) neverOnly(p *pool.Pool, s pool.Selector) bool {
	if !wantsRDMA(p, &s) {
		return false
	}
	never := false
	for i := range h.snap.Devices {
		d := &h.snap.Devices[i]
		if !candidate(p, d) || !selectsButRDMA(s, d) {
			continue
		}
		if h.mayHaveRDMA(d) {
			return false
		}
		never = true
	}
	return never
}
