package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

func fixture(name string) string { return filepath.Join("..", "..", "testdata", "sysfs", name) }
func config(name string) string  { return filepath.Join("..", "..", "testdata", "config", name) }

func discoverJSON(t *testing.T, args ...string) map[string]any {
	t.Helper()
	var out, errs bytes.Buffer
	require.NoError(t, run(context.Background(), append([]string{"discover", "-o", "json"}, args...), &out, &errs), errs.String())
	var v map[string]any
	require.NoError(t, json.Unmarshal(out.Bytes(), &v))
	return v
}

// In the plugin's container, discover reads the node where the DaemonSet
// mounts it ($FASTPATH_HOST_ROOT), not the container's own /dev, which has
// no /dev/infiniband: every device would look like it lacks its char
// devices.
func TestDiscoverDefaultsToFastpathHostRoot(t *testing.T) {
	t.Setenv("FASTPATH_HOST_ROOT", fixture("dgx-h100"))
	v := discoverJSON(t)
	devices := v["devices"].([]any)
	require.Len(t, devices, 2+8+32+4)
	for _, d := range devices {
		m := d.(map[string]any)
		if m["pciAddress"] == "0000:18:00.1" {
			require.NotEmpty(t, m["charDevices"], "char devices read below $FASTPATH_HOST_ROOT")
		}
	}
	// An explicit --host-root wins.
	var out, errs bytes.Buffer
	err := run(context.Background(), []string{"discover", "--host-root", "/nonexistent-host"}, &out, &errs)
	require.ErrorContains(t, err, "/nonexistent-host")
}

func TestDiscoverJSONShape(t *testing.T) {
	v := discoverJSON(t, "--host-root", fixture("dgx-h100"), "--config", config("combined.json"))

	devices := v["devices"].([]any)
	require.Len(t, devices, 2+8+32+4, "the E810's 2 ports (irdma), 8 IB PFs, 32 VFs, 4 storage ports; the GPUs are not listed")
	byAddr := map[string]map[string]any{}
	for _, d := range devices {
		m := d.(map[string]any)
		byAddr[m["pciAddress"].(string)] = m
	}
	vf := byAddr["0000:18:00.1"]
	for k, want := range map[string]any{
		"pciAddress": "0000:18:00.1", "vendor": "15b3", "device": "101e", "class": "0x020700",
		"driver": "mlx5_core", "numaNode": 0.0, "pfAddress": "0000:18:00.0", "vfIndex": 0.0,
		"netdev": "ibp24s0v0", "linkType": "InfiniBand", "rdmaDevice": "mlx5_12", "pcieRoot": "pci0000:15",
		"charDevices": []any{"/dev/infiniband/uverbs14", "/dev/infiniband/umad12", "/dev/infiniband/issm12", "/dev/infiniband/rdma_cm"},
	} {
		require.Equal(t, want, vf[k], k)
	}
	pf := byAddr["0000:dc:00.0"]
	require.Equal(t, "", pf["pfAddress"])
	require.Equal(t, -1.0, pf["vfIndex"])
	require.Equal(t, 1.0, pf["numaNode"])
	require.Equal(t, "mlx5_7", pf["rdmaDevice"])

	pools := v["pools"].([]any)
	require.Len(t, pools, 2)
	shared := pools[0].(map[string]any)
	require.Equal(t, "rdma/hca_shared_devices_a", shared["resource"])
	require.Equal(t, "shared", shared["kind"])
	require.Equal(t, 63.0, shared["capacity"])
	require.Len(t, shared["devices"], 8)
	excl := pools[1].(map[string]any)
	require.Equal(t, "mellanox.com/mlnx_sriov_rdma", excl["resource"])
	require.Equal(t, "exclusive", excl["kind"])
	require.Equal(t, 32.0, excl["capacity"])
	require.Equal(t, "0000:18:00.1", excl["devices"].([]any)[0])
	require.Empty(t, v["warnings"])
}

func TestDiscoverWithoutConfig(t *testing.T) {
	v := discoverJSON(t, "--host-root", fixture("roce-cx6dx"))
	require.Len(t, v["devices"], 10)
	require.Empty(t, v["pools"])
}

// Missing pieces are empty values and warnings, never a crash.
func TestDiscoverEdgeWarnings(t *testing.T) {
	v := discoverJSON(t, "--host-root", fixture("edge"))
	warns := v["warnings"].([]any)
	joined := ""
	for _, w := range warns {
		joined += w.(string) + "\n"
	}
	require.Contains(t, joined, "0000:86:00.2: no driver bound")
	require.Contains(t, joined, "0000:86:00.4: no RDMA device")
	byAddr := map[string]map[string]any{}
	for _, d := range v["devices"].([]any) {
		m := d.(map[string]any)
		byAddr[m["pciAddress"].(string)] = m
	}
	require.NotContains(t, byAddr, "0000:85:00.0", "a ConnectX PCIe bridge is not a NIC")
	require.NotContains(t, byAddr, "0000:03:00.0", "a BlueField management function is not a NIC")
	vfio, ok := byAddr["0000:86:00.1"]
	require.True(t, ok, "the vfio-pci VF is listed")
	require.Equal(t, "vfio-pci", vfio["driver"])
	require.Equal(t, []any{"/dev/vfio/vfio", "/dev/vfio/71"}, vfio["vfioDevices"])
	require.Equal(t, "", vfio["netdev"])
	require.Equal(t, "", vfio["rdmaDevice"])
	require.Equal(t, []any{}, vfio["charDevices"])
}

