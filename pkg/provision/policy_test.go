package provision_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

func TestLoadSeedPolicy(t *testing.T) {
	ps, err := provision.Load("../../testdata/policy/seed.yaml")
	require.NoError(t, err)
	require.Len(t, ps, 1)
	p := ps[0]
	require.Equal(t, "ib-rails", p.Name)
	require.Equal(t, "mlnx_sriov_rdma", p.ResourceName)
	require.Equal(t, 8, p.NumVFs)
	require.Equal(t, 90, p.Priority)
	require.Equal(t, "15b3", p.Vendor)
	require.Equal(t, provision.DeviceTypeNetdevice, p.DeviceType)
	require.True(t, p.IsRdma)
	require.Len(t, p.PFNames, 8)
	require.Equal(t, pool.VFSet{PF: "ibp24s0"}, p.PFNames[0])
	require.Equal(t, map[string]string{"feature.node.kubernetes.io/network-sriov.capable": "true"}, p.NodeSelector)
}

func TestLoadManyPolicies(t *testing.T) {
	ps, err := provision.Load("testdata/multi.yaml")
	require.NoError(t, err)
	require.Len(t, ps, 2)
	require.Equal(t, "low", ps[0].Name)
	require.Equal(t, provision.DefaultPriority, ps[0].Priority)
	require.Equal(t, [][2]int{{0, 1}}, ps[0].PFNames[0].Ranges)
	require.Equal(t, "high", ps[1].Name)
	require.Equal(t, provision.DeviceTypeVFIO, ps[1].DeviceType)

	ps, err = provision.Load("testdata/list.json")
	require.NoError(t, err)
	require.Len(t, ps, 1)
	require.Equal(t, "0000:10:00.0", ps[0].RootDevices[0].PF)
}

// An operator policy for an Intel or Broadcom NIC loads as it is: the
// SR-IOV Network Operator takes any vendor, and so does fastpath.
func TestParseAnyVendor(t *testing.T) {
	for _, vendor := range []string{"8086", "0x14E4", "15b3"} {
		doc := "metadata: {name: p}\nspec:\n  resourceName: r\n  numVfs: 4\n  nicSelector: {vendor: '" + vendor + "', pfNames: ['ens1f0#0-1']}\n"
		ps, err := provision.Parse([]byte(doc), "p.yaml")
		require.NoError(t, err, vendor)
		require.Equal(t, strings.ToLower(strings.TrimPrefix(vendor, "0x")), ps[0].Vendor)
	}
}

func TestParseRefuses(t *testing.T) {
	base := func(spec string) string {
		return "metadata: {name: p}\nspec:\n  resourceName: r\n" + spec
	}
	for _, tc := range []struct {
		name, doc, want string
	}{
		{"switchdev", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  eSwitchMode: switchdev\n"), "eSwitchMode switchdev is not supported"},
		{"netFilter", base("  numVfs: 2\n  nicSelector: {netFilter: 'openstack/NetworkID:x'}\n"), "netFilter"},
		{"vhost", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  needVhostNet: true\n"), "needVhostNet is not supported"},
		{"vdpa", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  vdpaType: virtio\n"), "vdpaType"},
		{"bridge", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  bridge: {ovs: {}}\n"), "bridge and eSwitchParams"},
		{"unknown field", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  numVFs: 3\n"), "unknown field"},
		{"no numVfs", base("  nicSelector: {vendor: '15b3'}\n"), "numVfs is required"},
		{"negative numVfs", base("  numVfs: -1\n  nicSelector: {vendor: '15b3'}\n"), "numVfs -1"},
		{"rdma vfio", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  deviceType: vfio-pci\n  isRdma: true\n"), "isRdma with deviceType vfio-pci"},
		{"device type", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n  deviceType: accelerator\n"), "deviceType \"accelerator\""},
		{"range beyond numVfs", base("  numVfs: 4\n  nicSelector: {pfNames: ['ens1#2-5']}\n"), "VF 5 is not below numVfs 4"},
		{"reserved vendor", base("  numVfs: 2\n  nicSelector: {vendor: '0xffff'}\n"), `vendor "0xffff": want the PF's 4-digit hex PCI vendor ID`},
		{"vendor not hex", base("  numVfs: 2\n  nicSelector: {vendor: 'intel'}\n"), `vendor "intel"`},
		{"empty selector", base("  numVfs: 2\n  nicSelector: {}\n"), "is empty"},
		{"priority", base("  numVfs: 2\n  priority: 100\n  nicSelector: {vendor: '15b3'}\n"), "priority 100"},
		{"linkType", base("  numVfs: 2\n  linkType: roce\n  nicSelector: {vendor: '15b3'}\n"), "linkType \"roce\""},
		{"pf address in pfNames", base("  numVfs: 2\n  nicSelector: {pfNames: ['0000:18:00.0']}\n"), "put it in rootDevices"},
		{"resource name", strings.Replace(base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n"), "resourceName: r", "resourceName: a/b", 1), "resourceName"},
		{"no name", "spec: {resourceName: r, numVfs: 1, nicSelector: {vendor: '15b3'}}\n", "metadata.name is required"},
		{"kind", "kind: SriovNetwork\nmetadata: {name: p}\nspec: {}\n", "want SriovNetworkNodePolicy"},
		{"twice", base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n") + "---\n" + base("  numVfs: 2\n  nicSelector: {vendor: '15b3'}\n"), "defined twice"},
		{"bad guid", "metadata:\n  name: p\n  annotations:\n    fastpath-k8s.io/vf-guids: '{\"ibp16s0\": [\"zz\"]}'\nspec: {resourceName: r, numVfs: 1, nicSelector: {vendor: '15b3'}}\n", "is not a GUID"},
		{"nothing", "# empty\n", "no SriovNetworkNodePolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := provision.Parse([]byte(tc.doc), "p.yaml")
			require.ErrorContains(t, err, tc.want)
		})
	}
}
