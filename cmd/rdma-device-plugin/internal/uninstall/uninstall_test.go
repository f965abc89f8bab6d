package uninstall_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/installcni"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/uninstall"
	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

const rail0, rail1 = "0000:18:00.0", "0000:40:00.0" // the DGX fixture's ibp24s0, ibp64s0

// upstream stands for upstream sriov-cni: not a Go binary of fastpath's.
var upstream = []byte("#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\"}'\n")

var vfPool = pool.Resource{Prefix: "mellanox.com", Name: "mlnx_sriov_rdma"}

// node is a DGX node as fastpath's DaemonSet leaves it: the seed's policy
// made 8 VFs on each rail that had 4 (through the kernel stand-in, which
// lays VFs out as the kernel would), the sriov CNI replaced upstream's,
// the device plugin wrote device-info files and a CDI spec, and the CNI
// its leftovers beside upstream's cache file.
type node struct {
	root                               string
	kernel                             *provisiontest.Kernel
	bin, devinfo, cdi, state, cniState string
}

func newNode(t *testing.T) *node {
	t.Helper()
	n := &node{root: t.TempDir()}
	require.NoError(t, fx.Write(n.root, "dgx-h100"))
	n.kernel = provisiontest.New(n.root)
	n.bin, n.devinfo, n.cdi = filepath.Join(n.root, "opt/cni/bin"), filepath.Join(n.root, "devinfo"), filepath.Join(n.root, "cdi")
	n.state, n.cniState = filepath.Join(n.root, "var/lib/fastpath/provision"), filepath.Join(n.root, "var/lib/cni/sriov")
	for _, d := range []string{n.bin, n.devinfo, n.cdi, n.cniState} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}

	ps, err := provision.Load(filepath.Join("..", "..", "..", "..", "testdata", "policy", "seed.yaml"))
	require.NoError(t, err)
	snap, err := nic.NewScanner(n.root).Scan()
	require.NoError(t, err)
	a := &provision.Applier{Kernel: n.kernel, Root: n.root, StateDir: n.state, Timeout: 5 * time.Second, Poll: time.Millisecond}
	_, err = a.Apply(context.Background(), provision.NewPlan(ps, provision.Node{Root: n.root, Snapshot: snap}))
	require.NoError(t, err)
	n.kernel.Wait()
	require.Equal(t, 8, n.numVFs(t, rail0))

	require.NoError(t, os.WriteFile(filepath.Join(n.bin, "sriov"), upstream, 0o755))
	self, err := os.Executable() // a Go binary of fastpath's module, as its CNI is
	require.NoError(t, err)
	_, err = installcni.Install(context.Background(), self, n.bin, slog.New(slog.DiscardHandler))
	require.NoError(t, err)

	for _, f := range []string{
		plugin.DevInfoPath(n.devinfo, vfPool.Prefix, vfPool.Name, "0000:18:00.2"),
		filepath.Join(n.devinfo, "intel.com-intel_sriov-0000:3b:02.0-device.json"), // another device plugin's
		filepath.Join(n.cdi, "fastpath-mellanox.com_mlnx_sriov_rdma.json"),
		filepath.Join(n.cdi, "nvidia.yaml"), // another vendor's
		filepath.Join(n.cniState, "0000:18:00.2.lock"),
		filepath.Join(n.cniState, "deleted-0123456789abcdef01234567.json"),
		filepath.Join(n.cniState, "3f2a9c-net1"), // upstream sriov-cni's cache
	} {
		require.NoError(t, os.WriteFile(f, []byte("{}"), 0o600))
	}
	return n
}

func (n *node) numVFs(t *testing.T, pf string) int {
	t.Helper()
	links, err := filepath.Glob(filepath.Join(n.root, "sys/bus/pci/devices", pf, "virtfn*"))
	require.NoError(t, err)
	return len(links)
}

func (n *node) config() uninstall.Config {
	return uninstall.Config{HostRoot: n.root, CNIBinDir: n.bin, DevInfoDir: n.devinfo, Pools: []pool.Resource{vfPool}, CDIDir: n.cdi,
		StateDir: n.state, CNIStateDir: n.cniState, Timeout: 5 * time.Second, Kernel: n.kernel}
}

func exists(path string) bool { _, err := os.Lstat(path); return err == nil }

