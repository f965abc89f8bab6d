package dra_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

var (
	rail0vf0 = fixture.VFAddress(0x18, 0) // ibp24s0v0, mlx5_12, uverbs14
	rail1vf0 = fixture.VFAddress(0x40, 0) // ibp64s0v0, mlx5_16, uverbs18
)

func TestPublishesTheDGXVFs(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	devs := e.waitSlices(t, "32 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
	vf := devs[dra.DeviceName(rail0vf0)]
	require.Equal(t, "pci0000:15", *vf.Attributes["resource.kubernetes.io/pcieRoot"].StringValue)
	require.Equal(t, "mellanox.com/mlnx_sriov_rdma", *vf.Attributes["k8s.cni.cncf.io/resourceName"].StringValue)

	k := e.register(t)
	require.Equal(t, "DRAPlugin", k.info.Type)
	require.Equal(t, dra.DriverName, k.info.Name)
	require.Equal(t, filepath.Join(e.pluginDir, "dra.sock"), k.info.Endpoint)
	require.Contains(t, k.info.SupportedVersions, "v1.DRAPlugin")
}

// A claim for a GPU (another driver's) and two VFs: the VFs' CDI devices
// carry exactly their char devices, the claim's env names both VFs.
func TestPrepareWritesCDISpecAndDeviceInfo(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	k := e.register(t)
	c := e.claim(t, "gpu-nic", result{"gpu.example.com", "gpu", "gpu-0"}, vf("nic", rail0vf0), vf("nic", rail1vf0))
	resp := k.prepare(t, c)[string(c.UID)]
	require.Empty(t, resp.Error)
	require.Len(t, resp.Devices, 2, "the GPU is the other driver's")
	require.Equal(t, []string{"nic"}, resp.Devices[0].RequestNames)
	require.Equal(t, testNode, resp.Devices[0].PoolName)
	require.Equal(t, "0000-18-00-1", resp.Devices[0].DeviceName)
	require.Equal(t, []string{"rdma.fastpath-k8s.io/vf=0000:18:00.1", "rdma.fastpath-k8s.io/metadata=gpu-nic-uid_nic"}, resp.Devices[0].CdiDeviceIds,
		"the helper adds the request's metadata device to its first device")
	require.Equal(t, []string{"rdma.fastpath-k8s.io/vf=0000:40:00.1"}, resp.Devices[1].CdiDeviceIds)

	path := filepath.Join(e.cdiDir, "rdma.fastpath-k8s.io-vf_gpu-nic-uid.json")
	spec, err := cdi.ReadSpec(path, 0)
	require.NoError(t, err, "the spec must load as the runtime loads it")
	require.Equal(t, "rdma.fastpath-k8s.io/vf", spec.Kind)
	node := func(p string) *cdispec.DeviceNode {
		return &cdispec.DeviceNode{Path: p, HostPath: filepath.Join(e.root, p), Permissions: "rw"}
	}
	require.Equal(t, []cdispec.Device{
		{Name: rail0vf0, ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{
			node("/dev/infiniband/uverbs14"), node("/dev/infiniband/umad12"), node("/dev/infiniband/issm12")}}},
		{Name: rail1vf0, ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{
			node("/dev/infiniband/uverbs18"), node("/dev/infiniband/umad16"), node("/dev/infiniband/issm16")}}},
	}, spec.Devices)
	require.Equal(t, []*cdispec.DeviceNode{node("/dev/infiniband/rdma_cm")}, spec.ContainerEdits.DeviceNodes)
	env := map[string]string{}
	for _, kv := range spec.ContainerEdits.Env {
		k, v, ok := strings.Cut(kv, "=")
		require.True(t, ok, kv)
		env[k] = v
	}
	require.Equal(t, "0000:18:00.1,0000:40:00.1", env["PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA"])
	require.Equal(t, "=mlx5_12:1,mlx5_16:1", env["NCCL_IB_HCA"])
	require.Equal(t, "mlx5_12:1,mlx5_16:1", env["UCX_NET_DEVICES"])
	var info map[string]plugin.DeviceInfo
	require.NoError(t, json.Unmarshal([]byte(env["PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA_INFO"]), &info))
	require.Equal(t, "ibp24s0v0", info[rail0vf0].Netdev)
	require.Equal(t, "mlx5_16", info[rail1vf0].RDMADevice)
	require.Len(t, env, 4)

	// One device-info file per VF, named as Multus looks it up for a claim.
	for _, vf := range []struct{ addr, rdma, pf string }{{rail0vf0, "mlx5_12", "0000:18:00.0"}, {rail1vf0, "mlx5_16", "0000:40:00.0"}} {
		data, err := os.ReadFile(filepath.Join(e.dev, "gpu-nic-"+vf.addr+"-device.json"))
		require.NoError(t, err)
		require.JSONEq(t, `{"type":"pci","version":"1.1.0","pci":{"pci-address":"`+vf.addr+`","rdma-device":"`+vf.rdma+`","pf-pci-address":"`+vf.pf+`"}}`, string(data))
	}

	// Prepare again (a kubelet restart): same answer, nothing new.
	again := k.prepare(t, c)[string(c.UID)]
	require.Empty(t, again.Error)
	require.Equal(t, resp.Devices[1].CdiDeviceIds, again.Devices[1].CdiDeviceIds)

	// A second claim for one of the VFs is refused: the last line of
	// defence against a VF in two pods.
	c2 := e.claim(t, "thief", vf("nic", rail1vf0))
	r2 := k.prepare(t, c2)[string(c2.UID)]
	require.Contains(t, r2.Error, "VF 0000:40:00.1 is already prepared for claim default/gpu-nic (gpu-nic-uid)")
	require.NoFileExists(t, filepath.Join(e.cdiDir, "rdma.fastpath-k8s.io-vf_thief-uid.json"))

	// Unprepare removes everything the claim had; a second one is a no-op.
	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	require.NoFileExists(t, path)
	entries, err := os.ReadDir(e.dev)
	require.NoError(t, err)
	require.Empty(t, entries)
	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	require.Empty(t, k.prepare(t, c2)[string(c2.UID)].Error, "the VF is free again")
}

