package pool_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// BenchmarkBuild assigns a generated host of 8 PFs x 128 VFs to the pools
// of combined.json (the VFs exclusive, the PFs shared): what every scan
// of the device plugin does after discovery, and on its way to
// registration at start.
func BenchmarkBuild(b *testing.B) {
	root := b.TempDir()
	require.NoError(b, fixture.Generate(root, 8, 128))
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(b, err)
	cfg, err := pool.Load(seed("combined.json"))
	require.NoError(b, err)
	pools, _ := pool.Build(cfg, snap.Devices)
	require.Len(b, pools, 2)
	for _, p := range pools {
		want := map[pool.Kind]int{pool.Exclusive: 8 * 128, pool.Shared: 8}[p.Kind]
		require.Len(b, p.Devices, want, p.ResourceName())
	}
	b.ReportAllocs()
	for b.Loop() {
		pool.Build(cfg, snap.Devices)
	}
}
