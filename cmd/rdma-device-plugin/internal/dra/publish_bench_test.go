package dra_test

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/latency"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// BenchmarkLinkEvent is BenchmarkPublishResources'
// link-event case for both allocation policies, with the ResourceSlice
// updates each event costs ("slice-updates/op", counted at the fake API
// server). A "pack" pool keeps a PF's 64 VFs in one slice, so PF 0 going
// down or up changes that slice alone and the ResourceSlice controller
// updates it alone; a "spread" pool has 4 of PF 0's VFs in each of the 16
// slices (one VF per rail first in every slice), so every event is 16
// updates and, as more than one slice changes, a new pool generation.
func BenchmarkLinkEvent(b *testing.B) {
	host := largeHost(b)
	for _, policy := range []string{pool.PolicyPack, pool.PolicySpread} {
		b.Run(policy, func(b *testing.B) {
			e := newTestEnv(b, host, "dra.json")
			e.simpleAPI()
			for i := range e.scan.Pools {
				e.scan.Pools[i].AllocationPolicy = policy
			}
			var updates atomic.Int64
			e.client.PrependReactor("update", "resourceslices", func(k8stesting.Action) (bool, runtime.Object, error) {
				updates.Add(1)
				return false, nil, nil
			})
			w := newSliceWatch(b, e)
			e.start(b)
			w.until(b, "the last slice", func(s *resourceapi.ResourceSlice) bool { return s.Spec.Pool.ResourceSliceCount == int64(benchHost.PFs) })
			e.waitSlices(b, "1024 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == benchHost.VFs() })
			tainted := map[string]int{} // slice → tainted devices, as the watch last showed it
			up := true
			var events int64
			first := updates.Load()
			b.ReportAllocs()
			latency.Measure(b, func() time.Duration {
				up = !up
				want := map[bool]int{true: 0, false: benchHost.VFsPerPF}[up]
				start := time.Now()
				e.links.C <- plugin.LinkEvent{Name: "ibp16s0", Up: up} // PF 0 of the generated host
				w.until(b, fmt.Sprintf("%d VFs tainted", want), func(s *resourceapi.ResourceSlice) bool {
					tainted[s.Name] = taintedIn(s)
					total := 0
					for _, t := range tainted {
						total += t
					}
					return total == want
				})
				d := time.Since(start)
				events++
				return d
			})
			b.ReportMetric(float64(updates.Load()-first)/float64(events), "slice-updates/op")
		})
	}
}