func TestPrepareRefusesWhatItCannotServe(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	k := e.register(t)

	c := e.claim(t, "unknown", result{dra.DriverName, "nic", "0000-99-00-1"})
	require.Contains(t, k.prepare(t, c)[string(c.UID)].Error, "device 0000-99-00-1 is not (or no longer) a VF served by DRA on node node-a")

	c = e.claim(t, "other-node", vf("nic", rail0vf0))
	c.Status.Allocation.Devices.Results[0].Pool = "node-b"
	_, err := e.client.ResourceV1().ResourceClaims("default").Update(context.Background(), c, metav1UpdateOptions)
	require.NoError(t, err)
	require.Contains(t, k.prepare(t, c)[string(c.UID)].Error, `is in pool "node-b", this node publishes pool "node-a"`)

	c = e.claim(t, "opaque", vf("nic", rail0vf0))
	c.Status.Allocation.Devices.Config = []resourceapi.DeviceAllocationConfiguration{{Source: resourceapi.AllocationConfigSourceClaim,
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{Driver: dra.DriverName, Parameters: runtime.RawExtension{Raw: []byte(`{}`)}}}}}
	_, err = e.client.ResourceV1().ResourceClaims("default").Update(context.Background(), c, metav1UpdateOptions)
	require.NoError(t, err)
	require.Contains(t, k.prepare(t, c)[string(c.UID)].Error, "takes no opaque parameters")

	// A claim with nothing of ours prepares to nothing and writes nothing.
	c = e.claim(t, "gpu-only", result{"gpu.example.com", "gpu", "gpu-0"})
	r := k.prepare(t, c)[string(c.UID)]
	require.Empty(t, r.Error)
	require.Empty(t, r.Devices)
	files, _ := os.ReadDir(e.cdiDir)
	require.Empty(t, files)
}

// The checkpoint outlives the process: a restarted plugin keeps the claim
// prepared (its VF is not handed out again) and still cleans it up.
func TestRestartKeepsPreparedClaims(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	k := e.register(t)
	c := e.claim(t, "train", vf("nic", rail0vf0))
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)
	spec := filepath.Join(e.cdiDir, dra.CDISpecName(c.UID))
	require.FileExists(t, spec)

	d.Stop()
	require.FileExists(t, spec, "stopping leaves prepared claims alone: their pods run on")
	require.FileExists(t, filepath.Join(e.pluginDir, dra.CheckpointFile))

	e.start(t)
	k = e.register(t)
	c2 := e.claim(t, "late", vf("nic", rail0vf0))
	require.Contains(t, k.prepare(t, c2)[string(c2.UID)].Error, "already prepared for claim default/train")
	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	require.NoFileExists(t, spec)
	require.NoFileExists(t, filepath.Join(e.dev, "train-"+rail0vf0+"-device.json"))
	require.Empty(t, k.prepare(t, c2)[string(c2.UID)].Error)
}

