package dra_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture/genhost"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/latency"
)

// The benchmarks run the driver on a generated host of 16 PFs with 64 VFs
// each (1024 VFs with netdev, RDMA device and char devices), all in the
// DRA pool of testdata/config/dra.json: 16 ResourceSlices of 64 devices.
// The API server is client-go's simple fake clientset (in memory, no field
// management), the kubelet side is real gRPC on the plugin's unix sockets.
var benchHost = genhost.Host{PFs: 16, VFsPerPF: 64}

func largeHost(b *testing.B) string { return benchHost.Root(b) }

func TestMain(m *testing.M) {
	code := m.Run()
	benchHost.Remove()
	os.Exit(code)
}

// sliceWatch follows the fake API server's ResourceSlices.
type sliceWatch struct{ w watch.Interface }

func newSliceWatch(b *testing.B, e *testEnv) *sliceWatch {
	w, err := e.client.ResourceV1().ResourceSlices().Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(w.Stop)
	return &sliceWatch{w: w}
}

// until waits (up to 60 s) for a slice event that satisfies ok.
func (s *sliceWatch) until(b *testing.B, what string, ok func(*resourceapi.ResourceSlice) bool) {
	b.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case ev := <-s.w.ResultChan():
			if sl, isSlice := ev.Object.(*resourceapi.ResourceSlice); isSlice && ok(sl) {
				return
			}
		case <-timeout:
			b.Fatalf("no ResourceSlice event with %s within 60 s", what)
		}
	}
}

func taintedIn(s *resourceapi.ResourceSlice) int {
	n := 0
	for _, d := range s.Spec.Devices {
		if len(d.Taints) > 0 {
			n++
		}
	}
	return n
}

// BenchmarkPublishResources is the time from a health change to the
// ResourceSlices in the API server showing it: a PF's link goes down (or
// back up) — the driver recomputes the 1024 devices, hands them to the
// ResourceSlice controller, which updates the slice holding the PF's 64
// VFs (the pool is "spread", so they are one per 16 devices across the
// slices: every slice changes). One sample per event; ns/op is the mean.
// "initial" is one cold start: the driver started until all 16 slices
// exist (ns/op only).
func BenchmarkPublishResources(b *testing.B) {
	host := largeHost(b)
	b.Run("vfs=1024/initial", func(b *testing.B) {
		b.StopTimer()
		for i := 0; i < b.N; i++ {
			e := newTestEnv(b, host, "dra.json") // scans the host: untimed
			e.simpleAPI()
			w := newSliceWatch(b, e)
			b.StartTimer()
			d := e.start(b)
			seen := map[string]int{}
			total := 0
			w.until(b, "all 1024 devices", func(s *resourceapi.ResourceSlice) bool {
				total += len(s.Spec.Devices) - seen[s.Name]
				seen[s.Name] = len(s.Spec.Devices)
				return total == benchHost.VFs()
			})
			b.StopTimer()
			d.Stop()
		}
	})
	b.Run("vfs=1024/link-event", func(b *testing.B) {
		e := newTestEnv(b, host, "dra.json")
		e.simpleAPI()
		w := newSliceWatch(b, e)
		e.start(b)
		w.until(b, "the last slice", func(s *resourceapi.ResourceSlice) bool { return s.Spec.Pool.ResourceSliceCount == int64(benchHost.PFs) })
		e.waitSlices(b, "1024 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == benchHost.VFs() })
		up := true
		b.ReportAllocs()
		latency.Measure(b, func() time.Duration {
			up = !up
			start := time.Now()
			e.links.C <- plugin.LinkEvent{Name: "ibp16s0", Up: up} // PF 0 of the generated host
			// PF 0's 64 VFs are 4 in each of the 16 slices ("spread").
			want := map[bool]int{true: 0, false: benchHost.VFsPerPF / benchHost.PFs}[up]
			done := map[string]bool{}
			w.until(b, fmt.Sprintf("PF 0 up=%v in every slice", up), func(s *resourceapi.ResourceSlice) bool {
				if taintedIn(s) == want {
					done[s.Name] = true
				}
				return len(done) == benchHost.PFs
			})
			return time.Since(start)
		})
	})
}

// BenchmarkPrepare is the kubelet's NodePrepareResources round trip for a
// claim with one VF (and with eight, one per PF) on the 1024-VF host: the
// helper reads the claim from the API server, the driver checks the VF is
// free, journals the claim in its checkpoint, writes the claim's CDI spec
// (validated by the CDI library) and a device-info file per VF. The claim
// is unprepared between samples, untimed. "unprepare" times the other half.
func BenchmarkPrepare(b *testing.B) {
	host := largeHost(b)
	for _, n := range []int{1, 8} {
		var results []result
		for pf := 0; pf < n; pf++ {
			results = append(results, vf("nic", fixture.VFAddress(0x10+pf, 0)))
		}
		setup := func(b *testing.B) (*kubelet, *resourceapi.ResourceClaim) {
			e := newTestEnv(b, host, "dra.json")
			e.simpleAPI()
			e.start(b)
			k := e.register(b)
			c := e.claim(b, fmt.Sprintf("bench-%d", n), results...)
			return k, c
		}
		b.Run(fmt.Sprintf("vfs=1024/claim-vfs=%d", n), func(b *testing.B) {
			k, c := setup(b)
			b.ReportAllocs()
			latency.Measure(b, func() time.Duration {
				start := time.Now()
				r := k.prepare(b, c)[string(c.UID)]
				d := time.Since(start)
				if r.Error != "" || len(r.Devices) != n {
					b.Fatalf("prepare: %q, %d devices", r.Error, len(r.Devices))
				}
				k.unprepare(b, c)
				return d
			})
		})
		b.Run(fmt.Sprintf("vfs=1024/claim-vfs=%d/unprepare", n), func(b *testing.B) {
			k, c := setup(b)
			b.ReportAllocs()
			latency.Measure(b, func() time.Duration {
				if r := k.prepare(b, c)[string(c.UID)]; r.Error != "" {
					b.Fatal(r.Error)
				}
				start := time.Now()
				r := k.unprepare(b, c)[string(c.UID)]
				d := time.Since(start)
				if r.Error != "" {
					b.Fatal(r.Error)
				}
				return d
			})
		})
	}
}