func TestDiscoverTable(t *testing.T) {
	var out, errs bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"discover", "--host-root", fixture("dgx-h100"), "--config", config("combined.json")}, &out, &errs))
	lines := strings.Split(out.String(), "\n")
	require.Regexp(t, `^PCI\s+MODEL\s+DRIVER\s+NUMA\s+PCIE ROOT\s+NETDEV\s+LINK\s+RDMA\s+CHAR DEVICES\s+POOL$`, lines[0])
	// the E810's ports first (bus 0c), served for their irdma devices, in no pool
	require.Regexp(t, `^0000:0c:00.0\s+\S+\s+ice\s+0\s+pci0000:0a\s+enp12s0f0\s+Ethernet\s+irdma0\s+uverbs0,rdma_cm\s+-$`, lines[1])
	require.Regexp(t, `^0000:0c:00.1\s`, lines[2])
	lines = append(lines[:1], lines[3:]...)
	require.Regexp(t, `^0000:18:00.0 \(4/16 VFs\)\s+\S+\s+mlx5_core\s+0\s+pci0000:15\s+ibp24s0\s+InfiniBand\s+mlx5_0\s+uverbs2,umad0,issm0,rdma_cm\s+rdma/hca_shared_devices_a$`, lines[1])
	require.Regexp(t, `^  ├─ vf0 0000:18:00.1\s+\S+\s+mlx5_core\s+0\s+pci0000:15\s+ibp24s0v0\s+InfiniBand\s+mlx5_12\s+uverbs14,umad12,issm12,rdma_cm\s+mellanox.com/mlnx_sriov_rdma$`, lines[2])
	require.Regexp(t, `^  └─ vf3 0000:18:00.4\s`, lines[5])
	require.Contains(t, out.String(), "pool mellanox.com/mlnx_sriov_rdma (exclusive): 32 devices, capacity 32, policy spread")
	require.Empty(t, errs.String())
}

func TestDiscoverErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"bad output", []string{"-o", "yaml"}, `-o "yaml": want table or json`},
		{"missing config", []string{"--host-root", fixture("dgx-h100"), "--config", "nope.json"}, "pool config file does not exist: nope.json"},
		{"missing host root", []string{"--host-root", "/nonexistent-host"}, "/nonexistent-host"},
		{"extra argument", []string{"extra"}, `unexpected argument "extra"`},
		{"unknown flag", []string{"--hostroot", "x"}, "flag provided but not defined"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errs bytes.Buffer
			err := run(context.Background(), append([]string{"discover"}, tt.args...), &out, &errs)
			require.ErrorContains(t, err, tt.want)
		})
	}
}

// The seed's NicClusterPolicy configs, verbatim, give the resource names
// the plugins they were written for advertise: k8s-rdma-shared-dev-plugin
// prefixes a configList entry with rdma/, the resourceList seed names its
// prefix.
func TestDiscoverPeerResourceNames(t *testing.T) {
	for _, tc := range []struct {
		config string
		args   []string
		want   string
	}{
		{"rdma-shared.json", nil, "pool rdma/hca_shared_devices_a (shared): 8 devices, capacity 63"},
		{"sriov-dp.json", nil, "pool mellanox.com/mlnx_sriov_rdma (exclusive): 32 devices, capacity 32"},
		{"rail-spread.json", []string{"--resource-prefix", "nvidia.com"}, "pool nvidia.com/rail_vfs (exclusive): 16 devices, capacity 16, policy spread"},
		{"rdma-shared.json", []string{"--resource-prefix", "nvidia.com"}, "pool rdma/hca_shared_devices_a (shared)"},
	} {
		t.Run(tc.config, func(t *testing.T) {
			var out, errs bytes.Buffer
			args := append([]string{"discover", "--host-root", fixture("dgx-h100"), "--config-file", config(tc.config)}, tc.args...)
			require.NoError(t, run(context.Background(), args, &out, &errs), errs.String())
			require.Contains(t, out.String(), tc.want)
		})
	}
}

// A function whose PCIe root is unknown (its root complex under
// devices/platform, as on arm64 SoCs) shows "-" in the table and "" in JSON.
func TestDiscoverUnknownPCIeRoot(t *testing.T) {
	r := t.TempDir()
	b, err := fx.NewBuilder(r)
	require.NoError(t, err)
	parent, err := b.Bridge("platform/1c00000.pcie/pci0000:00", "0000:00:00.0", "17cb", "0108", 0)
	require.NoError(t, err)
	require.NoError(t, b.Add(fx.Function{
		Address: "0000:01:00.0", Vendor: "15b3", Device: "101d", Class: "0x020000", Driver: "mlx5_core",
		IOMMUGroup: 1, Parent: parent, Netdevs: []fx.Netdev{{Name: "eth0", MAC: fx.MAC(1, 0)}},
		RDMA: []fx.RDMADevice{{Name: "mlx5_0", LinkLayer: "Ethernet", Uverbs: 0, Umad: 0, NodeGUID: fx.GUID(1, 0)}},
	}))
	v := discoverJSON(t, "--host-root", r)
	require.Equal(t, "", v["devices"].([]any)[0].(map[string]any)["pcieRoot"])
	var out, errs bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"discover", "--host-root", r}, &out, &errs))
	require.Regexp(t, `(?m)^0000:01:00.0\s+\S+\s+mlx5_core\s+0\s+-\s+eth0\s+Ethernet\s+mlx5_0\s`, out.String())
}
