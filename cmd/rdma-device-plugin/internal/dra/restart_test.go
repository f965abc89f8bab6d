package dra_test

import (
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
)

// A node reboot: the checkpoint (under /var/lib/kubelet) is kept, the CDI
// and device-info directories (tmpfs) come back empty. The driver, when it
// starts and before the kubelet can call it, writes the files of every
// claim of its checkpoint again, the same as they were — a pod's claims
// still name all of its VFs in their environment — so that a container of
// a running pod that restarts (the kubelet does not prepare its claims
// again) resolves its CDI names; the kubelet's Prepare of the claims
// afterwards answers the same and changes nothing. A claim whose VF the
// scan no longer serves is not restored, and its Prepare says why; the
// other claims are.
func TestRestartRestoresClearedCDIDir(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	k := e.register(t)
	vfs := railVFs(t, e)
	a := e.reserve(t, e.claim(t, "rank-0-rail0", vf("vf", vfs[0].PCIAddress)), "pod-0")
	b := e.reserve(t, e.claim(t, "rank-0-rail1", vf("vf", vfs[1].PCIAddress)), "pod-0")
	c := e.reserve(t, e.claim(t, "lone", vf("vf", vfs[2].PCIAddress)), "pod-1")
	respAB, respC := k.prepare(t, a, b), k.prepare(t, c)
	ids := append(cdiIDs(t, respAB, a, b), cdiIDs(t, respC, c)...)
	metaIDs := append(metadataIDs(respAB[string(a.UID)]), metadataIDs(respC[string(c.UID)])...)
	require.Len(t, metaIDs, 2)
	specs, infos := specFiles(t, e), files(t, e.dev)
	require.Len(t, specs, 6, "a VF spec and a device metadata spec (the helper's) per claim")
	require.Len(t, infos, 3)

	reboot := func() {
		d.Stop()
		require.NoError(t, os.RemoveAll(e.cdiDir))
		require.NoError(t, os.RemoveAll(e.dev))
	}
	reboot()
	d = e.start(t)
	require.Equal(t, specs, specFiles(t, e), "CDI specs restored at start")
	require.Equal(t, infos, files(t, e.dev), "device-info files restored at start")
	got := inject(t, e.runtime(t), ids[:2]...)
	require.Equal(t, vfs[0].PCIAddress+","+vfs[1].PCIAddress, got.env[envPool], "the pod's claims name both of its VFs")
	require.Equal(t, vfs[2].PCIAddress, inject(t, e.runtime(t), ids[2]).env[envPool])
	// The helper's device metadata specs are back too: a container that
	// names them resolves them, and finds its claim's metadata.
	for i, id := range metaIDs {
		claim := []string{"rank-0-rail0", "lone"}[i]
		_, md, _ := mountedMetadata(t, e, id, "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/"+claim+"/vf/rdma.fastpath-k8s.io-metadata.json")
		require.Equal(t, claim, md.Name, id)
	}

	k = e.register(t)
	require.Equal(t, ids[:2], cdiIDs(t, k.prepare(t, a, b), a, b), "the kubelet's Prepare after the restart")
	require.Equal(t, specs, specFiles(t, e))
	require.Equal(t, infos, files(t, e.dev))

	// Rebooted without the first rail's VF (its PF gone): the pod's
	// claims, whose environment names it, cannot be restored; the lone
	// claim is.
	reboot()
	e.scan = withoutVF(e.scan, vfs[0].PCIAddress)
	d = e.start(t)
	require.Equal(t, []string{dra.CDISpecName(c.UID)}, slices.Sorted(maps.Keys(vfSpecFiles(t, e))))
	k = e.register(t)
	resp := k.prepare(t, a)
	require.Contains(t, resp[string(a.UID)].Error, "device "+dra.DeviceName(vfs[0].PCIAddress)+" is not (or no longer) a VF served by DRA")
	require.Equal(t, ids[2:], cdiIDs(t, k.prepare(t, c), c))
}

// withoutVF is a scan without the VF at a PCI address.
func withoutVF(s plugin.Scan, addr string) plugin.Scan {
	out := s
	out.Pools = slices.Clone(s.Pools)
	for i := range out.Pools {
		out.Pools[i].Devices = slices.DeleteFunc(slices.Clone(out.Pools[i].Devices), func(d nicDevice) bool { return d.PCIAddress == addr })
	}
	return out
}

// A checkpoint or device-info write that a kill cut short left its
// temporary file (internal/atomicfile's ".<name>.tmp-*") beside the file:
// the next driver removes those of its checkpoint and of its claims'
// device-info files, and leaves the files and what is not its own.
func TestKilledAtomicWriteLeftoversRemoved(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	k := e.register(t)
	c := e.claim(t, "train", vf("nic", rail0vf0))
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)
	d.Stop()
	info := dra.DevInfoPath(e.dev, "train", rail0vf0)
	left := []string{
		filepath.Join(e.pluginDir, "."+dra.CheckpointFile+".tmp-1234"),
		filepath.Join(e.dev, "."+filepath.Base(info)+".tmp-5678"),
	}
	kept := []string{
		filepath.Join(e.dev, ".mellanox.com_mlnx_sriov_rdma-"+rail1vf0+"-device.json.tmp-9"), // the device plugin's
		filepath.Join(e.pluginDir, "dra.sock.tmp-1"),
	}
	for _, p := range append(slices.Clone(left), kept...) {
		require.NoError(t, os.WriteFile(p, []byte("{"), 0o600))
	}
	e.start(t)
	for _, p := range left {
		require.NoFileExists(t, p)
	}
	for _, p := range append(kept, info, filepath.Join(e.pluginDir, dra.CheckpointFile)) {
		require.FileExists(t, p)
	}
}

// vfSpecFiles are the driver's own CDI specs, without the helper's device
// metadata specs.
func vfSpecFiles(t testing.TB, e *testEnv) map[string]string {
	t.Helper()
	out := specFiles(t, e)
	maps.DeleteFunc(out, func(name, _ string) bool { return strings.HasPrefix(name, dra.DriverName+"_metadata_") })
	return out
}

// A driver stopped right after it started (a pod deleted during start-up,
// a test ending) must not take the stop for a failure: the helper's gRPC
// servers may not have reached Serve yet, and Serve then answers
// grpc.ErrServerStopped, which the helper hands to HandleError.
func TestStopRightAfterStartIsNotFatal(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	for range 30 {
		d := e.start(t)
		d.Stop()
	}
}
