package nic

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestFamilyHasRDMA(t *testing.T) {
	for _, tc := range []struct {
		driver     string
		family     string
		pf, vf     bool
		rdmaDriver string
	}{
		{"mlx5_core", "ConnectX", true, true, "mlx5_ib"},
		{"ice", "Intel E810", true, false, "irdma"},
		{"i40e", "Intel X710", true, false, "irdma"},
		{"iavf", "Intel E810", true, false, "irdma"},
		{"bnxt_en", "Broadcom NetXtreme-E", true, true, "bnxt_re"},
		{"ixgbevf", "Intel 82599/X540/X550", false, false, ""},
		{"igb", "Intel 82576/I350", false, false, ""},
		{"igbvf", "Intel 82576/I350", false, false, ""},
	} {
		t.Run(tc.driver, func(t *testing.T) {
			f, ok := FamilyOf(tc.driver)
			require.True(t, ok)
			require.Equal(t, tc.family, f.Name)
			require.Equal(t, tc.rdmaDriver, f.RDMADriver)
			require.Equal(t, tc.pf, f.HasRDMA(false), "PF")
			require.Equal(t, tc.vf, f.HasRDMA(true), "VF")
		})
	}
	for _, driver := range []string{"vfio-pci", "", "qede"} {
		_, ok := FamilyOf(driver)
		require.False(t, ok, driver)
	}
}

// RDMAHint names the module to load where the kernel gives the function
// an RDMA device, and why not where it gives none; a driver that is only a
// family's VF driver is taken as a VF's.
func TestRDMAHint(t *testing.T) {
	for driver, want := range map[string]string{
		"mlx5_core": "is mlx5_ib loaded?",
		"bnxt_en":   "is bnxt_re loaded?",
		"ice":       "is irdma loaded?",
		"iavf":      "irdma gives RDMA devices to ice PFs only, not to their VFs (iavf)",
		"igb":       "Intel 82576/I350 functions (igb, igbvf) have no RDMA in the kernel",
		"igbvf":     "Intel 82576/I350 functions (igb, igbvf) have no RDMA in the kernel",
		"foo":       "is its vendor's RDMA driver loaded?",
		"vfio-pci":  "is its vendor's RDMA driver loaded?",
	} {
		require.Equal(t, want, RDMAHint(driver), driver)
	}
}
