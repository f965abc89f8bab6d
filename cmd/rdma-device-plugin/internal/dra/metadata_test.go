package dra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/api/metadata"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/devicemetadata"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

var rail2vf0 = fixture.VFAddress(0x4f, 0) // ibp79s0v0, mlx5_20, uverbs22

// metadataSpecName is the file name the helper gives a request's metadata
// CDI spec.
func metadataSpecName(claim types.UID, request string) string {
	return fmt.Sprintf("%s_metadata_%s_%s.json", dra.DriverName, claim, request)
}

// metadataIDs are the helper's metadata CDI devices in a claim's response.
func metadataIDs(r *drapbv1.NodePrepareResourceResponse) []string {
	var ids []string
	for _, d := range r.Devices {
		for _, id := range d.CdiDeviceIds {
			if strings.HasPrefix(id, dra.MetadataCDIKind+"=") {
				ids = append(ids, id)
			}
		}
	}
	return ids
}

// mountedMetadata is what a container that references the CDI device id
// finds at containerPath: the runtime applies the metadata spec (loaded
// from the CDI directory as a runtime loads it), and the file is read
// from the host path it bind-mounts there, decoded as a consumer does
// (validated, the first version it understands).
func mountedMetadata(t testing.TB, e *testEnv, id, containerPath string) (string, *metadata.DeviceMetadata, schema.GroupVersion) {
	t.Helper()
	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	unresolved, err := e.runtime(t).InjectDevices(spec, id)
	require.NoError(t, err)
	require.Empty(t, unresolved)
	i := slices.IndexFunc(spec.Mounts, func(m oci.Mount) bool { return m.Destination == containerPath })
	require.GreaterOrEqual(t, i, 0, "%s mounts nothing at %s (mounts: %+v)", id, containerPath, spec.Mounts)
	m := spec.Mounts[i]
	require.Contains(t, m.Options, "ro")
	f, err := os.Open(m.Source)
	require.NoError(t, err)
	defer f.Close()
	var md metadata.DeviceMetadata
	var gvk schema.GroupVersionKind
	var invalid error
	require.NoError(t, devicemetadata.DecodeMetadataFromStream(json.NewDecoder(f), &md,
		devicemetadata.DecodeMetadataStoreGVKResult(&gvk), devicemetadata.DecodeMetadataWithValidationResult(&invalid)))
	require.NoError(t, invalid, "the file fails the metadata API's validation")
	return m.Source, &md, gvk.GroupVersion()
}

