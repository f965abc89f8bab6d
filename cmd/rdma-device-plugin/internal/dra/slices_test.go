package dra_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

func str(s string) resourceapi.DeviceAttribute { return resourceapi.DeviceAttribute{StringValue: &s} }
func num(i int64) resourceapi.DeviceAttribute  { return resourceapi.DeviceAttribute{IntValue: &i} }

func TestDeviceName(t *testing.T) {
	require.Equal(t, "0000-18-00-1", dra.DeviceName("0000:18:00.1"))
	require.Empty(t, validation.IsDNS1123Label(dra.DeviceName("0000:ff:1f.7")))
}

func TestSliceDevicesOnTheDGX(t *testing.T) {
	pools := draPools(t, fixtureRoot("dgx-h100"), "dra.json")
	res := dra.Resources("node-a", pools, nil, true)
	require.Len(t, res.Pools, 1)
	p, ok := res.Pools["node-a"]
	require.True(t, ok, "one pool, named after the node")
	require.Len(t, p.Slices, 1)
	devs := p.Slices[0].Devices
	require.Len(t, devs, 32)

	// spread: VF 0 of every rail first, so first-fit gives one VF per rail.
	var first []string
	for _, d := range devs[:8] {
		first = append(first, d.Name)
	}
	want := []string{}
	for _, a := range fixture.DGXRailVFs(0) {
		want = append(want, dra.DeviceName(a))
	}
	require.Equal(t, want, first)

	var vf0 *resourceapi.Device
	for i := range devs {
		if devs[i].Name == "0000-18-00-1" {
			vf0 = &devs[i]
		}
		require.Empty(t, devs[i].Taints)
	}
	require.NotNil(t, vf0)
	require.Equal(t, map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"resource.kubernetes.io/pcieRoot": str("pci0000:15"),
		"resource.kubernetes.io/pciBusID": str("0000:18:00.1"),
		"resource.kubernetes.io/numaNode": num(0),
		"k8s.cni.cncf.io/deviceID":        str("0000:18:00.1"),
		"k8s.cni.cncf.io/resourceName":    str("mellanox.com/mlnx_sriov_rdma"),
		"linkType":                        str("InfiniBand"),
		"rdmaDevice":                      str("mlx5_12"),
		"pfPciAddress":                    str("0000:18:00.0"),
		"pfNetdev":                        str("ibp24s0"),
		"netdev":                          str("ibp24s0v0"),
		"driver":                          str("mlx5_core"),
		"vfIndex":                         num(0),
	}, vf0.Attributes)
}

// What the API server would refuse: names, attribute names and values
// within their limits, at most 32 attributes, at most 64 devices a slice.
func TestSlicesWithinAPILimits(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 4, 40)) // 160 VFs: slices of 64, 64 and 32
	pools := draPools(t, root, "dra.json")
	unhealthy := map[string]string{fixture.VFAddress(0x10, 3): dra.ReasonPFLinkDown}
	res := dra.Resources("node-a", pools, unhealthy, true)
	slices := res.Pools["node-a"].Slices
	require.Len(t, slices, 3)
	require.Len(t, slices[2].Devices, 32)
	seen := map[string]bool{}
	tainted := 0
	for _, s := range slices {
		require.LessOrEqual(t, len(s.Devices), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
		for _, d := range s.Devices {
			require.Empty(t, validation.IsDNS1123Label(d.Name), d.Name)
			require.False(t, seen[d.Name], "device %s twice", d.Name)
			seen[d.Name] = true
			require.LessOrEqual(t, len(d.Attributes), resourceapi.ResourceSliceMaxAttributesAndCapacitiesPerDevice)
			for name, v := range d.Attributes {
				id := string(name)
				if i := strings.LastIndexByte(id, '/'); i >= 0 {
					require.Empty(t, validation.IsDNS1123Subdomain(id[:i]), "%s", name)
					require.LessOrEqual(t, i, resourceapi.DeviceMaxDomainLength)
					id = id[i+1:]
				}
				require.LessOrEqual(t, len(id), resourceapi.DeviceMaxIDLength, "%s", name)
				require.Empty(t, validation.IsCIdentifier(id), "%s", name)
				if v.StringValue != nil {
					require.NotEmpty(t, *v.StringValue, "%s: an unknown value is left out, never empty", name)
					require.LessOrEqual(t, len(*v.StringValue), resourceapi.DeviceAttributeMaxValueLength, "%s", name)
				}
				if v.IntValue != nil {
					require.GreaterOrEqual(t, *v.IntValue, int64(0), "%s: an unknown value is left out, never -1", name)
				}
			}
			for _, taint := range d.Taints {
				tainted++
				require.Empty(t, validation.IsQualifiedName(taint.Key))
				require.Empty(t, validation.IsValidLabelValue(taint.Value))
				require.Equal(t, resourceapi.DeviceTaintEffectNoSchedule, taint.Effect)
			}
		}
	}
	require.Len(t, seen, 160)
	require.Equal(t, 1, tainted)
}

func TestUnhealthyVFsAreTaintedOrLeftOut(t *testing.T) {
	pools := draPools(t, fixtureRoot("dgx-h100"), "dra.json")
	bad := fixture.VFAddress(0x18, 2)
	unhealthy := map[string]string{bad: dra.ReasonPFLinkDown}

	devs := dra.Resources("n", pools, unhealthy, true).Pools["n"].Slices[0].Devices
	require.Len(t, devs, 32)
	for _, d := range devs {
		if d.Name == dra.DeviceName(bad) {
			require.Equal(t, []resourceapi.DeviceTaint{{Key: "rdma.fastpath-k8s.io/unhealthy", Value: "pf-link-down", Effect: "NoSchedule"}}, d.Taints)
		} else {
			require.Empty(t, d.Taints, d.Name)
		}
	}

	devs = dra.Resources("n", pools, unhealthy, false).Pools["n"].Slices[0].Devices
	require.Len(t, devs, 31)
	for _, d := range devs {
		require.NotEqual(t, dra.DeviceName(bad), d.Name)
	}
}

