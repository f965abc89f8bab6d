package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// standInKernel is an RDMA core for a machine that has none: its rxe
// devices are fixture devices in a sysfs of its own, with the GID table
// the test gives each netdev, and, as rxe does, a device goes when its
// netdev leaves the node's netns. The CNI and doctor still ask the real
// kernel over RDMA netlink, and find none.
type standInKernel struct {
	root string
	gids map[string][]fixture.GID // by netdev
	// keep makes the device stay when its netdev leaves, as a ConnectX
	// VF's does.
	keep bool
	// exclusive: a device is listed in the node's netns only (the
	// stand-in never moves one); else in every netns.
	exclusive bool

	mu   sync.Mutex        // guards the fields below
	devs map[string]string // device -> its netdev
	addr map[string]string // device -> the PCI address it hangs on
}

var _ rdmaKernel = (*standInKernel)(nil)

// newStandInKernel is a stand-in RDMA core with the RDMA modules loaded
// and, for each netdev, the GID table its devices get.
func newStandInKernel(t *testing.T, gids map[string][]fixture.GID) *standInKernel {
	t.Helper()
	k := &standInKernel{root: t.TempDir(), gids: gids, devs: map[string]string{}, addr: map[string]string{}}
	b, err := fixture.NewBuilder(k.root)
	require.NoError(t, err)
	require.NoError(t, b.Modules(fixture.RDMAModules("rdma_rxe")...))
	return k
}

// runPhase runs one phase with k and bin as make rdma-check does, cleans
// up after it, and returns the report, its output and the phase's
// scratch directory (gone by then).
func runPhase(t *testing.T, k rdmaKernel, bin, mode string, run func(*phase)) (*report, string, string) {
	t.Helper()
	var out bytes.Buffer
	r := newReport(&out)
	p, err := newPhase(r, k, bin, mode)
	require.NoError(t, err)
	run(p)
	p.cleanup()
	t.Log(out.String())
	return r, out.String(), p.work
}

// phaseBinaries skips a phase test where it cannot run and builds what
// a phase runs: the CNI, host-local and the device plugin (doctor).
func phaseBinaries(t *testing.T) string {
	t.Helper()
	testnet.RequireRoot(t, "veth links and network namespaces")
	if testing.Short() {
		t.Skip("builds the CNI and the device plugin")
	}
	if _, err := netnsMode(); err == nil {
		t.Skip("this kernel has an RDMA core: make rdma-check runs the phase on it")
	}
	return testbin.Build(t, "github.com/fastpath-k8s/fastpath/cmd/sriov-cni=sriov", testbin.HostLocal,
		"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin")
}

func (k *standInKernel) Sys() string { return filepath.Join(k.root, "sys") }

func (k *standInKernel) AddRxe(name, netdev string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	b, err := fixture.NewBuilder(k.root)
	if err != nil {
		return err
	}
	addr := fixture.PCIAddress(0, 1, len(k.addr), 0)
	if err := b.Add(fixture.Function{Address: addr, Vendor: "1af4", Device: "1041", Class: "0x020000", Driver: "virtio-pci",
		IOMMUGroup: -1, Parent: "pci0000:00",
		RDMA: []fixture.RDMADevice{{Name: name, LinkLayer: "Ethernet", Uverbs: -1, Umad: -1, NodeGUID: fixture.GUID(1, len(k.addr)), GIDs: k.gids[netdev]}}}); err != nil {
		return err
	}
	k.devs[name], k.addr[name] = netdev, addr
	return nil
}

func (k *standInKernel) DelRxe(name string) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.devs[name]; !ok {
		return nil
	}
	delete(k.devs, name)
	if err := os.Remove(filepath.Join(k.Sys(), "class", "infiniband", name)); err != nil {
		return err
	}
	return os.RemoveAll(filepath.Join(k.Sys(), "devices", "pci0000:00", k.addr[name], "infiniband", name))
}

func (k *standInKernel) Present(name string, n *netns.NS) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.devs[name]
	return ok && (n == nil || !k.exclusive), nil
}

