package dra

import (
	"cmp"
	"reflect"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/deviceattribute"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// Attribute names. Unqualified names are in the driver's domain
// (rdma.fastpath-k8s.io/…); the Multus ones are what a
// NetworkAttachmentDefinition and its CNI know a VF by.
const (
	AttrLinkType     resourceapi.QualifiedName = "linkType"     // "InfiniBand" or "Ethernet"
	AttrRDMADevice   resourceapi.QualifiedName = "rdmaDevice"   // "mlx5_12"
	AttrPFPCIAddress resourceapi.QualifiedName = "pfPciAddress" // "0000:18:00.0"
	AttrPFNetdev     resourceapi.QualifiedName = "pfNetdev"     // "ibp24s0"
	AttrVFIndex      resourceapi.QualifiedName = "vfIndex"      // 0
	AttrNetdev       resourceapi.QualifiedName = "netdev"       // "ibp24s0v0"
	AttrDriver       resourceapi.QualifiedName = "driver"       // "mlx5_core" or "vfio-pci"

	AttrMultusDeviceID     resourceapi.QualifiedName = "k8s.cni.cncf.io/deviceID"
	AttrMultusResourceName resourceapi.QualifiedName = "k8s.cni.cncf.io/resourceName"
)

// Taint on a device that is published although it cannot be used now (its
// PF is down, its netdev is gone): the scheduler allocates it to no new
// claim, pods that hold it keep running. The value says why.
const TaintUnhealthy = DriverName + "/unhealthy"

// MaxDevicesPerSlice is how many devices go into one ResourceSlice. The
// API allows 128, but only 64 once any device of the slice has a taint;
// a fixed 64 keeps the slices the same when a device's health changes.
const MaxDevicesPerSlice = resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures

// DeviceName is the name of the device for the VF at a PCI address in the
// ResourceSlice: the address with ':' and '.' as '-' ("0000-18-00-1"), a
// DNS label as the API wants.
func DeviceName(pciAddress string) string {
	return strings.NewReplacer(":", "-", ".", "-").Replace(pciAddress)
}

// health is what the driver knows about one device's usability.
type health struct {
	ok     bool
	reason string // why not, a label value: "pf-link-down", "netdev-gone"
}

// deviceAttributes are the attributes of one VF. Unknown values are left
// out, never published as "" or -1.
func deviceAttributes(r *pool.Resource, d *nic.Device) map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	attrs := make(map[resourceapi.QualifiedName]resourceapi.DeviceAttribute, 14)
	str := func(name resourceapi.QualifiedName, v string) {
		if v != "" {
			attrs[name] = resourceapi.DeviceAttribute{StringValue: &v}
		}
	}
	// Discovery's pcieRoot is deviceattribute's ("" when the function
	// hangs off no PCI host bridge): pkg/nic's and this package's tests
	// compare the two.
	str(deviceattribute.StandardDeviceAttributePCIeRoot, d.PCIeRoot)
	// The PCI address comes from the kernel's own directory names: it is
	// in the extended BDF form the attribute wants.
	if a, err := deviceattribute.GetPCIBusIDAttribute(d.PCIAddress); err == nil {
		attrs[a.Name] = a.Value
	}
	if d.NUMANode >= 0 && !r.ExcludeTopology {
		if a, err := deviceattribute.GetNUMANodeAttribute(d.NUMANode, deviceattribute.ScalarAttribute); err == nil {
			attrs[a.Name] = a.Value
		}
	}
	str(AttrMultusDeviceID, d.PCIAddress)
	str(AttrMultusResourceName, r.ResourceName())
	str(AttrLinkType, d.LinkType)
	str(AttrRDMADevice, d.RDMADevice)
	str(AttrPFPCIAddress, d.PFAddress)
	str(AttrPFNetdev, d.PFNetdev)
	str(AttrNetdev, d.Netdev)
	str(AttrDriver, d.Driver)
	if d.IsVF() && d.VFIndex >= 0 {
		i := int64(d.VFIndex)
		attrs[AttrVFIndex] = resourceapi.DeviceAttribute{IntValue: &i}
	}
	return attrs
}

// entry is one VF as the driver serves it.
type entry struct {
	name string // DeviceName
	res  *pool.Resource
	dev  *nic.Device
	// attrs are its attributes, made once per scan: health changes are
	// published far more often than discovery changes them. Shared by
	// every publication, never modified.
	attrs map[resourceapi.QualifiedName]resourceapi.DeviceAttribute
	// group names the VFs that go into one ResourceSlice together when
	// they fit (a "pack" pool's VFs of one PF), so that a PF's link event
	// changes one slice; "" for a "spread" pool, whose every slice holds
	// VFs of every PF.
	group string
}