func TestCorruptCheckpointIsAnError(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	require.NoError(t, os.WriteFile(filepath.Join(e.pluginDir, dra.CheckpointFile), []byte(`{"version":1,"claims":`), 0o600))
	_, err := dra.New(dra.Options{NodeName: testNode, KubeClient: e.client, PluginDir: e.pluginDir, RegistryDir: e.registryDir, CDIDir: e.cdiDir})
	require.ErrorContains(t, err, "dra checkpoint "+filepath.Join(e.pluginDir, dra.CheckpointFile))
	require.NoError(t, os.WriteFile(filepath.Join(e.pluginDir, dra.CheckpointFile), []byte(`{"version":9,"claims":{}}`), 0o600))
	_, err = dra.New(dra.Options{NodeName: testNode, KubeClient: e.client, PluginDir: e.pluginDir, RegistryDir: e.registryDir, CDIDir: e.cdiDir})
	require.ErrorContains(t, err, "version 9, this plugin reads version 1")
}

func tainted(devs map[string]resourceapi.Device) []string {
	var out []string
	for n, d := range devs {
		if len(d.Taints) > 0 {
			out = append(out, n+":"+d.Taints[0].Value)
		}
	}
	slices.Sort(out)
	return out
}

// A PF going down taints its VFs (NoSchedule); recovery lifts the taint;
// a VF whose netdev left the host netns is unusable unless a prepared
// claim holds it (then the CNI moved it into the pod).
func TestHealthFromLinkEvents(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	e.waitSlices(t, "32 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
	reports := make(chan kubeletplugin.DeviceHealthReport, 16)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = d.WatchHealthStatus(ctx, reports) }()
	first := <-reports
	require.Len(t, first.Devices, 32)
	for _, h := range first.Devices {
		require.Equal(t, kubeletplugin.HealthStatusHealthy, h.Health)
	}

	e.links.C <- plugin.LinkEvent{Name: "ibp24s0", Up: false}
	var rail0 []string
	for k := 0; k < fixture.DGXVFsPerRail; k++ {
		rail0 = append(rail0, dra.DeviceName(fixture.VFAddress(0x18, k))+":pf-link-down")
	}
	e.waitSlices(t, "rail 0 tainted", func(d map[string]resourceapi.Device) bool { return slices.Equal(tainted(d), rail0) })
	require.Eventually(t, func() bool {
		select {
		case r := <-reports:
			n := 0
			for _, h := range r.Devices {
				if h.Health == kubeletplugin.HealthStatusUnhealthy {
					require.Equal(t, "pf-link-down", h.Message)
					n++
				}
			}
			return n == 4
		default:
			return false
		}
	}, 10*time.Second, time.Millisecond, "the kubelet is told")

	e.links.C <- plugin.LinkEvent{Name: "ibp24s0", Up: true}
	e.waitSlices(t, "no taints", func(d map[string]resourceapi.Device) bool { return len(tainted(d)) == 0 })

	// The VF's netdev leaves the host netns: nobody holds it, so that is
	// a fault.
	e.links.C <- plugin.LinkEvent{Name: "ibp64s0v0", Deleted: true}
	e.waitSlices(t, "netdev gone", func(d map[string]resourceapi.Device) bool {
		return slices.Equal(tainted(d), []string{dra.DeviceName(rail1vf0) + ":netdev-gone"})
	})
	// Prepared for a claim, it is in the pod: healthy.
	k := e.register(t)
	c := e.claim(t, "pod", vf("nic", rail1vf0))
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)
	e.waitSlices(t, "in the pod", func(d map[string]resourceapi.Device) bool { return len(tainted(d)) == 0 })
	// Unprepared with the netdev still away: a fault again.
	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	e.waitSlices(t, "netdev gone after unprepare", func(d map[string]resourceapi.Device) bool { return len(tainted(d)) == 1 })
}