// Unknown values are left out, never published as "" or -1: an empty
// pcieRoot would "match" every other device whose root is unknown.
func TestUnknownAttributesAreLeftOut(t *testing.T) {
	d := nic.Device{PCIAddress: "0000:3b:00.2", Vendor: "15b3", DeviceID: "101e", Driver: "mlx5_core",
		NUMANode: -1, PFAddress: "0000:3b:00.0", VFIndex: -1, PCIeRoot: ""}
	p := pool.Pool{Resource: pool.Resource{Prefix: "mellanox.com", Name: "vfs", Kind: pool.Exclusive, ServedBy: pool.ServedByDRA}, Devices: []nic.Device{d}}
	attrs := dra.Resources("n", []pool.Pool{p}, nil, true).Pools["n"].Slices[0].Devices[0].Attributes
	require.Equal(t, map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
		"resource.kubernetes.io/pciBusID": str("0000:3b:00.2"),
		"k8s.cni.cncf.io/deviceID":        str("0000:3b:00.2"),
		"k8s.cni.cncf.io/resourceName":    str("mellanox.com/vfs"),
		"pfPciAddress":                    str("0000:3b:00.0"),
		"driver":                          str("mlx5_core"),
	}, attrs)

	// excludeTopology keeps the NUMA node to itself.
	d.NUMANode, d.PCIeRoot = 1, "pci0000:3a"
	p.Devices = []nic.Device{d}
	p.ExcludeTopology = true
	attrs = dra.Resources("n", []pool.Pool{p}, nil, true).Pools["n"].Slices[0].Devices[0].Attributes
	require.NotContains(t, attrs, resourceapi.QualifiedName("resource.kubernetes.io/numaNode"))
	require.Equal(t, str("pci0000:3a"), attrs["resource.kubernetes.io/pcieRoot"])
}

func TestNoDevicesIsAnEmptyPool(t *testing.T) {
	res := dra.Resources("n", nil, nil, true)
	require.Len(t, res.Pools["n"].Slices, 1)
	require.Empty(t, res.Pools["n"].Slices[0].Devices)
}

func TestPackOrdersByPCIAddress(t *testing.T) {
	pools := draPools(t, fixtureRoot("dgx-h100"), "dra.json")
	pools[0].AllocationPolicy = pool.PolicyPack
	devs := dra.Resources("n", pools, nil, true).Pools["n"].Slices[0].Devices
	for i := 1; i < len(devs); i++ {
		require.Less(t, devs[i-1].Name, devs[i].Name)
	}
}

// A "pack" pool's VFs of one PF share a ResourceSlice when they fit, so
// that a PF's link event changes one slice (the ResourceSlice controller
// then updates that one alone, without bumping the pool's generation); a
// "spread" pool interleaves the PFs in every slice (one VF per rail
// first, whichever slice the scheduler reads first).
func TestSlicesKeepAPFsVFsTogether(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 5, 24)) // 120 VFs
	for _, tc := range []struct {
		policy      string
		slicesPerPF int   // slices holding VFs of one PF
		sizes       []int // devices per slice
	}{
		{pool.PolicyPack, 1, []int{48, 48, 24}}, // two whole PFs a slice, not 64 + 56
		{pool.PolicySpread, 2, []int{64, 56}},
	} {
		t.Run(tc.policy, func(t *testing.T) {
			pools := draPools(t, root, "dra.json")
			pools[0].AllocationPolicy = tc.policy
			slices := dra.Resources("n", pools, nil, true).Pools["n"].Slices
			var sizes []int
			inSlices := map[string]map[int]bool{} // PF bus → slices
			for i, s := range slices {
				sizes = append(sizes, len(s.Devices))
				for _, d := range s.Devices {
					pf := d.Name[:len("0000-10")]
					if inSlices[pf] == nil {
						inSlices[pf] = map[int]bool{}
					}
					inSlices[pf][i] = true
				}
			}
			require.Equal(t, tc.sizes, sizes)
			require.Len(t, inSlices, 5)
			for pf, in := range inSlices {
				require.Len(t, in, tc.slicesPerPF, "PF on bus %s", pf)
			}
		})
	}
}

func TestSamePublication(t *testing.T) {
	pools := draPools(t, fixtureRoot("dgx-h100"), "dra.json")
	base := dra.Resources("n", pools, nil, true)
	down := map[string]string{"0000:18:00.1": dra.ReasonPFLinkDown}
	for _, tc := range []struct {
		name  string
		other resourceslice.DriverResources
		same  bool
	}{
		{"same scan, same health", dra.Resources("n", pools, nil, true), true},
		{"a rescan (new attribute maps, same values)", dra.Resources("n", draPools(t, fixtureRoot("dgx-h100"), "dra.json"), nil, true), true},
		{"a VF tainted", dra.Resources("n", pools, down, true), false},
		{"a VF left out", dra.Resources("n", pools, down, false), false},
		{"another pool name", dra.Resources("m", pools, nil, true), false},
		{"an attribute changed", func() resourceslice.DriverResources {
			r := dra.Resources("n", draPools(t, fixtureRoot("dgx-h100"), "dra.json"), nil, true)
			r.Pools["n"].Slices[0].Devices[3].Attributes["netdev"] = str("renamed0")
			return r
		}(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.same, dra.SamePublication(base, tc.other))
			require.Equal(t, tc.same, dra.SamePublication(tc.other, base))
		})
	}
}
