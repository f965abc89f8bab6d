package rdma_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// roce is the device name on one RoCE port with its uverbs, umad and issm
// devices, numbered n.
func roce(name, n string) []rdma.Device {
	return []rdma.Device{{
		Name:  name,
		Ports: []rdma.Port{{Number: 1, LinkLayer: rdma.LinkLayerEthernet}},
		CharDevices: []rdma.CharDevice{
			{Kind: rdma.KindUverbs, Name: "uverbs" + n, Path: "/dev/infiniband/uverbs" + n},
			{Kind: rdma.KindUmad, Name: "umad" + n, Path: "/dev/infiniband/umad" + n, Port: 1},
			{Kind: rdma.KindIssm, Name: "issm" + n, Path: "/dev/infiniband/issm" + n, Port: 1},
		},
	}}
}

// irdma and bnxt_re parent their devices on the PCI function they drive,
// though they bind through an auxiliary device below it (ice.roce.N,
// bnxt_en.rdma.N; docs/vendors.md): a function's devices, read from its
// own directory or from the class index of a scan, are those, with their
// char devices, and a VF without one (iavf, vfio-pci, a bnxt_en VF that
// firmware gives no RoCE) has none.
func TestDevicesOtherVendors(t *testing.T) {
	cases := []struct {
		host, addr string
		want       []rdma.Device
	}{
		{"e810-irdma", "0000:3b:00.0", roce("irdma0", "0")},
		{"e810-irdma", "0000:3b:00.1", roce("irdma1", "1")},
		{"e810-irdma", "0000:3b:01.0", nil}, // iavf
		{"e810-irdma", "0000:3b:01.3", nil}, // vfio-pci
		{"bnxt-re", "0000:41:00.0", roce("bnxt_re0", "0")},
		{"bnxt-re", "0000:41:00.1", roce("bnxt_re1", "1")},
		{"bnxt-re", "0000:41:00.2", roce("bnxt_re2", "2")},
		{"bnxt-re", "0000:41:00.4", roce("bnxt_re4", "4")},
		{"bnxt-re", "0000:41:00.5", nil}, // bnxt_en, no RoCE
		{"bnxt-re", "0000:41:10.2", nil}, // vfio-pci
	}
	idx := map[string]*rdma.ScanIndex{}
	for _, tc := range cases {
		t.Run(tc.host+"/"+tc.addr, func(t *testing.T) {
			r := rdma.NewReader(root(tc.host))
			devs, err := r.Devices(tc.addr)
			require.NoError(t, err)
			require.Equal(t, tc.want, devs)

			if idx[tc.host] == nil {
				idx[tc.host] = new(rdma.ScanIndex)
				require.NoError(t, idx[tc.host].Read(r, 2))
			}
			dir, err := sysfs.Open(filepath.Join(root(tc.host), "sys", "bus", "pci", "devices", tc.addr))
			require.NoError(t, err)
			defer dir.Close()
			devs, err = r.DevicesForScan(dir, tc.addr, idx[tc.host])
			require.NoError(t, err)
			require.Equal(t, tc.want, devs, "from the scan's class index")
			for _, d := range devs {
				for _, c := range d.CharDevices {
					require.True(t, idx[tc.host].Nodes().Has(c.Path), c.Path)
				}
			}
		})
	}
}

// The class view joins the same char devices to the same devices.
func TestClassCharDevicesOtherVendors(t *testing.T) {
	got, err := rdma.NewReader(root("bnxt-re")).ClassCharDevices()
	require.NoError(t, err)
	require.Len(t, got, 5)
	require.Equal(t, roce("bnxt_re3", "3")[0].CharDevices, got["bnxt_re3"])
	got, err = rdma.NewReader(root("e810-irdma")).ClassCharDevices()
	require.NoError(t, err)
	require.Equal(t, map[string][]rdma.CharDevice{
		"irdma0": roce("irdma0", "0")[0].CharDevices,
		"irdma1": roce("irdma1", "1")[0].CharDevices,
	}, got)
}