func (k *standInKernel) Gone(name string, _ time.Duration) (bool, error) {
	k.mu.Lock()
	netdev, ok := k.devs[name]
	k.mu.Unlock()
	if !ok {
		return true, nil
	}
	if _, err := netlink.LinkByName(netdev); err == nil || k.keep {
		return false, nil
	}
	return true, k.DelRxe(name)
}

// TestSharedPhase runs the shared phase as make rdma-check does, with the
// real CNI and doctor, over a stand-in RDMA core: every step but doctor's
// netns mode (which it must read over RDMA netlink, and this machine has
// none) passes. A device that goes with its netdev (rxe) is the limit; one
// that stays must be visible in the pod with the pod's address's GID.
func TestSharedPhase(t *testing.T) {
	bin := phaseBinaries(t)
	common := []string{
		"ok     rdma link add rxefp",
		"ok     GID follows the node's address: [3] 192.168.77.1 RoCE v2 fprcvf0",
		"ok     doctor: ok port [] 1 port ACTIVE and LinkUp",
		"ok     doctor: ok roce-gid [] 1 RoCE netdev: every IPv4 address has its RoCE v2 GID",
		`FAIL   doctor rdma-netns: want ok "shared" from RDMA netlink`,
		"ok     ADD " + vfAddress(0) + " -> net1 in fprc-pod-",
		"ok     CHECK net1",
		"ok     DEL net1",
		"ok     nothing left behind",
	}
	for _, tc := range []struct {
		name   string
		keep   bool
		gids   []fixture.GID
		counts map[string]int
		want   []string
	}{
		{"rxe goes with its netdev", false, roceGIDs("fprcvf0", "192.168.77.1"), map[string]int{outOK: 8, outLimit: 1, outFail: 1},
			[]string{"limit  rxe unregistered rxefp"}},
		{"the device stays", true, append(roceGIDs("fprcvf0", "192.168.77.1"), roceGIDs("net1", "192.168.78.2")[2:]...),
			map[string]int{outOK: 10, outFail: 1},
			[]string{"stayed registered and is visible in the pod's netns", "ok     GID follows the pod's address: [5] 192.168.78.2 RoCE v2 net1"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := newStandInKernel(t, map[string][]fixture.GID{"fprcvf0": tc.gids})
			k.keep = tc.keep
			r, out, work := runPhase(t, k, bin, modeShared, func(p *phase) { p.shared(context.Background()) })
			require.Equal(t, tc.counts, r.counts, out)
			for _, want := range append(common, tc.want...) {
				require.Contains(t, out, want)
			}
			require.Empty(t, k.devs, "the phase deleted what it made")
			_, err := os.Stat(work)
			require.ErrorIs(t, err, os.ErrNotExist, fmt.Sprintf("%s removed", work))
		})
	}
}

// TestExclusivePhase runs the exclusive phase over a stand-in RDMA core
// with the real CNI, which, finding no RDMA netlink here, attaches the
// netdev and leaves the RDMA device on the node: the phase must call that
// a failure, and still check CHECK, DEL and the leftovers.
func TestExclusivePhase(t *testing.T) {
	bin := phaseBinaries(t)
	k := newStandInKernel(t, nil)
	k.exclusive = true
	r, out, _ := runPhase(t, k, bin, modeExclusive, func(p *phase) { p.exclusive(context.Background()) })
	require.Equal(t, map[string]int{outOK: 8, outFail: 2}, r.counts, out)
	for _, want := range []string{
		"listed by RDMA netlink here",
		`FAIL   doctor rdma-netns: want ok "exclusive" from RDMA netlink`,
		"ok     ADD " + vfAddress(0) + " -> net1 in fprc-pod-",
		"FAIL   RDMA device rxefp", "is not in the pod's netns after ADD",
		"ok     CHECK net1", "ok     DEL net1",
		"back in the node's netns",
		"ok     nothing left behind",
	} {
		require.Contains(t, out, want)
	}
	require.Empty(t, k.devs)
}
