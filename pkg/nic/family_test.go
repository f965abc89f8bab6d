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