// A VF whose RDMA device has no uverbs under /dev (ib_uverbs reloading,
// a node's /dev not mounted) is published tainted, as the device plugin
// marks it unhealthy, instead of being allocated and failing Prepare.
func TestVFWithoutUverbsIsTainted(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS(fixtureRoot("dgx-h100"))))
	require.NoError(t, os.Remove(filepath.Join(root, "dev/infiniband/uverbs14"))) // rail 0's first VF's
	e := newTestEnv(t, root, "dra.json")
	d := e.start(t)
	devs := e.waitSlices(t, "32 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
	require.Equal(t, []string{dra.DeviceName(rail0vf0) + ":" + dra.ReasonNoUverbs}, tainted(devs))

	reports := make(chan kubeletplugin.DeviceHealthReport, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = d.WatchHealthStatus(ctx, reports) }()
	var unhealthy []string
	for _, h := range (<-reports).Devices {
		if h.Health == kubeletplugin.HealthStatusUnhealthy {
			unhealthy = append(unhealthy, h.DeviceName+":"+h.Message)
		}
	}
	require.Equal(t, []string{dra.DeviceName(rail0vf0) + ":" + dra.ReasonNoUverbs}, unhealthy)

	k := e.register(t)
	c := e.claim(t, "x", vf("nic", rail0vf0))
	require.Contains(t, k.prepare(t, c)[string(c.UID)].Error, "is ib_uverbs loaded?")
}

// An API server without DRADeviceTaints drops the taints; the driver sees
// it (the ResourceSlice controller reports the dropped fields) and leaves
// unhealthy VFs out instead.
func TestWithoutDeviceTaintsUnhealthyVFsAreLeftOut(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	dropTaints := func(a k8stesting.Action) (bool, runtime.Object, error) {
		var s *resourceapi.ResourceSlice
		switch a := a.(type) {
		case k8stesting.CreateAction:
			s, _ = a.GetObject().(*resourceapi.ResourceSlice)
		case k8stesting.UpdateAction:
			s, _ = a.GetObject().(*resourceapi.ResourceSlice)
		}
		if s != nil {
			for i := range s.Spec.Devices {
				s.Spec.Devices[i].Taints = nil
			}
		}
		return false, nil, nil
	}
	e.client.PrependReactor("create", "resourceslices", dropTaints)
	e.client.PrependReactor("update", "resourceslices", dropTaints)
	e.start(t)
	e.waitSlices(t, "32 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
	e.links.C <- plugin.LinkEvent{Name: "ibp24s0", Up: false}
	got := e.waitSlices(t, "rail 0 left out", func(d map[string]resourceapi.Device) bool { return len(d) == 28 })
	require.NotContains(t, got, dra.DeviceName(rail0vf0))
	e.links.C <- plugin.LinkEvent{Name: "ibp24s0", Up: true}
	e.waitSlices(t, "rail 0 back", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
}

// Rescans and config reloads reach the slices through Update.
func TestUpdateRepublishes(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	e.waitSlices(t, "32 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
	scan := e.scan
	scan.Pools = slices.Clone(scan.Pools)
	for i := range scan.Pools {
		scan.Pools[i].Devices = slices.DeleteFunc(slices.Clone(scan.Pools[i].Devices), func(d nicDevice) bool { return d.PFAddress == "0000:18:00.0" })
	}
	d.Update(scan)
	e.waitSlices(t, "rail 0 gone", func(d map[string]resourceapi.Device) bool { return len(d) == 28 })
	// A config reload that gives the pool back to the device plugin.
	for i := range scan.Pools {
		scan.Pools[i].ServedBy = "devicePlugin"
	}
	d.Update(scan)
	e.waitSlices(t, "no VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 0 })
	list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1ListOptions)
	require.NoError(t, err)
	require.Len(t, list.Items, 1, "an empty pool is still published")
}

// A write that a kill cut short left its temporary file in the driver's
// staging directory: the next driver removes it before it serves, and
// leaves the specs in place (prepared claims keep theirs) and what is not
// its own.
func TestKilledWriteLeftoversRemoved(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	staging := filepath.Join(e.cdiDir, ".fastpath-dra-staging")
	require.NoError(t, os.MkdirAll(staging, 0o755))
	left := filepath.Join(staging, "spec.1234.tmp")
	kept := []string{filepath.Join(e.cdiDir, dra.CDISpecName("c-1")), filepath.Join(e.cdiDir, ".fastpath-staging", "spec.5678.tmp"), filepath.Join(e.cdiDir, "spec.9.tmp")}
	for _, p := range append([]string{left}, kept...) {
		require.NoError(t, os.MkdirAll(filepath.Dir(p), 0o755))
		require.NoError(t, os.WriteFile(p, []byte("{"), 0o600))
	}
	_, err := dra.New(dra.Options{NodeName: testNode, KubeClient: e.client, PluginDir: e.pluginDir, RegistryDir: e.registryDir, CDIDir: e.cdiDir})
	require.NoError(t, err)
	require.NoDirExists(t, staging)
	for _, p := range kept {
		require.FileExists(t, p)
	}
}
