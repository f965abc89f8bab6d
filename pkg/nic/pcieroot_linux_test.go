package nic_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"k8s.io/dynamic-resource-allocation/deviceattribute"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// platformHost writes a host whose PCIe root complex sits under
// devices/platform (arm64 SoCs): no "pci…" directory right below
// devices, so no pcieRoot.
func platformHost(t *testing.T) string {
	r := t.TempDir()
	b, err := fixture.NewBuilder(r)
	require.NoError(t, err)
	parent, err := b.Bridge("platform/1c00000.pcie/pci0000:00", "0000:00:00.0", "17cb", "0108", 0)
	require.NoError(t, err)
	require.NoError(t, b.Add(fixture.Function{
		Address: "0000:01:00.0", Vendor: "15b3", Device: "101d", Class: "0x020000", Driver: "mlx5_core",
		IOMMUGroup: 1, Parent: parent, Netdevs: []fixture.Netdev{{Name: "eth0", MAC: fixture.MAC(1, 0)}},
		RDMA: []fixture.RDMADevice{{Name: "mlx5_0", LinkLayer: "Ethernet", Uverbs: 0, Umad: 0, NodeGUID: fixture.GUID(1, 0)}},
	}))
	return r
}

// Every device's PCIeRoot is what k8s.io/dynamic-resource-allocation's
// deviceattribute helper (the Kubernetes reference for the standard
// attribute resource.kubernetes.io/pcieRoot) computes from the same sysfs,
// and empty where it finds none.
func TestPCIeRootAgreesWithDeviceAttribute(t *testing.T) {
	hosts := map[string]string{"platform": platformHost(t)}
	for _, name := range []string{"dgx-h100", "roce-cx6dx", "edge"} {
		hosts[name] = root(name)
	}
	for name, r := range hosts {
		t.Run(name, func(t *testing.T) {
			sc := nic.NewScanner(r)
			s, err := sc.Scan()
			require.NoError(t, err)
			require.NotEmpty(t, s.Devices)
			for _, d := range s.Devices {
				attr, err := deviceattribute.GetPCIeRootAttributeByPCIBusID(d.PCIAddress, deviceattribute.WithFSFromRoot(filepath.Join(r, "sys")))
				want := ""
				if name == "platform" {
					require.Error(t, err, "deviceattribute finds no root under devices/platform either")
				}
				if err == nil {
					require.Equal(t, deviceattribute.StandardDeviceAttributePCIeRoot, attr.Name)
					want = *attr.Value.StringValue
				}
				require.Equal(t, want, d.PCIeRoot, "%s %s (deviceattribute: %v)", name, d.PCIAddress, err)
				if name == "platform" {
					require.Empty(t, d.PCIeRoot)
				} else {
					require.Regexp(t, `^pci[0-9a-f]{4}:[0-9a-f]{2}$`, d.PCIeRoot)
				}
				one, err := sc.Device(d.PCIAddress)
				require.NoError(t, err)
				require.Equal(t, d.PCIeRoot, one.PCIeRoot)
			}
		})
	}
}
