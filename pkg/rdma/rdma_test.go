package rdma_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func root(name string) string { return filepath.Join("..", "..", "testdata", "sysfs", name) }

func TestDevicesDGX(t *testing.T) {
	r := rdma.NewReader(root("dgx-h100"))
	devs, err := r.Devices("0000:18:00.1")
	require.NoError(t, err)
	require.Equal(t, []rdma.Device{{
		Name:  "mlx5_12",
		Ports: []rdma.Port{{Number: 1, LinkLayer: "InfiniBand", State: "ACTIVE"}},
		CharDevices: []rdma.CharDevice{
			{Kind: "uverbs", Name: "uverbs14", Path: "/dev/infiniband/uverbs14"},
			{Kind: "umad", Name: "umad12", Path: "/dev/infiniband/umad12", Port: 1},
			{Kind: "issm", Name: "issm12", Path: "/dev/infiniband/issm12", Port: 1},
		},
	}}, devs)

	// The GPU has none; an Intel irdma device hangs off an auxiliary device,
	// not the PCI function, and is not picked up as the function's own.
	devs, err = r.Devices("0000:19:00.0")
	require.NoError(t, err)
	require.Empty(t, devs)
	devs, err = r.Devices("0000:0c:00.0")
	require.NoError(t, err)
	require.Empty(t, devs)

	_, err = r.Devices("../../x")
	require.ErrorContains(t, err, "not a PCI address")
}

func TestPortState(t *testing.T) {
	r := rdma.NewReader(root("edge"))
	st, err := r.PortState("mlx5_2", 1)
	require.NoError(t, err)
	require.Equal(t, "DOWN", st)
	st, err = r.PortState("mlx5_1", 1)
	require.NoError(t, err)
	require.Equal(t, "ACTIVE", st)
	_, err = r.PortState("mlx5_99", 1)
	require.Error(t, err)
	_, err = r.PortState("../mlx5_1", 1)
	require.ErrorContains(t, err, "invalid device name")
}

func TestRoCEv2IPv4GIDIndex(t *testing.T) {
	r := rdma.NewReader(root("roce-cx6dx"))
	for _, tc := range []struct {
		dev, netdev string
		want        int
	}{
		{"mlx5_0", "ens1f0np0", 3}, // link-local v1, v2, IPv4 v1, v2
		{"mlx5_1", "ens1f1np1", 5}, // an IPv6 address comes first
		{"mlx5_2", "ens1f0v0", 3},  // VF0 of PF0 has an address
	} {
		got, err := r.RoCEv2IPv4GIDIndex(tc.dev, 1, tc.netdev)
		require.NoError(t, err, tc.dev)
		require.Equal(t, tc.want, got, tc.dev)
	}
	_, err := r.RoCEv2IPv4GIDIndex("mlx5_3", 1, "ens1f0v1")
	require.ErrorIs(t, err, rdma.ErrNoGID, "only link-local GIDs")
	_, err = r.RoCEv2IPv4GIDIndex("mlx5_0", 1, "ens1f1np1")
	require.ErrorIs(t, err, rdma.ErrNoGID, "GIDs of another netdev do not count")
	_, err = r.RoCEv2IPv4GIDIndex("mlx5_0", 2, "ens1f0np0")
	require.Error(t, err)
}

func TestDevNodes(t *testing.T) {
	r := rdma.NewReader(root("dgx-h100"))
	nodes, err := r.DevNodes()
	require.NoError(t, err)
	require.True(t, nodes["/dev/infiniband/uverbs14"])
	require.True(t, nodes[rdma.RDMACMPath])
	nodes, err = rdma.NewReader(t.TempDir()).DevNodes()
	require.NoError(t, err)
	require.Empty(t, nodes)
}

func TestParseGID(t *testing.T) {
	require.Equal(t, "192.168.1.10", rdma.ParseGID("0000:0000:0000:0000:0000:ffff:c0a8:010a").String())
	require.Equal(t, "fe80::1", rdma.ParseGID("fe80:0000:0000:0000:0000:0000:0000:0001").String())
	for _, bad := range []string{"", "fe80::1", "zzzz:0000:0000:0000:0000:0000:0000:0001", "0:0:0:0:0:0:0:0"} {
		require.Nil(t, rdma.ParseGID(bad), bad)
	}
}

func TestUverbsMatchedByIbdev(t *testing.T) {
	// Two ib devices under one function: each uverbs goes to the device its
	// ibdev names, whatever the numbers say.
	dir := t.TempDir()
	write := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(s), 0o644))
	}
	write("infiniband/mlx5_0/ports/1/link_layer", "Ethernet\n")
	write("infiniband/mlx5_1/ports/1/link_layer", "Ethernet\n")
	write("infiniband_verbs/uverbs0/ibdev", "mlx5_1\n")
	write("infiniband_verbs/uverbs1/ibdev", "mlx5_0\n")
	write("infiniband_verbs/uverbs2/ibdev", "mlx5_9\n") // not ours
	write("infiniband_verbs/abi_version", "6\n")
	devs, err := rdma.NewReader(t.TempDir()).DevicesAt(dir)
	require.NoError(t, err)
	require.Len(t, devs, 2)
	require.Equal(t, "uverbs1", devs[0].CharDevices[0].Name)
	require.Equal(t, "uverbs0", devs[1].CharDevices[0].Name)
	require.Equal(t, "", devs[0].Ports[0].State)
}
