package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"sigs.k8s.io/yaml"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/gpustandin"
)

var draComponent = filepath.Join("..", "..", "..", "..", "deployments", "components", "dra")

// classes serves the shipped DeviceClass and a GPU class for the stand-in
// GPU driver, under the name the example claims use.
type classes map[string]*resourceapi.DeviceClass

func (c classes) List() ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, dc := range c {
		out = append(out, dc)
	}
	return out, nil
}

func (c classes) Get(name string) (*resourceapi.DeviceClass, error) {
	if dc, ok := c[name]; ok {
		return dc, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

func decodeYAML(t *testing.T, path string, kind string, out any) {
	t.Helper()
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, doc := range strings.Split(string(data), "\n---\n") {
		if strings.Contains(doc, "\nkind: "+kind+"\n") {
			require.NoError(t, yaml.UnmarshalStrict([]byte(doc), out), path)
			return
		}
	}
	t.Fatalf("%s: no %s", path, kind)
}

// allocation runs the scheduler's own allocator (the structured package
// kube-scheduler uses) for one claim on the DGX fixture node, with
// fastpath's slices (VFs unhealthy as given, tainted) and the stand-in GPU
// driver's.
func allocation(t *testing.T, claim *resourceapi.ResourceClaim, unhealthy map[string]string) []resourceapi.AllocationResult {
	t.Helper()
	const node = "dgx-0"
	root := fixtureRoot("dgx-h100")
	var slices []*resourceapi.ResourceSlice
	res := dra.Resources(node, draPools(t, root, "dra.json"), unhealthy, true)
	for i, s := range res.Pools[node].Slices {
		slices = append(slices, &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", node, i)},
			Spec: resourceapi.ResourceSliceSpec{Driver: dra.DriverName, NodeName: ptrTo(node), Devices: s.Devices,
				Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(res.Pools[node].Slices))}},
		})
	}
	gpus, err := gpustandin.GPUs(root)
	require.NoError(t, err)
	require.Len(t, gpus, 8, "the DGX fixture has a GPU per rail")
	gs := &resourceapi.ResourceSlice{ObjectMeta: metav1.ObjectMeta{Name: "gpus"}, Spec: resourceapi.ResourceSliceSpec{
		Driver: gpustandin.DriverName, NodeName: ptrTo(node), Pool: resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: 1}}}
	for _, g := range gpus {
		gs.Spec.Devices = append(gs.Spec.Devices, g.Device)
	}
	slices = append(slices, gs)

	vfClass := &resourceapi.DeviceClass{}
	decodeYAML(t, filepath.Join(draComponent, "deviceclass.yaml"), "DeviceClass", vfClass)
	gpuClass := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "gpu.nvidia.com"}, Spec: resourceapi.DeviceClassSpec{
		Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + gpustandin.DriverName + `"`}}}}}
	features := structured.Features{DeviceTaints: true}
	a, err := structured.NewAllocator(context.Background(), features,
		structured.AllocatedState{AllocatedDevices: sets.New[structured.DeviceID]()},
		classes{vfClass.Name: vfClass, gpuClass.Name: gpuClass}, slices, cel.NewCache(10, cel.Features{}))
	require.NoError(t, err)
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	out, err := a.Allocate(context.Background(), n, []*resourceapi.ResourceClaim{claim})
	require.NoError(t, err)
	return out
}

func ptrTo[T any](v T) *T { return &v }

// exampleClaim is the shipped example's template, its GPU request pinned
// to the GPU at gpuAddr.
func exampleClaim(t *testing.T, gpuAddr string) *resourceapi.ResourceClaim {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{}
	decodeYAML(t, filepath.Join(draComponent, "examples", "gpu-vf-template.yaml"), "ResourceClaimTemplate", tmpl)
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "train-0", UID: "train-0-uid"}, Spec: tmpl.Spec.Spec}
	for i := range c.Spec.Devices.Requests {
		r := &c.Spec.Devices.Requests[i]
		// The API server's defaults.
		if r.Exactly.AllocationMode == "" {
			r.Exactly.AllocationMode = resourceapi.DeviceAllocationModeExactCount
		}
		if r.Exactly.Count == 0 {
			r.Exactly.Count = 1
		}
		if r.Name == "gpu" {
			r.Exactly.Selectors = append(r.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
				Expression: `device.attributes["resource.kubernetes.io"].pciBusID == "` + gpuAddr + `"`}})
		}
	}
	return c
}

// The shipped claim for "a GPU and a VF under the same PCIe root", given
// to the scheduler's allocator: whichever GPU it gets, the VF is one of
// that GPU's rail.
func TestAllocatorAlignsVFWithGPU(t *testing.T) {
	for _, r := range fixture.DGXRails {
		gpu := fixture.PCIAddress(0, r.Bus+1, 0, 0)
		t.Run(gpu, func(t *testing.T) {
			out := allocation(t, exampleClaim(t, gpu), nil)
			require.Len(t, out, 1, "allocated")
			got := map[string]string{}
			for _, res := range out[0].Devices.Results {
				got[res.Request] = res.Driver + "/" + res.Device
			}
			require.Equal(t, gpustandin.DriverName+"/"+gpustandin.DeviceName(gpu), got["gpu"])
			// Rail r's first VF: spread lists VF 0 of every rail first.
			require.Equal(t, dra.DriverName+"/"+dra.DeviceName(fixture.VFAddress(r.Bus, 0)), got["vf"])
		})
	}
}

// When no usable VF shares the GPU's root, the claim is not allocated on
// this node: never a VF of another rail.
func TestAllocatorLeavesAnUnalignableClaimUnallocated(t *testing.T) {
	gpu := fixture.PCIAddress(0, 0x41, 0, 0) // rail 0x40
	unhealthy := map[string]string{}
	for k := 0; k < fixture.DGXVFsPerRail; k++ {
		unhealthy[fixture.VFAddress(0x40, k)] = dra.ReasonPFLinkDown
	}
	require.Empty(t, allocation(t, exampleClaim(t, gpu), unhealthy))
	// A toleration of the taint makes them eligible again: the taint is
	// what kept them out.
	c := exampleClaim(t, gpu)
	for i := range c.Spec.Devices.Requests {
		if r := &c.Spec.Devices.Requests[i]; r.Name == "vf" {
			r.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: dra.TaintUnhealthy, Operator: resourceapi.DeviceTolerationOpExists}}
		}
	}
	out := allocation(t, c, unhealthy)
	require.Len(t, out, 1)
}
