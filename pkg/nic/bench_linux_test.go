package nic_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/fixture"
	"github.com/fastpath-k8s/fastpath/internal/floor"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/nic/fromnic"
)

// discoverHosts are the generated scale hosts: PFs x VFs per PF.
var discoverHosts = []struct{ pfs, vfs int }{{8, 16}, {8, 128}, {32, 128}}

// BenchmarkDiscover scans generated hosts of 128, 1024 and 4096 VFs. Each
// VF has a netdev, an RDMA device and uverbs/umad/issm char devices.
//
// The floor sub-benchmark is not fastpath code: on the same host it makes
// only the system calls no faithful scan can do without (package
// internal/floor says which). It tells what this machine's kernel charges for
// reading a node, so that Scan's figure can be read against it. vs-floor
// alternates the two and reports the median ratio (x-floor), beside the
// medians of the scan (ms) and of the floor pass (floor-ms) in those
// pairs. Goal: x-floor ≤ 1.05 (goal-x-floor).
func BenchmarkDiscover(b *testing.B) {
	for _, h := range discoverHosts {
		b.Run(fmt.Sprintf("vfs=%d", h.pfs*h.vfs), func(b *testing.B) {
			root := b.TempDir()
			require.NoError(b, fixture.Generate(root, h.pfs, h.vfs))
			sc := nic.NewScanner(root)
			snap, err := sc.Scan()
			require.NoError(b, err)
			require.Len(b, snap.Devices, h.pfs*(h.vfs+1))
			b.Run("scan", func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					if _, err := sc.Scan(); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(h.pfs*h.vfs), "ns/vf")
			})
			b.Run("floor", func(b *testing.B) { benchFloor(b, root, snap, h.pfs*h.vfs) })
			b.Run("vs-floor", func(b *testing.B) { benchVsFloor(b, root, sc, snap, h.pfs*h.vfs) })
		})
	}
}

// benchFloor makes the floor's system calls for every VF of snap.
func benchFloor(b *testing.B, root string, snap *nic.Snapshot, vfs int) {
	floor := floorOps(b, root, snap, vfs)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		floor()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(vfs), "ns/vf")
}

// benchVsFloor alternates one scan and one floor pass and reports the
// median of their ratio (x-floor): on a machine shared with other work,
// the scan and floor sub-benchmarks run seconds apart under different
// load, and their quotient is not the scan's cost against the floor.
func benchVsFloor(b *testing.B, root string, sc *nic.Scanner, snap *nic.Snapshot, vfs int) {
	floor := floorOps(b, root, snap, vfs)
	ratios := make([]float64, 0, max(b.N, minPairs))
	var scans, floors []float64
	pair := func() {
		t0 := time.Now()
		if _, err := sc.Scan(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		floor()
		scan, fl := t1.Sub(t0), time.Since(t1)
		ratios = append(ratios, float64(scan)/float64(fl))
		scans, floors = append(scans, float64(scan.Microseconds())/1e3), append(floors, float64(fl.Microseconds())/1e3)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		pair()
	}
	b.StopTimer()
	// The median stands on at least minPairs pairs; those past b.N are
	// not timed.
	for len(ratios) < minPairs {
		pair()
	}
	for _, m := range []struct {
		xs   []float64
		unit string
	}{{ratios, "x-floor"}, {scans, "ms"}, {floors, "floor-ms"}} {
		slices.Sort(m.xs)
		b.ReportMetric(m.xs[len(m.xs)/2], m.unit)
	}
	b.ReportMetric(1.05, "goal-x-floor")
}

// minPairs is how many pairs vs-floor makes at least: at the default
// benchtime a 1024-VF host gets about twenty, and a garbage collection
// falls in every few scans, so the median of twenty moves by several
// hundredths from one run to the next.
const minPairs = 60

// floorOps prepares the floor's system calls for every VF of snap and
// returns a function that makes them once, from one thread per CPU.
func floorOps(b *testing.B, root string, snap *nic.Snapshot, vfs int) func() {
	vfList, err := fromnic.VFs(snap)
	require.NoError(b, err)
	require.Len(b, vfList, vfs)
	pass, err := floor.Open(root)
	require.NoError(b, err)
	b.Cleanup(pass.Close)
	ops := floor.Ops(vfList)
	threads := runtime.GOMAXPROCS(0)
	return func() {
		if err := pass.Run(ops, threads); err != nil {
			b.Fatal(err)
		}
	}
}