// The helper writes, per request of a prepared claim, the metadata file
// a workload reads at the path KEP-5304 gives it: each VF with its slice
// attributes, its device nodes and rdma_cm. Unprepare removes it and its
// CDI spec.
func TestPrepareWritesDeviceMetadata(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	published := e.waitSlices(t, "32 VFs", func(d map[string]resourceapi.Device) bool { return len(d) == 32 })
	k := e.register(t)

	c := e.claim(t, "gpu-nic", result{"gpu.example.com", "gpu", "gpu-0"}, vf("nic", rail0vf0), vf("nic", rail1vf0))
	// A claim made from a pod's template: its file is found under the
	// pod's name for the claim, not the generated claim name.
	tmpl := e.claim(t, "train-0-rdma-x7k2p", vf("vf", rail2vf0))
	tmpl.Annotations = map[string]string{resourceapi.PodResourceClaimAnnotation: "rdma"}
	tmpl, err := e.client.ResourceV1().ResourceClaims("default").Update(context.Background(), tmpl, metav1UpdateOptions)
	require.NoError(t, err)
	resp := k.prepare(t, c, tmpl)

	r := resp[string(c.UID)]
	require.Empty(t, r.Error)
	ids := metadataIDs(r)
	require.Equal(t, []string{dra.MetadataCDIKind + "=gpu-nic-uid_nic"}, ids, "one metadata device per request")
	hostFile, md, gv := mountedMetadata(t, e, ids[0],
		"/var/run/kubernetes.io/dra-device-attributes/resourceclaims/gpu-nic/nic/rdma.fastpath-k8s.io-metadata.json")
	require.Equal(t, metadatav1beta1.SchemeGroupVersion, gv)
	require.Equal(t, filepath.Join(e.pluginDir, "dra-device-metadata", "default_gpu-nic", "nic", "metadata.json"), hostFile)
	require.Equal(t, "gpu-nic", md.Name)
	require.Equal(t, c.UID, md.UID)
	require.Len(t, md.Requests, 1)
	require.Equal(t, "nic", md.Requests[0].Name)
	devs := md.Requests[0].Devices
	require.Len(t, devs, 2, "the GPU is the other driver's")
	for i, addr := range []string{rail0vf0, rail1vf0} {
		d := devs[i]
		require.Equal(t, dra.DriverName, d.Driver)
		require.Equal(t, testNode, d.Pool)
		require.Equal(t, dra.DeviceName(addr), d.Name)
		require.Equal(t, str(addr), d.Attributes["resource.kubernetes.io/pciBusID"], addr)
		// Everything the scheduler sees of the VF, the workload sees.
		for name, v := range published[d.Name].Attributes {
			require.Equal(t, v, d.Attributes[name], "%s: slice attribute %s", addr, name)
		}
	}
	vf0 := devs[0].Attributes
	require.Equal(t, str("mlx5_12"), vf0["rdmaDevice"])
	require.Equal(t, str("/dev/infiniband/uverbs14"), vf0["uverbs"])
	require.Equal(t, str("/dev/infiniband/uverbs14,/dev/infiniband/umad12,/dev/infiniband/issm12"), vf0["charDevices"])
	require.Equal(t, str("/dev/infiniband/rdma_cm"), vf0["rdmaCM"])
	require.Equal(t, str("ibp24s0v0"), vf0["netdev"], "the VF's netdev on the host at Prepare")
	require.Equal(t, str("0000:18:00.0"), vf0["pfPciAddress"])
	require.Equal(t, str("pci0000:15"), vf0["resource.kubernetes.io/pcieRoot"])
	require.NotNil(t, vf0["resource.kubernetes.io/numaNode"].IntValue)
	require.Nil(t, devs[0].NetworkData, "the pod's interface is named after Prepare")

	rt := resp[string(tmpl.UID)]
	require.Empty(t, rt.Error)
	_, tmd, _ := mountedMetadata(t, e, metadataIDs(rt)[0],
		"/var/run/kubernetes.io/dra-device-attributes/resourceclaimtemplates/rdma/vf/rdma.fastpath-k8s.io-metadata.json")
	require.Equal(t, "rdma", *tmd.PodClaimName)
	require.Equal(t, str(rail2vf0), tmd.Requests[0].Devices[0].Attributes["resource.kubernetes.io/pciBusID"])

	// Unprepare: the file, its claim's directory and its spec are gone;
	// the other claim's stay.
	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	require.NoFileExists(t, hostFile)
	require.NoDirExists(t, filepath.Join(e.pluginDir, "dra-device-metadata", "default_gpu-nic"))
	require.NoFileExists(t, filepath.Join(e.cdiDir, metadataSpecName(c.UID, "nic")))
	require.FileExists(t, filepath.Join(e.cdiDir, metadataSpecName(tmpl.UID, "vf")))
	require.Empty(t, k.unprepare(t, tmpl)[string(tmpl.UID)].Error)
	require.NoFileExists(t, filepath.Join(e.cdiDir, metadataSpecName(tmpl.UID, "vf")))
	left, err := os.ReadDir(filepath.Join(e.pluginDir, "dra-device-metadata"))
	require.NoError(t, err)
	require.Empty(t, left)
}

// A restarted plugin whose scan no longer has a prepared claim's VF (its
// netdev and RDMA device went into the pod) answers a second Prepare from
// its checkpoint; the helper then rewrites the metadata file, which must
// keep the VF's attributes.
func TestRestartKeepsDeviceMetadata(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	k := e.register(t)
	c := e.claim(t, "train", vf("nic", rail0vf0))
	resp := k.prepare(t, c)
	id := metadataIDs(resp[string(c.UID)])
	require.Len(t, id, 1)
	const path = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/nic/rdma.fastpath-k8s.io-metadata.json"
	_, before, _ := mountedMetadata(t, e, id[0], path)
	require.Equal(t, str("/dev/infiniband/uverbs14"), before.Requests[0].Devices[0].Attributes["uverbs"])

	d.Stop()
	for i := range e.scan.Pools {
		e.scan.Pools[i].Devices = slices.DeleteFunc(slices.Clone(e.scan.Pools[i].Devices), func(d nicDevice) bool { return d.PCIAddress == rail0vf0 })
	}
	e.start(t)
	k = e.register(t)
	again := k.prepare(t, c)[string(c.UID)]
	require.Empty(t, again.Error)
	require.Equal(t, id, metadataIDs(again))
	_, after, _ := mountedMetadata(t, e, id[0], path)
	require.Equal(t, before.Requests, after.Requests)

	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	require.NoFileExists(t, filepath.Join(e.pluginDir, "dra-device-metadata", "default_train", "nic", "metadata.json"))
	require.NoFileExists(t, filepath.Join(e.cdiDir, metadataSpecName(c.UID, "nic")))
}
