package gpustandin_test

import (
	"fmt"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/gpustandin"
)

func TestDGXGPUs(t *testing.T) {
	gpus, err := gpustandin.GPUs(filepath.Join("..", "..", "..", "testdata", "sysfs", "dgx-h100"))
	require.NoError(t, err)
	require.Len(t, gpus, len(fixture.DGXRails))
	for i, r := range fixture.DGXRails {
		g := gpus[i]
		require.Equal(t, fixture.PCIAddress(0, r.Bus+1, 0, 0), g.PCIAddress)
		require.Equal(t, gpustandin.DeviceName(g.PCIAddress), g.Device.Name)
		a := g.Device.Attributes
		require.Equal(t, g.PCIAddress, *a["resource.kubernetes.io/pciBusID"].StringValue)
		// The rail's root complex: its root port is at bus-3.
		require.Equal(t, fmt.Sprintf("pci0000:%02x", r.Bus-3), *a["resource.kubernetes.io/pcieRoot"].StringValue)
		require.Equal(t, int64(r.NUMA), *a["resource.kubernetes.io/numaNode"].IntValue)
	}
	// A host without GPUs has none, and no error.
	none, err := gpustandin.GPUs(filepath.Join("..", "..", "..", "testdata", "sysfs", "roce-cx6dx"))
	require.NoError(t, err)
	require.Empty(t, none)
}
