package plugin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// A runtime reading the CDI directory (through the CDI library, as
// containerd, CRI-O and podman do) never sees the staging directory, even
// with a killed write's garbage in it, and sees each spec whole once
// written.
func TestCDIStagingUnseen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	staging := filepath.Join(dir, cdiStaging)
	require.NoError(t, os.MkdirAll(staging, 0o755))
	for _, name := range []string{"spec.1234.tmp", cdiSpecName("mellanox.com", "rails")} {
		require.NoError(t, os.WriteFile(filepath.Join(staging, name), []byte(`{"cdiVersion": "0.5.0", "kind": "mellanox.com/rails", "devi`), 0o600))
	}
	runtime, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	require.NoError(t, err)
	require.Empty(t, runtime.GetErrors())
	require.Empty(t, runtime.ListDevices())

	c, err := newCDISpecs(dir)
	require.NoError(t, err)
	rails := dgxPools(t)[0]
	ok, err := c.write(&rails, rdma.RDMACMPath, "/")
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, runtime.Refresh())
	require.Empty(t, runtime.GetErrors())
	require.Len(t, runtime.ListDevices(), len(rails.Devices))
	require.NotNil(t, runtime.GetDevice(CDIDeviceName(&rails, rails.Devices[0].PCIAddress)))
	// The write left nothing of its own in the staging directory; the
	// garbage there is the startup sweep's.
	left, err := os.ReadDir(staging)
	require.NoError(t, err)
	require.Len(t, left, 2)
	require.NoError(t, c.removeLeftovers(map[string]pool.Pool{rails.ResourceName(): rails}))
	_, err = os.Stat(staging)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, runtime.Refresh())
	require.Len(t, runtime.ListDevices(), len(rails.Devices))
}
