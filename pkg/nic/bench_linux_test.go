package nic_test

import (
	"fmt"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// discoverHosts are the generated scale hosts: PFs x VFs per PF.
var discoverHosts = []struct{ pfs, vfs int }{{8, 16}, {8, 128}, {32, 128}}

// BenchmarkDiscover scans generated hosts of 128, 1024 and 4096 VFs. Each
// VF has a netdev, an RDMA device and uverbs/umad/issm char devices.
//
// The floor sub-benchmark is not fastpath code: on the same host it makes
// only the system calls no faithful scan can do without, per VF, from as
// many threads as there are CPUs, with nothing parsed or kept: read
// uevent, readlink physfn and the PF's virtfnN, readlink its four class
// entries (net, infiniband, infiniband_verbs, infiniband_mad) and read its
// port's link_layer. It tells what this machine's kernel charges for
// reading a node, so that Scan's figure can be read against it. vs-floor
// alternates the two and reports the median ratio (x-floor).
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
	ratios := make([]float64, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		if _, err := sc.Scan(); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		floor()
		ratios = append(ratios, float64(t1.Sub(t0))/float64(time.Since(t1)))
	}
	slices.Sort(ratios)
	b.ReportMetric(ratios[len(ratios)/2], "x-floor")
}

// floorOps prepares the floor's system calls for every VF of snap and
// returns a function that makes them once, from one thread per CPU.
func floorOps(b *testing.B, root string, snap *nic.Snapshot, vfs int) func() {
	sys := filepath.Join(root, "sys")
	open := func(p string) int {
		fd, err := unix.Open(filepath.Join(sys, p), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		require.NoError(b, err)
		b.Cleanup(func() { unix.Close(fd) })
		return fd
	}
	bus, net, ib, verbs, mad := open("bus/pci/devices"), open("class/net"), open("class/infiniband"),
		open("class/infiniband_verbs"), open("class/infiniband_mad")
	type op struct {
		dir  int
		name string
		read bool // open, read and close; else readlink
	}
	var ops [][]op // per VF
	for _, d := range snap.Devices {
		if !d.IsVF() {
			continue
		}
		var umad, uverbs string
		for _, c := range d.CharDevices {
			switch c.Kind {
			case rdma.KindUmad:
				umad = c.Name
			case rdma.KindUverbs:
				uverbs = c.Name
			}
		}
		require.True(b, d.Netdev != "" && d.RDMADevice != "" && umad != "" && uverbs != "", "VF %s is missing a piece", d.PCIAddress)
		ops = append(ops, []op{
			{bus, d.PCIAddress + "/uevent", true},
			{bus, d.PCIAddress + "/physfn", false},
			{bus, fmt.Sprintf("%s/virtfn%d", d.PFAddress, d.VFIndex), false},
			{net, d.Netdev, false}, {ib, d.RDMADevice, false}, {verbs, uverbs, false}, {mad, umad, false},
			{bus, d.PCIAddress + "/infiniband/" + d.RDMADevice + "/ports/1/link_layer", true},
		})
	}
	require.Len(b, ops, vfs)
	threads := runtime.GOMAXPROCS(0)
	return func() {
		var wg sync.WaitGroup
		chunk := (len(ops) + threads - 1) / threads
		for lo := 0; lo < len(ops); lo += chunk {
			part := ops[lo:min(lo+chunk, len(ops))]
			wg.Go(func() {
				buf := make([]byte, 512)
				for _, vf := range part {
					for _, o := range vf {
						if !o.read {
							if _, err := unix.Readlinkat(o.dir, o.name, buf); err != nil {
								b.Error(err)
							}
							continue
						}
						fd, err := unix.Openat(o.dir, o.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
						if err != nil {
							b.Error(err)
							continue
						}
						unix.Read(fd, buf)
						unix.Close(fd)
					}
				}
			})
		}
		wg.Wait()
	}
}
