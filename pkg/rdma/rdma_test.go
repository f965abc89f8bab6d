package rdma_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func root(name string) string { return filepath.Join("..", "..", "testdata", "sysfs", name) }

func TestDevicesDGX(t *testing.T) {
	r := rdma.NewReader(root("dgx-h100"))
	devs, err := r.Devices("0000:18:00.1")
	require.NoError(t, err)
	require.Equal(t, []rdma.Device{{
		Name:  "mlx5_12",
		Ports: []rdma.Port{{Number: 1, LinkLayer: "InfiniBand"}},
		CharDevices: []rdma.CharDevice{
			{Kind: "uverbs", Name: "uverbs14", Path: "/dev/infiniband/uverbs14"},
			{Kind: "umad", Name: "umad12", Path: "/dev/infiniband/umad12", Port: 1},
			{Kind: "issm", Name: "issm12", Path: "/dev/infiniband/issm12", Port: 1},
		},
	}}, devs)

	// The GPU has none. The E810's irdma device is the PCI function's,
	// where 6.12's irdma parents it although it binds to the auxiliary
	// device ice.roce.0 (docs/vendors.md).
	devs, err = r.Devices("0000:19:00.0")
	require.NoError(t, err)
	require.Empty(t, devs)
	devs, err = r.Devices("0000:0c:00.0")
	require.NoError(t, err)
	require.Equal(t, []rdma.Device{{
		Name:        "irdma0",
		Ports:       []rdma.Port{{Number: 1, LinkLayer: "Ethernet"}},
		CharDevices: []rdma.CharDevice{{Kind: "uverbs", Name: "uverbs0", Path: "/dev/infiniband/uverbs0"}},
	}}, devs)

	_, err = r.Devices("../../x")
	require.ErrorContains(t, err, "not a PCI address")
}

// A device below an auxiliary device of the function, as an mlx5
// sub-function's is below its mlx5_core.sf.N, is that device's, not the
// PCI function's own.
func TestDevicesBelowAnAuxiliaryDevice(t *testing.T) {
	host := filepath.Join(t.TempDir(), "dgx")
	require.NoError(t, fixture.Write(host, "dgx-h100"))
	fn := filepath.Join(host, "sys/devices/pci0000:0a/0000:0a:02.0/0000:0c:00.0")
	sf := filepath.Join(fn, "mlx5_core.sf.2")
	require.NoError(t, os.MkdirAll(sf, 0o755))
	require.NoError(t, os.Rename(filepath.Join(fn, "infiniband"), filepath.Join(sf, "infiniband")))
	class := filepath.Join(host, "sys/class/infiniband/irdma0")
	target, err := os.Readlink(class)
	require.NoError(t, err)
	require.NoError(t, os.Remove(class))
	// .../0000:0c:00.0/infiniband/irdma0 -> .../0000:0c:00.0/mlx5_core.sf.2/infiniband/irdma0
	require.NoError(t, os.Symlink(filepath.Join(filepath.Dir(filepath.Dir(target)), "mlx5_core.sf.2", "infiniband", "irdma0"), class))
	require.NoError(t, os.Remove(filepath.Join(sf, "infiniband/irdma0/device")))
	require.NoError(t, os.Symlink("../..", filepath.Join(sf, "infiniband/irdma0/device")))
	resolved, err := filepath.EvalSymlinks(filepath.Join(class, "device"))
	require.NoError(t, err)
	require.Equal(t, "mlx5_core.sf.2", filepath.Base(resolved), "the device's parent is the auxiliary device")

	devs, err := rdma.NewReader(host).Devices("0000:0c:00.0")
	require.NoError(t, err)
	require.Empty(t, devs)
}

func TestDevNodes(t *testing.T) {
	r := rdma.NewReader(root("dgx-h100"))
	nodes, err := r.DevNodes()
	require.NoError(t, err)
	require.True(t, nodes.Has("/dev/infiniband/uverbs14"))
	require.False(t, nodes.Has("/dev/infiniband/uverbs99"))
	require.False(t, nodes.Has("uverbs14"), "a host path, not a name")
	require.True(t, nodes.Has(rdma.RDMACMPath))
	nodes, err = rdma.NewReader(t.TempDir()).DevNodes()
	require.NoError(t, err)
	require.Zero(t, nodes.Len())
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
}

// fn lays out one PCI function's RDMA pieces below dir: files maps a path
// below the function to its content.
func fn(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "sys", "devices", "pci0000:00", "0000:01:00.0")
	for p, content := range files {
		require.NoError(t, os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, p), []byte(content+"\n"), 0o644))
	}
	return dir
}

