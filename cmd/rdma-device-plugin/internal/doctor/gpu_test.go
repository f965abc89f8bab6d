package doctor

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

// gpuHost is two rails laid out like a DGX H100's: a root port, a PCIe
// switch, and below it an H100 and a ConnectX-7 PF with 2 VFs; rail 1's PF
// has VFs only when vfs1 is set. Rail 0 is on NUMA 0, rail 1 on NUMA 1.
func gpuHost(t *testing.T, vfs1 bool) string {
	t.Helper()
	root := t.TempDir()
	b, err := fixture.NewBuilder(root)
	require.NoError(t, err)
	idx := 0
	for rail, bus := range []int{0x18, 0x40} {
		rc := fmt.Sprintf("pci0000:%02x", bus-3)
		p, err := b.Bridge(rc, fixture.PCIAddress(0, bus-3, 1, 0), "8086", "352a", rail)
		require.NoError(t, err)
		p, err = b.Bridge(p, fixture.PCIAddress(0, bus-2, 0, 0), "1000", "c030", rail)
		require.NoError(t, err)
		nic, err := b.Bridge(p, fixture.PCIAddress(0, bus-1, 0, 0), "1000", "c030", rail)
		require.NoError(t, err)
		gpu, err := b.Bridge(p, fixture.PCIAddress(0, bus-1, 1, 0), "1000", "c030", rail)
		require.NoError(t, err)
		require.NoError(t, b.Add(fixture.Function{Address: fixture.PCIAddress(0, bus+1, 0, 0), Vendor: "10de", Device: "2330",
			Class: "0x030200", Driver: "nvidia", NUMANode: rail, IOMMUGroup: -1, Parent: gpu}))
		pf := fixture.Function{Address: fixture.PCIAddress(0, bus, 0, 0), Vendor: "15b3", Device: "1021", Class: "0x020700",
			Driver: "mlx5_core", NUMANode: rail, IOMMUGroup: -1, Parent: nic, TotalVFs: 4,
			Netdevs: []fixture.Netdev{{Name: fmt.Sprintf("ibp%ds0", bus), MAC: fixture.MAC(bus, 0), Type: 32}},
			RDMA:    []fixture.RDMADevice{{Name: fmt.Sprintf("mlx5_%d", idx), LinkLayer: "InfiniBand", Uverbs: idx, Umad: idx}}}
		idx++
		if rail == 0 || vfs1 {
			for k := 0; k < 2; k++ {
				pf.VFs = append(pf.VFs, fixture.Function{Address: fixture.VFAddress(bus, k), Vendor: "15b3", Device: "101e",
					Class: "0x020700", Driver: "mlx5_core", NUMANode: rail, IOMMUGroup: -1,
					Netdevs: []fixture.Netdev{{Name: fmt.Sprintf("ibp%ds0v%d", bus, k), MAC: fixture.MAC(bus, k+1), Type: 32}},
					RDMA:    []fixture.RDMADevice{{Name: fmt.Sprintf("mlx5_%d", idx), LinkLayer: "InfiniBand", Uverbs: idx, Umad: idx}}})
				idx++
			}
		}
		require.NoError(t, b.Add(pf))
	}
	require.NoError(t, b.Modules(fixture.RDMAModules()...))
	return root
}

func TestGPUAffinity(t *testing.T) {
	cfg := config(t, genConfig)
	t.Run("a VF under every GPU's switch", func(t *testing.T) {
		r := Run(Options{HostRoot: gpuHost(t, true), Config: cfg})
		requireCheck(t, r, "gpu-affinity", OK, "mellanox.com/rails", "each of the 2 GPUs", "4 in all")
	})
	t.Run("a GPU with no VF of the pool near it", func(t *testing.T) {
		r := Run(Options{HostRoot: gpuHost(t, false), Config: cfg})
		requireCheck(t, r, "gpu-affinity", Warn, "mellanox.com/rails", "1 of 2 GPUs", "0000:41:00.0 (NUMA 1)", "another NUMA node", "GPUDirect RDMA")
	})
	t.Run("the DGX fixture", func(t *testing.T) {
		root := newHost(t, "dgx-h100", func(root string) error { return fixture.DisableVFs(root, "0000:9a:00.0") })
		r := Run(Options{HostRoot: root, Config: config(t, genConfig)})
		// Rail 4's GPU (0000:9b:00.0) loses its switch-mates; the nearest
		// VFs are on the other NUMA 1 rails' root complexes.
		requireCheck(t, r, "gpu-affinity", Warn, "1 of 8 GPUs", "0000:9b:00.0 (NUMA 1): nearest on its NUMA node only")
	})
	t.Run("no GPU", func(t *testing.T) {
		requireCheck(t, Run(Options{HostRoot: newHost(t, "generate"), Config: cfg}), "gpu-affinity", Skip, "no NVIDIA GPU")
	})
}
