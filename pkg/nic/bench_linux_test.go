package nic_test

import (
	"fmt"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor/fromnic"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// discoverHosts are the generated scale hosts: PFs x VFs per PF.
var discoverHosts = []struct{ pfs, vfs int }{{8, 16}, {8, 128}, {32, 128}}

// BenchmarkDiscover scans generated hosts of 128, 1024 and 4096 VFs. Each
// VF has a netdev, an RDMA device and uverbs/umad/issm char devices.
//
// The floor sub-benchmark is not fastpath code: on the same host it makes
// only the system calls no faithful scan can do without (package
// internal/testsupport/floor says which). It tells what this machine's kernel charges for
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
	floor := floorOps(b, root, snap, vfs, false)
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
//
// Each pair also makes, untimed, a floor pass that first lists the bus and
// the four class directories as a scan must (floor.Listings), and reports
// the scan's median ratio to it (x-floorlist) and its median (floorlist-ms):
// the floor of BenchmarkDaemonStart's 1024-VF row. It also reports the
// median ratio of that pass to the floor pass beside it
// (floorlist-vs-floor): what the listings alone take of goal-x-floor. A
// scan cannot learn the functions and their class entries' names without
// them, so where floorlist-vs-floor is above the goal, no faithful scan
// meets it on that machine.
func benchVsFloor(b *testing.B, root string, sc *nic.Scanner, snap *nic.Snapshot, vfs int) {
	floor := floorOps(b, root, snap, vfs, false)
	floorList := floorOps(b, root, snap, vfs, true)
	ratios := make([]float64, 0, max(b.N, minPairs))
	var scans, floors, listRatios, lists, listFloor []float64
	pair := func() {
		t0 := time.Now()
		if _, err := sc.Scan(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		floor()
		t2 := time.Now()
		b.StopTimer()
		floorList()
		b.StartTimer()
		scan, fl, list := t1.Sub(t0), t2.Sub(t1), time.Since(t2)
		ratios = append(ratios, float64(scan)/float64(fl))
		listRatios = append(listRatios, float64(scan)/float64(list))
		listFloor = append(listFloor, float64(list)/float64(fl))
		scans, floors = append(scans, float64(scan.Microseconds())/1e3), append(floors, float64(fl.Microseconds())/1e3)
		lists = append(lists, float64(list.Microseconds())/1e3)
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
	}{{ratios, "x-floor"}, {scans, "ms"}, {floors, "floor-ms"}, {listRatios, "x-floorlist"}, {lists, "floorlist-ms"}, {listFloor, "floorlist-vs-floor"}} {
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

// floorOps prepares the floor's system calls for every VF of snap, after
// the listings if list, and returns a function that makes them once, from
// one thread per CPU.
func floorOps(b *testing.B, root string, snap *nic.Snapshot, vfs int, list bool) func() {
	vfList, err := fromnic.VFs(snap)
	require.NoError(b, err)
	require.Len(b, vfList, vfs)
	pass, err := floor.Open(root)
	require.NoError(b, err)
	b.Cleanup(pass.Close)
	ops := floor.Ops(vfList)
	threads := runtime.GOMAXPROCS(0)
	return func() {
		// The listings first, as test/regfloor -list makes them.
		if list {
			if err := pass.Run(floor.Listings(), threads); err != nil {
				b.Fatal(err)
			}
		}
		if err := pass.Run(ops, threads); err != nil {
			b.Fatal(err)
		}
	}
}
