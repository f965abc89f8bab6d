package provisiontest_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

// hooks records what the stand-in reports through Host's hooks.
type hooks struct {
	acted   chan string // what the stand-in did, in order
	mu      sync.Mutex  // guards the fields below
	probed  []string
	removed []string
}

// await waits (bounded) for the stand-in to have done want next.
func (k *hooks) await(t *testing.T, want string) {
	t.Helper()
	select {
	case got := <-k.acted:
		require.Equal(t, want, got)
	case <-time.After(5 * time.Second):
		t.Fatalf("the stand-in did not %s within 5s", want)
	}
}

func (k *hooks) list(l *[]string) []string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return append([]string(nil), *l...)
}

// standin runs a stand-in over a copy of the DGX host without VFs.
func standin(t *testing.T) (string, *hooks) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, fixture.Write(root, "dgx-h100-novfs"))
	k := &hooks{acted: make(chan string, 1024)}
	h := &provisiontest.Host{Root: root, MLNXOFED: true,
		Probed: func(vf, netdev string) error {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.probed = append(k.probed, vf+" "+netdev)
			return nil
		},
		Removed: func(netdevs []string) {
			k.mu.Lock()
			defer k.mu.Unlock()
			k.removed = append(k.removed, netdevs...)
		}}
	s, err := provisiontest.NewStandin(h, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	s.Acted = func(what string) { k.acted <- what }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return root, k
}

func write(t *testing.T, path, v string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	require.NoError(t, err)
	_, err = f.WriteString(v)
	require.NoError(t, err)
	require.NoError(t, f.Close())
}

func read(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	require.Eventually(t, cond, 5*time.Second, 5*time.Millisecond, what)
}

// Each write a provisioning makes changes the tree as the kernel would.
func TestStandinReactsToWrites(t *testing.T) {
	root, k := standin(t)
	const pf = "0000:18:00.0"
	dev := func(addr string, attr ...string) string {
		return filepath.Join(append([]string{root, "sys/bus/pci/devices", addr}, attr...)...)
	}
	vfs := func() int {
		l, _ := filepath.Glob(dev(pf, "virtfn*"))
		return len(l)
	}
	driver := func(addr string) string {
		l, err := os.Readlink(dev(addr, "driver"))
		if err != nil {
			return ""
		}
		return filepath.Base(l)
	}
	vf1, vf2 := "0000:18:00.2", "0000:18:00.3"

	// Autoprobe on: the VFs come bound to the PF's driver, and probed.
	write(t, dev(pf, "sriov_numvfs"), "2")
	k.await(t, "sriov_numvfs "+pf+" 2")
	require.Equal(t, 2, vfs())
	require.Equal(t, "mlx5_core", driver(vf1))
	require.DirExists(t, dev(vf1, "net/ibp24s0v1"))
	require.Equal(t, []string{"0000:18:00.1 ibp24s0v0", vf1 + " ibp24s0v1"}, k.list(&k.probed))
	write(t, dev(pf, "sriov_numvfs"), "0")
	k.await(t, "sriov_numvfs "+pf+" 0")
	require.Equal(t, 0, vfs())
	require.Equal(t, []string{"ibp24s0v0", "ibp24s0v1"}, k.list(&k.removed))
	require.NoFileExists(t, filepath.Join(root, "sys/class/net/ibp24s0v1"))
	k.mu.Lock()
	k.probed, k.removed = nil, nil
	k.mu.Unlock()

	// Autoprobe off, as provisioning has it.
	write(t, dev(pf, "sriov_drivers_autoprobe"), "0")
	write(t, dev(pf, "sriov_numvfs"), "4")
	k.await(t, "sriov_numvfs "+pf+" 4")
	require.Equal(t, 4, vfs())
	require.Equal(t, "", driver(vf1), "autoprobe off: unbound")
	require.Equal(t, "(null)", read(dev(vf1, "driver_override")))
	require.Equal(t, "00:00:00:00:00:00:00:00", read(dev(pf, "sriov/3/node")), "MLNX_OFED's GUID files")

	// N -> M is refused, and the count stays.
	write(t, dev(pf, "sriov_numvfs"), "2")
	k.await(t, "sriov_numvfs "+pf+" 2 refused")
	require.Equal(t, "4", read(dev(pf, "sriov_numvfs")))
	require.Equal(t, 4, vfs())

	guid := "02:11:22:33:44:55:66:77"
	write(t, dev(pf, "sriov/1/node"), guid)
	// Autoprobe off and no driver_override: the PCI core probes nothing
	// (pci_device_can_probe), and the write succeeds.
	write(t, dev(vf1, "driver_override"), "\n")
	write(t, filepath.Join(root, "sys/bus/pci/drivers_probe"), vf1)
	k.await(t, "drivers_probe "+vf1+" (none)")
	require.Equal(t, "", driver(vf1))
	// Autoprobe on: the driver its IDs match (15b3:101e, mlx5_core).
	write(t, dev(pf, "sriov_drivers_autoprobe"), "1")
	write(t, filepath.Join(root, "sys/bus/pci/drivers_probe"), vf1)
	k.await(t, "drivers_probe "+vf1+" mlx5_core")
	require.Equal(t, "mlx5_core", driver(vf1))
	require.DirExists(t, dev(vf1, "net/ibp24s0v1"))
	ib, err := os.ReadDir(dev(vf1, "infiniband"))
	require.NoError(t, err)
	require.Len(t, ib, 1)
	require.Equal(t, "0211:2233:4455:6677", read(filepath.Join(root, "sys/class/infiniband", ib[0].Name(), "node_guid")))
	require.Equal(t, []string{vf1 + " ibp24s0v1"}, k.list(&k.probed))

	write(t, dev(vf2, "driver_override"), "vfio-pci")
	write(t, filepath.Join(root, "sys/bus/pci/drivers_probe"), vf2)
	k.await(t, "drivers_probe "+vf2+" vfio-pci")
	require.Equal(t, "vfio-pci", driver(vf2))
	require.NoDirExists(t, dev(vf2, "net"))

	write(t, filepath.Join(root, "sys/bus/pci/drivers/mlx5_core/unbind"), vf1)
	k.await(t, "unbind "+vf1)
	require.Equal(t, "", driver(vf1))
	require.NoFileExists(t, filepath.Join(root, "sys/class/net/ibp24s0v1"))
	require.Equal(t, []string{"ibp24s0v1"}, k.list(&k.removed))

	write(t, filepath.Join(root, "sys/bus/pci/drivers_probe"), vf1)
	k.await(t, "drivers_probe "+vf1+" mlx5_core")
	write(t, dev(pf, "sriov_numvfs"), "0")
	k.await(t, "sriov_numvfs "+pf+" 0")
	require.Equal(t, 0, vfs())
	require.NoDirExists(t, dev(pf, "sriov"))
	require.NoFileExists(t, dev(vf1))
	require.Equal(t, []string{"ibp24s0v1", "ibp24s0v1"}, k.list(&k.removed))
}