func TestDevicesPorts(t *testing.T) {
	r := rdma.NewReader("/")
	// A dual-port device: two umad devices, one per port, each naming it.
	dir := fn(t, map[string]string{
		"infiniband/mlx4_0/ports/1/link_layer": "InfiniBand",
		"infiniband/mlx4_0/ports/2/link_layer": "Ethernet",
		"infiniband_verbs/uverbs3/ibdev":       "mlx4_0",
		"infiniband_mad/umad4/port":            "1",
		"infiniband_mad/umad5/port":            "2",
		"infiniband_mad/issm4/port":            "1",
		"infiniband_mad/issm5/port":            "2",
	})
	devs, err := r.DevicesAt(dir)
	require.NoError(t, err)
	require.Len(t, devs, 1)
	require.Equal(t, []rdma.Port{{1, "InfiniBand"}, {2, "Ethernet"}}, devs[0].Ports)
	require.Equal(t, []rdma.CharDevice{
		{Kind: "uverbs", Name: "uverbs3", Path: "/dev/infiniband/uverbs3"},
		{Kind: "umad", Name: "umad4", Path: "/dev/infiniband/umad4", Port: 1},
		{Kind: "issm", Name: "issm4", Path: "/dev/infiniband/issm4", Port: 1},
		{Kind: "umad", Name: "umad5", Path: "/dev/infiniband/umad5", Port: 2},
		{Kind: "issm", Name: "issm5", Path: "/dev/infiniband/issm5", Port: 2},
	}, devs[0].CharDevices)

	// One umad device: one port, and port 2 is not probed for.
	dir = fn(t, map[string]string{
		"infiniband/mlx5_0/ports/1/link_layer": "InfiniBand",
		"infiniband/mlx5_0/ports/2/link_layer": "InfiniBand",
		"infiniband_mad/umad0/port":            "1",
	})
	devs, err = r.DevicesAt(dir)
	require.NoError(t, err)
	require.Equal(t, []rdma.Port{{Number: 1, LinkLayer: "InfiniBand"}}, devs[0].Ports)

	// Without ib_umad nothing tells the port count: ports are read until
	// one is missing.
	dir = fn(t, map[string]string{
		"infiniband/mlx5_0/ports/1/link_layer": "Ethernet",
		"infiniband/mlx5_0/ports/2/link_layer": "Ethernet",
		"infiniband_verbs/uverbs0/ibdev":       "mlx5_0",
	})
	devs, err = r.DevicesAt(dir)
	require.NoError(t, err)
	require.Len(t, devs, 1)
	require.Len(t, devs[0].Ports, 2)

	// Two devices on one function: char devices go by their ibdev.
	dir = fn(t, map[string]string{
		"infiniband/mlx5_0/ports/1/link_layer": "Ethernet",
		"infiniband/mlx5_1/ports/1/link_layer": "Ethernet",
		"infiniband_verbs/uverbs0/ibdev":       "mlx5_1",
		"infiniband_verbs/uverbs1/ibdev":       "mlx5_0",
		"infiniband_verbs/uverbs2/ibdev":       "gone_9",
		"infiniband_mad/umad0/ibdev":           "mlx5_0",
		"infiniband_mad/umad0/port":            "1",
	})
	devs, err = r.DevicesAt(dir)
	require.NoError(t, err)
	require.Len(t, devs, 2)
	require.Equal(t, "mlx5_0", devs[0].Name)
	require.Equal(t, []rdma.CharDevice{
		{Kind: "uverbs", Name: "uverbs1", Path: "/dev/infiniband/uverbs1"},
		{Kind: "umad", Name: "umad0", Path: "/dev/infiniband/umad0", Port: 1},
	}, devs[0].CharDevices)
	require.Equal(t, []rdma.CharDevice{{Kind: "uverbs", Name: "uverbs0", Path: "/dev/infiniband/uverbs0"}}, devs[1].CharDevices)

	// Entries that are no char device of a kind, listed before those
	// that are, are skipped: the paths stay each device's own.
	dir = fn(t, map[string]string{
		"infiniband/mlx5_7/ports/1/link_layer": "InfiniBand",
		"infiniband_verbs/abi_version":         "6",
		"infiniband_verbs/uverbs7/ibdev":       "mlx5_7",
		"infiniband_mad/abi_version":           "5",
		"infiniband_mad/issm7/port":            "1",
		"infiniband_mad/umad7/port":            "1",
	})
	devs, err = r.DevicesAt(dir)
	require.NoError(t, err)
	require.Len(t, devs, 1)
	require.Equal(t, []rdma.CharDevice{
		{Kind: "uverbs", Name: "uverbs7", Path: "/dev/infiniband/uverbs7"},
		{Kind: "umad", Name: "umad7", Path: "/dev/infiniband/umad7", Port: 1},
		{Kind: "issm", Name: "issm7", Path: "/dev/infiniband/issm7", Port: 1},
	}, devs[0].CharDevices)

	// A link_layer that cannot be read is an error naming it.
	dir = fn(t, map[string]string{"infiniband/mlx5_0/ports/1/link_layer/x": ""})
	_, err = r.DevicesAt(dir)
	require.ErrorContains(t, err, "link_layer")
}

// The class view fallback reads an entry's ibdev through its link only
// when the link stays inside <root>/sys/devices.
func TestClassCharDevicesStayInRoot(t *testing.T) {
	host := t.TempDir()
	root := filepath.Join(host, "root")
	write := func(p, s string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte(s), 0o644))
	}
	link := func(target, p string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.Symlink(target, p))
	}
	fn := "devices/pci0000:00/0000:01:00.0/infiniband_verbs/"
	write(filepath.Join(root, "sys", fn, "uverbs0", "ibdev"), "mlx5_0\n")
	link("../../"+fn+"uverbs0", filepath.Join(root, "sys/class/infiniband_verbs/uverbs0"))
	// The same layout outside the root, and a link out to it.
	write(filepath.Join(host, "outside", fn, "uverbs1", "ibdev"), "mlx5_0\n")
	link("../../../../outside/"+fn+"uverbs1", filepath.Join(root, "sys/class/infiniband_verbs/uverbs1"))
	link("../../devices/../../../outside/"+fn+"uverbs1", filepath.Join(root, "sys/class/infiniband_verbs/uverbs2"))

	got, err := rdma.NewReader(root).ClassCharDevices()
	require.NoError(t, err)
	require.Equal(t, map[string][]rdma.CharDevice{
		"mlx5_0": {{Kind: "uverbs", Name: "uverbs0", Path: "/dev/infiniband/uverbs0"}},
	}, got)
}