func TestUninstall(t *testing.T) {
	n := newNode(t)
	r, err := uninstall.Run(context.Background(), n.config())
	require.NoError(t, err)
	n.kernel.Wait()
	require.True(t, r.Done(), "%q", r.Lines())

	// Every rail is back to the 4 VFs it had, its new VFs probed.
	require.Len(t, r.PFs, 8)
	for _, pf := range r.PFs {
		require.True(t, pf.Back, pf.Address)
		require.Equal(t, [2]int{8, 4}, [2]int{pf.From, pf.Found}, pf.Address)
		require.Equal(t, 4, n.numVFs(t, pf.Address), pf.Address)
	}
	snap, err := nic.NewScanner(n.root).Scan()
	require.NoError(t, err)
	vf, ok := snap.Device("0000:18:00.4")
	require.True(t, ok)
	require.NotEmpty(t, vf.Netdev, "a VF made again is bound and has its netdev")
	require.Contains(t, r.Lines(), "PF 0000:18:00.0 (ibp24s0): VFs 8 -> 4, as before fastpath")

	got, err := os.ReadFile(filepath.Join(n.bin, "sriov"))
	require.NoError(t, err)
	require.Equal(t, upstream, got, "upstream's binary, byte for byte")
	require.False(t, exists(filepath.Join(n.bin, installcni.BackupName)))
	require.Equal(t, "upstream", r.CNI)

	require.False(t, exists(plugin.DevInfoPath(n.devinfo, vfPool.Prefix, vfPool.Name, "0000:18:00.2")))
	require.True(t, exists(filepath.Join(n.devinfo, "intel.com-intel_sriov-0000:3b:02.0-device.json")), "another plugin's file stays")
	require.False(t, exists(filepath.Join(n.cdi, "fastpath-mellanox.com_mlnx_sriov_rdma.json")))
	require.True(t, exists(filepath.Join(n.cdi, "nvidia.yaml")))
	ents, err := os.ReadDir(n.cniState)
	require.NoError(t, err)
	require.Len(t, ents, 1, "upstream sriov-cni's cache stays, fastpath's leftovers go")
	require.Equal(t, "3f2a9c-net1", ents[0].Name())
	require.False(t, exists(n.state), "provisioning's state directory is gone")
	require.False(t, exists(filepath.Dir(n.state)), "nor /var/lib/fastpath, which held only it")
	require.True(t, exists(filepath.Join(n.root, "var/lib/cni")), "the CNI's parent directory is not fastpath's")

	// Twice: nothing left to do, and done.
	r, err = uninstall.Run(context.Background(), n.config())
	require.NoError(t, err)
	require.True(t, r.Done())
	require.Empty(t, r.PFs)
	require.Equal(t, "left", r.CNI, "upstream's binary is not fastpath's: left")
}

// A VF a pod still holds keeps its PF as it is, and the CNI binary, the
// files and the state the pod's DEL needs; the other PFs go back. Once
// the pod is gone, a second run finishes.
func TestUninstallLeavesWhatPodsHold(t *testing.T) {
	n := newNode(t)
	attachment := filepath.Join(n.cniState, "0000:18:00.3.json")
	require.NoError(t, os.WriteFile(attachment, []byte(`{"network":"default/sriov-rdma","containerID":"0123456789abcdef"}`), 0o600))
	r, err := uninstall.Run(context.Background(), n.config())
	require.ErrorIs(t, err, uninstall.ErrHeld)
	require.ErrorContains(t, err, "CNI attachment of container 0123456789ab")
	n.kernel.Wait()
	require.False(t, r.Done())
	for _, pf := range r.PFs {
		if pf.Address == rail0 {
			require.False(t, pf.Back)
			require.Contains(t, pf.Left, "0000:18:00.3")
			require.Equal(t, 8, n.numVFs(t, rail0), "the held PF keeps its VFs")
			continue
		}
		require.True(t, pf.Back, pf.Address)
		require.Equal(t, 4, n.numVFs(t, pf.Address))
	}
	require.Equal(t, 4, n.numVFs(t, rail1))
	require.Contains(t, r.Lines()[len(r.Lines())-1], "not done: delete the pods named above")
	require.Empty(t, r.CNI, "the CNI binary is not touched while a pod is attached")
	self, err := os.Executable()
	require.NoError(t, err)
	want, err := os.ReadFile(self)
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(n.bin, "sriov"))
	require.NoError(t, err)
	require.Equal(t, want, got, "fastpath's CNI stays for the pod's DEL")
	require.True(t, exists(plugin.DevInfoPath(n.devinfo, vfPool.Prefix, vfPool.Name, "0000:18:00.2")))
	require.True(t, exists(n.state))

	require.NoError(t, os.Remove(attachment))
	r, err = uninstall.Run(context.Background(), n.config())
	require.NoError(t, err)
	n.kernel.Wait()
	require.True(t, r.Done(), "%q", r.Lines())
	require.Len(t, r.PFs, 1, "only the PF left the first time")
	require.Equal(t, 4, n.numVFs(t, rail0))
	require.Equal(t, "upstream", r.CNI)
	require.False(t, exists(n.state))
}

// A pod that holds a VF of a PF fastpath did not change (the VFs were
// there) still keeps the CNI binary: the attachment is the CNI's.
func TestUninstallWithoutProvisioning(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fx.Write(root, "dgx-h100"))
	bin, state := filepath.Join(root, "bin"), filepath.Join(root, "state")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	self, err := os.Executable()
	require.NoError(t, err)
	_, err = installcni.Install(context.Background(), self, bin, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	c := uninstall.Config{HostRoot: root, CNIBinDir: bin, StateDir: filepath.Join(root, "none"), CNIStateDir: state}
	require.NoError(t, os.MkdirAll(state, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(state, "0000:18:00.2.json"), []byte(`{}`), 0o600))
	r, err := uninstall.Run(context.Background(), c)
	require.ErrorIs(t, err, uninstall.ErrHeld)
	require.Empty(t, r.PFs, "fastpath changed no PF")
	require.True(t, exists(filepath.Join(bin, "sriov")))

	require.NoError(t, os.Remove(filepath.Join(state, "0000:18:00.2.json")))
	r, err = uninstall.Run(context.Background(), c)
	require.NoError(t, err)
	require.True(t, r.Done())
	require.Equal(t, "removed", r.CNI, "no upstream binary was kept: fastpath's is removed")
	require.False(t, exists(filepath.Join(bin, "sriov")))
	require.Contains(t, r.Lines(), "sriov CNI: fastpath's removed; there was none before it, so none is left: install upstream sriov-cni if a NetworkAttachmentDefinition still names type sriov")
	require.False(t, exists(state), "the CNI's state directory, empty, is removed")
}
