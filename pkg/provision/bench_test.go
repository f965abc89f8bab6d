package provision_test

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

// timedKernel adds up the time spent in the kernel's calls, so that what
// provisioning adds to the kernel's own work can be told apart.
type timedKernel struct {
	k  provision.Kernel
	in time.Duration
}

func (t *timedKernel) time(f func() error) error {
	start := time.Now()
	err := f()
	t.in += time.Since(start)
	return err
}

func (t *timedKernel) SetNumVFs(pf string, n int) error {
	return t.time(func() error { return t.k.SetNumVFs(pf, n) })
}

func (t *timedKernel) SetAutoprobe(pf string, on bool) error {
	return t.time(func() error { return t.k.SetAutoprobe(pf, on) })
}

func (t *timedKernel) SetVFGUID(pf, netdev string, vf int, g net.HardwareAddr) error {
	return t.time(func() error { return t.k.SetVFGUID(pf, netdev, vf, g) })
}
func (t *timedKernel) Unbind(addr string) error {
	return t.time(func() error { return t.k.Unbind(addr) })
}
func (t *timedKernel) Bind(addr, drv string) error {
	return t.time(func() error { return t.k.Bind(addr, drv) })
}

func (t *timedKernel) SetMTU(netdev string, mtu int) error {
	return t.time(func() error { return t.k.SetMTU(netdev, mtu) })
}

func eightBySixteen() string {
	var names []string
	for i := 0; i < 8; i++ {
		names = append(names, fmt.Sprintf("ibp%ds0", 0x10+i))
	}
	return fmt.Sprintf(`
metadata: {name: rails}
spec: {resourceName: rdma_vfs, numVfs: 16, isRdma: true, nicSelector: {vendor: "15b3", pfNames: [%s]}}
`, strings.Join(names, ", "))
}

// BenchmarkApply is provisioning 8 PFs x 16 VFs from none through the
// fake kernel with no probe delay: plan, write-ahead records, steps and
// waits. kernel-ms is the time inside the fake kernel's calls (its sysfs
// layout work, the stand-in for the kernel's own time); overhead-ms is
// the rest, what provisioning itself costs.
func BenchmarkApply(b *testing.B) {
	root := emptyHost(b, 8, 16)
	ps := policies(b, eightBySixteen())
	state := b.TempDir()
	fake := provisiontest.New(root)
	var total, inKernel time.Duration
	for i := 0; i < b.N; i++ {
		tk := &timedKernel{k: fake}
		start := time.Now()
		plan := provision.NewPlan(ps, node(b, root))
		res, err := (&provision.Applier{Kernel: tk, Root: root, StateDir: state, Poll: time.Millisecond}).Apply(context.Background(), plan)
		total += time.Since(start)
		inKernel += tk.in
		require.NoError(b, err)
		require.Len(b, res.Changed, 8)
		b.StopTimer()
		for j := 0; j < 8; j++ {
			require.NoError(b, fake.SetNumVFs(fmt.Sprintf("0000:%02x:00.0", 0x10+j), 0))
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(total.Microseconds())/1e3/float64(b.N), "total-ms")
	b.ReportMetric(float64(inKernel.Microseconds())/1e3/float64(b.N), "kernel-ms")
	b.ReportMetric(float64((total-inKernel).Microseconds())/1e3/float64(b.N), "overhead-ms")
}

// BenchmarkPlanMatching is the re-apply at start on a node whose 8 PFs x
// 16 VFs already match: a scan and a plan of no steps, reads only.
func BenchmarkPlanMatching(b *testing.B) {
	root := emptyHost(b, 8, 16)
	ps := policies(b, eightBySixteen())
	_, err := (&provision.Applier{Kernel: provisiontest.New(root), Root: root}).Apply(context.Background(), provision.NewPlan(ps, node(b, root)))
	require.NoError(b, err)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		plan := provision.NewPlan(ps, node(b, root))
		if plan.Changes() != 0 {
			b.Fatalf("%d changes on a matching node", plan.Changes())
		}
	}
}
