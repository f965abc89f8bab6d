package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

// fakeKernel writes, with the fixture builder, a /sys standing in for a
// kernel with the rxe device dev (its GID table gids) and the RDMA
// modules; it returns that /sys.
func fakeKernel(t *testing.T, dev string, gids []fixture.GID) string {
	t.Helper()
	root := t.TempDir()
	b, err := fixture.NewBuilder(root)
	require.NoError(t, err)
	// rxe devices have no PCI function of their own; the builder needs
	// one to hang the device on, and the check reads only its class link.
	require.NoError(t, b.Add(fixture.Function{Address: "0000:01:00.0", Vendor: "1af4", Device: "1041", Class: "0x020000",
		Driver: "virtio-pci", IOMMUGroup: -1, Parent: "pci0000:00",
		RDMA: []fixture.RDMADevice{{Name: dev, LinkLayer: "Ethernet", Uverbs: -1, Umad: -1, NodeGUID: fixture.GUID(1, 1), GIDs: gids}}}))
	require.NoError(t, b.Modules(fixture.RDMAModules("rdma_rxe")...))
	return filepath.Join(root, "sys")
}

// roceGIDs is what the kernel fills for addrs on netdev: each address's
// RoCE v1 and v2 GIDs (link-local first).
func roceGIDs(netdev string, addrs ...string) []fixture.GID {
	gids := []fixture.GID{
		{GID: "fe80:0000:0000:0000:0800:00ff:fe00:0001", Type: "IB/RoCE v1", Netdev: netdev},
		{GID: "fe80:0000:0000:0000:0800:00ff:fe00:0001", Type: "RoCE v2", Netdev: netdev},
	}
	for _, a := range addrs {
		g := gidOf(net.ParseIP(a))
		gids = append(gids, fixture.GID{GID: g, Type: "IB/RoCE v1", Netdev: netdev}, fixture.GID{GID: g, Type: "RoCE v2", Netdev: netdev})
	}
	return gids
}

// gidOf writes ip as sysfs does (%pI6: eight groups of four digits).
func gidOf(ip net.IP) string {
	b := ip.To16()
	groups := make([]string, 8)
	for i := range groups {
		groups[i] = fmt.Sprintf("%02x%02x", b[2*i], b[2*i+1])
	}
	return strings.Join(groups, ":")
}

func TestGIDTable(t *testing.T) {
	gids := append(roceGIDs("fprcvf0", "192.168.77.1"), roceGIDs("other", "10.0.0.1")[2:]...)
	// An address the kernel gave only a RoCE v1 GID (RoCE v2 off).
	gids = append(gids, fixture.GID{GID: gidOf(net.ParseIP("172.16.0.1")), Type: "IB/RoCE v1", Netdev: "fprcvf0"})
	sys := fakeKernel(t, "rxefp000001", gids)
	port := filepath.Join(sys, "class", "infiniband", "rxefp000001", "ports", "1")
	table, err := readGIDs(port)
	require.NoError(t, err)
	require.Len(t, table, len(gids), "the fixture's 16 slots less the empty ones")
	require.Equal(t, "[3] 192.168.77.1 RoCE v2 fprcvf0", table[3].String())

	for _, tc := range []struct {
		name, ip, netdev string
		index            int // -1: none
	}{
		{"the node's address", "192.168.77.1", "fprcvf0", 3},
		{"on another netdev", "192.168.77.1", "net1", -1},
		{"another netdev's address", "10.0.0.1", "fprcvf0", -1},
		{"that netdev's address", "10.0.0.1", "other", 5},
		{"RoCE v1 only", "172.16.0.1", "fprcvf0", -1},
		{"absent", "192.168.78.2", "fprcvf0", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g, ok := roceV2GID(table, net.ParseIP(tc.ip), tc.netdev)
			require.Equal(t, tc.index >= 0, ok)
			if ok {
				require.Equal(t, tc.index, g.Index)
			}
		})
	}

	_, err = readGIDs(filepath.Join(sys, "class", "infiniband", "gone", "ports", "1"))
	require.ErrorContains(t, err, "GID table")
}

func TestWaitGID(t *testing.T) {
	sys := fakeKernel(t, "rxefp000002", roceGIDs("fprcvf0"))
	port := filepath.Join(sys, "class", "infiniband", "rxefp000002", "ports", "1")
	pod := net.ParseIP("192.168.78.2")

	_, err := waitGID(port, pod, "net1", 200*time.Millisecond)
	require.ErrorIs(t, err, errNoGID)
	require.ErrorContains(t, err, "[1] fe80::800:ff:fe00:1 RoCE v2 fprcvf0", "the table is in the error")

	// The kernel fills the slot from a work queue after the address is
	// added: it comes while waitGID waits.
	go func() {
		time.Sleep(150 * time.Millisecond)
		_ = os.WriteFile(filepath.Join(port, "gid_attrs", "ndevs", "2"), []byte("net1\n"), 0o644)
		_ = os.WriteFile(filepath.Join(port, "gid_attrs", "types", "2"), []byte("RoCE v2\n"), 0o644)
		_ = os.WriteFile(filepath.Join(port, "gids", "2"), []byte(gidOf(pod)+"\n"), 0o644)
	}()
	g, err := waitGID(port, pod, "net1", 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, 2, g.Index)
}
