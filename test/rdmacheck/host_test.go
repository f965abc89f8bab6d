package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

func TestWriteHost(t *testing.T) {
	const dev = "rxefp00abcd"
	kernel := fakeKernel(t, dev, roceGIDs("fprcvf0", "192.168.77.1"))
	root := filepath.Join(t.TempDir(), "host")
	vfs := []standIn{
		{PCIAddress: vfAddress(0), Netdev: "fprcvf0", MAC: "0a:00:00:00:00:01", RDMA: dev},
		{PCIAddress: vfAddress(1), Netdev: "fprcvf1", MAC: "0a:00:00:00:00:02"},
	}
	require.NoError(t, writeHost(root, kernel, vfs))

	d, err := nic.NewScanner(root).Device(vfAddress(0))
	require.NoError(t, err)
	require.Equal(t, hostPF, d.PFAddress, "a VF of the fixture PF")
	require.Equal(t, 0, d.VFIndex)
	require.Equal(t, "fprcvf0", d.Netdev)
	require.Equal(t, dev, d.RDMADevice)
	require.Equal(t, "Ethernet", d.LinkType, "the link layer is the kernel's, through the ports link")
	state, err := os.ReadFile(filepath.Join(root, "sys", "class", "infiniband", dev, "ports", "1", "state"))
	require.NoError(t, err)
	require.Equal(t, "4: ACTIVE\n", string(state))
	table, err := readGIDs(filepath.Join(root, "sys", "class", "infiniband", dev, "ports", "1"))
	require.NoError(t, err)
	_, ok := roceV2GID(table, []byte{192, 168, 77, 1}, "fprcvf0")
	require.True(t, ok, "the VF's GID table is the kernel's: %v", table)

	d, err = nic.NewScanner(root).Device(vfAddress(1))
	require.NoError(t, err)
	require.Equal(t, "fprcvf1", d.Netdev)
	require.Empty(t, d.RDMADevice)

	boot, err := os.ReadFile(filepath.Join(root, "proc", "sys", "kernel", "random", "boot_id"))
	require.NoError(t, err)
	own, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	require.Equal(t, own, boot, "doctor must take the host for this machine's")

	// The kernel unregisters the device (rxe does when its netdev leaves
	// the netns): the rewritten host has none either, as sysfs would.
	require.NoError(t, os.RemoveAll(filepath.Join(kernel, "class", "infiniband", dev)))
	require.NoError(t, writeHost(root, kernel, vfs))
	d, err = nic.NewScanner(root).Device(vfAddress(0))
	require.NoError(t, err)
	require.Equal(t, "fprcvf0", d.Netdev)
	require.Empty(t, d.RDMADevice)
}

// TestDoctorOnHost runs the real doctor on a host written over a kernel
// stand-in and judges it: the port and the GID table are the stand-in's,
// read through the host; the netns mode must come from RDMA netlink, and
// where the kernel has none (this stand-in, and any machine without
// ib_core) doctor reads ib_core's parameter, which the judgement refuses.
func TestDoctorOnHost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the device plugin")
	}
	const dev = "rxefp00beef"
	kernel := fakeKernel(t, dev, roceGIDs("fprcvf0", "192.168.77.1"))
	root := filepath.Join(t.TempDir(), "host")
	require.NoError(t, writeHost(root, kernel, []standIn{{PCIAddress: vfAddress(0), Netdev: "fprcvf0", MAC: "0a:00:00:00:00:01", RDMA: dev}}))
	bin := testbin.Build(t, "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin")
	checks, err := runDoctor(bin, root)
	require.NoError(t, err)

	good, healthy := judgeDoctor(checks, modeShared, dev)
	require.Len(t, good, 2, "port and roce-gid: %v", good)
	require.Contains(t, good[0], "ACTIVE and LinkUp")
	require.Contains(t, good[1], "every IPv4 address has its RoCE v2 GID")
	// A port the kernel says is down fails the judgement.
	require.NoError(t, os.WriteFile(filepath.Join(kernel, "class", "infiniband", dev, "ports", "1", "state"), []byte("1: DOWN\n"), 0o644))
	checks, err = runDoctor(bin, root)
	require.NoError(t, err)
	_, bad := judgeDoctor(checks, modeShared, dev)
	require.True(t, slices.ContainsFunc(bad, func(err error) bool {
		return strings.Contains(err.Error(), "doctor port: want "+dev+"'s port ACTIVE and LinkUp")
	}), "a port down is judged: %v", bad)
	if _, err := netnsMode(); err == nil {
		t.Skip("this kernel has RDMA netlink: the fallback is not what doctor reads here")
	}
	require.Len(t, healthy, 1)
	require.ErrorContains(t, healthy[0], `doctor rdma-netns: want ok "shared" from RDMA netlink`)
	require.True(t, strings.Contains(healthy[0].Error(), "parameters/netns_mode"), "doctor fell back to ib_core's parameter: %v", healthy[0])
}