// entries lists the VFs of the pools in the order they are published:
// pool by pool; within a "spread" pool VF 0 of every PF first, then VF 1…
// (the scheduler takes the first devices that fit, so a claim for eight
// VFs gets one per rail), otherwise by PCI address (VFs of as few PFs as
// possible), PF by PF.
func entries(pools []pool.Pool) []entry {
	var out []entry
	for i := range pools {
		p := &pools[i]
		start := len(out)
		for j := range p.Devices {
			d := &p.Devices[j]
			out = append(out, entry{name: DeviceName(d.PCIAddress), res: &p.Resource, dev: d, attrs: deviceAttributes(&p.Resource, d)})
		}
		part := out[start:]
		if p.AllocationPolicy == pool.PolicySpread {
			rank := make(map[string]int, len(part)) // position of a VF among its PF's
			byPF := map[string][]string{}
			for _, e := range part {
				byPF[pfOf(e.dev)] = append(byPF[pfOf(e.dev)], e.dev.PCIAddress)
			}
			for _, vfs := range byPF {
				slices.Sort(vfs)
				for k, a := range vfs {
					rank[a] = k
				}
			}
			slices.SortFunc(part, func(a, b entry) int {
				return cmp.Or(cmp.Compare(rank[a.dev.PCIAddress], rank[b.dev.PCIAddress]),
					cmp.Compare(pfOf(a.dev), pfOf(b.dev)), cmp.Compare(a.dev.PCIAddress, b.dev.PCIAddress))
			})
		} else {
			for k := range part {
				part[k].group = p.ResourceName() + "/" + pfOf(part[k].dev)
			}
			slices.SortFunc(part, func(a, b entry) int {
				return cmp.Or(cmp.Compare(pfOf(a.dev), pfOf(b.dev)), cmp.Compare(a.dev.PCIAddress, b.dev.PCIAddress))
			})
		}
	}
	return out
}

func pfOf(d *nic.Device) string {
	if d.PFAddress != "" {
		return d.PFAddress
	}
	return d.PCIAddress
}

// driverResources builds what is published: one pool named after the node
// with every served VF, in slices of up to MaxDevicesPerSlice. A group
// (entry.group) that does not fit into what is left of a slice starts the
// next one, unless it is larger than a slice. A device that is not
// healthy is tainted when taint is set and left out otherwise.
func driverResources(poolName string, list []entry, healthOf func(*entry) health, taint bool) resourceslice.DriverResources {
	var slicesOut []resourceslice.Slice
	var cur []resourceapi.Device
	flush := func() {
		if len(cur) > 0 {
			slicesOut = append(slicesOut, resourceslice.Slice{Devices: cur})
			cur = nil
		}
	}
	for i := range list {
		e := &list[i]
		if e.group != "" && (i == 0 || list[i-1].group != e.group) {
			n := 1 // the group's size
			for n < len(list)-i && list[i+n].group == e.group {
				n++
			}
			if n <= MaxDevicesPerSlice && len(cur)+n > MaxDevicesPerSlice {
				flush()
			}
		}
		h := healthOf(e)
		if !h.ok && !taint {
			continue
		}
		dev := resourceapi.Device{Name: e.name, Attributes: e.attrs}
		if !h.ok {
			dev.Taints = []resourceapi.DeviceTaint{{Key: TaintUnhealthy, Value: h.reason, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
		}
		cur = append(cur, dev)
		if len(cur) == MaxDevicesPerSlice {
			flush()
		}
	}
	flush()
	if len(slicesOut) == 0 {
		// An empty pool says "this node has none", which is not the same
		// as saying nothing.
		slicesOut = []resourceslice.Slice{{}}
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{poolName: {Slices: slicesOut}}}
}

// samePublication reports whether two results of driverResources publish
// the same. It compares what driverResources sets, and attributes by
// identity first: they are made once per scan and shared, so a health
// change costs a walk over the devices, not a reflective comparison of
// every attribute (which at 1024 VFs was most of a link event's time).
func samePublication(a, b resourceslice.DriverResources) bool {
	if len(a.Pools) != len(b.Pools) {
		return false
	}
	for name, pa := range a.Pools {
		pb, ok := b.Pools[name]
		if !ok || len(pa.Slices) != len(pb.Slices) {
			return false
		}
		for i := range pa.Slices {
			if !samePublishedDevices(pa.Slices[i].Devices, pb.Slices[i].Devices) {
				return false
			}
		}
	}
	return true
}

func samePublishedDevices(a, b []resourceapi.Device) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		da, db := &a[i], &b[i]
		if da.Name != db.Name || !slices.Equal(da.Taints, db.Taints) {
			return false
		}
		if reflect.ValueOf(da.Attributes).UnsafePointer() != reflect.ValueOf(db.Attributes).UnsafePointer() &&
			!apiequality.Semantic.DeepEqual(da.Attributes, db.Attributes) {
			return false
		}
	}
	return true
}
