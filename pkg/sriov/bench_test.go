package sriov_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// discoverHosts are the generated scale hosts: PFs x VFs per PF.
var discoverHosts = []struct{ pfs, vfs int }{{8, 16}, {8, 128}, {32, 128}}

// BenchmarkDiscover scans generated hosts of 128, 1024 and 4096 VFs. Each
// VF has a netdev, an RDMA device and uverbs/umad/issm char devices.
func BenchmarkDiscover(b *testing.B) {
	for _, h := range discoverHosts {
		b.Run(fmt.Sprintf("vfs=%d", h.pfs*h.vfs), func(b *testing.B) {
			root := b.TempDir()
			require.NoError(b, fixture.Generate(root, h.pfs, h.vfs))
			sc := sriov.NewScanner(root)
			snap, err := sc.Scan()
			require.NoError(b, err)
			require.Len(b, snap.Devices, h.pfs*(h.vfs+1))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := sc.Scan(); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(h.pfs*h.vfs), "ns/vf")
		})
	}
}