// The real SysfsKernel, without netlink, applies the seed's policy
// through the stand-in: every rail gets 8 VFs with a netdev, an RDMA
// device and its derived GUID (through MLNX_OFED's files), and applying
// again changes nothing.
func TestStandinUnderTheSysfsKernel(t *testing.T) {
	root, k := standin(t)
	ps, err := provision.Load(filepath.Join("..", "..", "..", "testdata", "policy", "seed.yaml"))
	require.NoError(t, err)
	plan := func() *provision.Plan {
		snap, err := nic.NewScanner(root).Scan()
		require.NoError(t, err)
		return provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap})
	}
	a := &provision.Applier{Kernel: provision.NewSysfsKernel(root, nil), Root: root, Timeout: 10 * time.Second, Poll: time.Millisecond}
	first := plan()
	res, err := a.Apply(context.Background(), first)
	require.NoError(t, err)
	require.Len(t, res.Changed, 8)
	require.Len(t, k.list(&k.probed), 64)

	// The Applier's wait ends when the last VF's RDMA device shows; the
	// stand-in may still be writing its files.
	var last string
	for last != "drivers_probe 0000:dc:01.0 mlx5_core" {
		select {
		case last = <-k.acted:
		case <-time.After(5 * time.Second):
			t.Fatal("the stand-in did not probe the last VF within 5s")
		}
	}
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	n := 0
	for _, pf := range first.PFs {
		pfDev, _ := snap.Device(pf.Address)
		pfGUID, err := net.ParseMAC(colons(read(filepath.Join(root, "sys/class/infiniband", pfDev.RDMADevice, "node_guid"))))
		require.NoError(t, err)
		for _, d := range snap.Devices {
			if d.PFAddress != pf.Address {
				continue
			}
			n++
			require.Equal(t, "mlx5_core", d.Driver, d.PCIAddress)
			require.NotEmpty(t, d.Netdev, d.PCIAddress)
			require.NotEmpty(t, d.RDMADevice, d.PCIAddress)
			got := colons(read(filepath.Join(root, "sys/class/infiniband", d.RDMADevice, "node_guid")))
			require.Equal(t, provision.DeriveGUID(pfGUID, d.VFIndex).String(), got, d.PCIAddress)
		}
	}
	require.Equal(t, 64, n)
	require.Zero(t, plan().Changes(), "applied twice changes nothing")
}

// colons turns a sysfs GUID (b83f:d203:…) into net's form.
func colons(s string) string {
	h := strings.ReplaceAll(s, ":", "")
	var parts []string
	for i := 0; i+2 <= len(h); i += 2 {
		parts = append(parts, h[i:i+2])
	}
	return strings.Join(parts, ":")
}
