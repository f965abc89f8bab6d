package dra_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/gpustandin"
)

// alignmentClaim is a claim made from a template of
// deployments/components/dra/examples/alignment, with the API server's
// defaults.
func alignmentClaim(t *testing.T, file string) *resourceapi.ResourceClaim {
	t.Helper()
	tmpl := &resourceapi.ResourceClaimTemplate{}
	decodeYAML(t, filepath.Join(draComponent, "examples", "alignment", file), "ResourceClaimTemplate", tmpl)
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: tmpl.Name + "-0", UID: "align-uid"}, Spec: tmpl.Spec.Spec}
	for i := range c.Spec.Devices.Requests {
		r := c.Spec.Devices.Requests[i].Exactly
		if r.AllocationMode == "" {
			r.AllocationMode = resourceapi.DeviceAllocationModeExactCount
		}
		if r.Count == 0 {
			r.Count = 1
		}
	}
	return c
}

// published is what the allocator's inputs say about a device: the GPUs'
// attributes from the stand-in, the VFs' from fastpath's slices.
func publishedAttrs(t *testing.T) map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute {
	t.Helper()
	out := map[string]map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{}
	root := fixtureRoot("dgx-h100")
	for _, s := range dra.Resources("dgx-0", draPools(t, root, "dra.json"), nil, true).Pools["dgx-0"].Slices {
		for _, d := range s.Devices {
			out[dra.DriverName+"/"+d.Name] = d.Attributes
		}
	}
	gpus, err := gpustandin.GPUs(root)
	require.NoError(t, err)
	for _, g := range gpus {
		out[gpustandin.DriverName+"/"+g.Device.Name] = g.Device.Attributes
	}
	return out
}

func resultsByRequest(out []resourceapi.AllocationResult) map[string]string {
	got := map[string]string{}
	for _, res := range out[0].Devices.Results {
		got[res.Request] = res.Driver + "/" + res.Device
	}
	return got
}

// The DGX shape, given to the scheduler's allocator: 8 GPUs, and for each
// a VF under its PCIe root — 8 VFs on 8 rails. (That it cannot be met
// with one rail down is left to make e2e-cluster: the allocator backtracks
// through every GPU-VF pairing before it gives up, which takes minutes
// here and ends at the scheduler's filter timeout there.)
func TestAllocatorDGX8GPUs8Rails(t *testing.T) {
	attrs := publishedAttrs(t)
	out := allocation(t, alignmentClaim(t, "dgx-8-gpus-8-rails.yaml"), nil)
	require.Len(t, out, 1, "allocated")
	got := resultsByRequest(out)
	require.Len(t, got, 16)
	gpus, pfs := map[string]bool{}, map[string]bool{}
	for i := 0; i < 8; i++ {
		g, v := got[fmt.Sprintf("gpu%d", i)], got[fmt.Sprintf("vf%d", i)]
		root := attrs[g]["resource.kubernetes.io/pcieRoot"]
		require.NotNil(t, root.StringValue, g)
		require.Equal(t, *root.StringValue, *attrs[v]["resource.kubernetes.io/pcieRoot"].StringValue, "vf%d under gpu%d's root", i, i)
		gpus[g] = true
		pfs[*attrs[v][dra.AttrPFPCIAddress].StringValue] = true
	}
	require.Len(t, gpus, 8)
	require.Len(t, pfs, 8, "one VF per rail")

}

// A GPU and a VF on one NUMA node: whichever GPU, the VF's numaNode is
// the GPU's.
func TestAllocatorGPUAndNUMAVF(t *testing.T) {
	attrs := publishedAttrs(t)
	for _, r := range fixture.DGXRails {
		gpu := fixture.PCIAddress(0, r.Bus+1, 0, 0)
		t.Run(gpu, func(t *testing.T) {
			c := alignmentClaim(t, "gpu-numa-vf.yaml")
			for i := range c.Spec.Devices.Requests {
				if q := &c.Spec.Devices.Requests[i]; q.Name == "gpu" {
					q.Exactly.Selectors = append(q.Exactly.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
						Expression: `device.attributes["resource.kubernetes.io"].pciBusID == "` + gpu + `"`}})
				}
			}
			out := allocation(t, c, nil)
			require.Len(t, out, 1, "allocated")
			got := resultsByRequest(out)
			g, v := attrs[got["gpu"]], attrs[got["vf"]]
			require.NotNil(t, g["resource.kubernetes.io/numaNode"].IntValue)
			require.Equal(t, *g["resource.kubernetes.io/numaNode"].IntValue, *v["resource.kubernetes.io/numaNode"].IntValue)
		})
	}
}
