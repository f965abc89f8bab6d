package plugin

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// checkState against the roce-cx6dx fixture's sysfs: VF 0000:3b:00.3 is
// virtfn1 of PF 0000:3b:00.0 (ens1f0np0), RDMA device mlx5_3. No root
// needed: it only reads sysfs.
func TestCheckState(t *testing.T) {
	root, err := filepath.Abs(filepath.Join("..", "..", "..", "..", "testdata", "sysfs", "roce-cx6dx"))
	require.NoError(t, err)
	p := &Plugin{HostRoot: root}
	good := func() *State {
		return &State{PCIAddress: "0000:3b:00.3", PFAddress: "0000:3b:00.0", PFNetdev: "ens1f0np0", VFIndex: 1, RDMADevice: "mlx5_3"}
	}
	require.NoError(t, p.checkState(good()))
	v1 := good()
	v1.PFAddress, v1.PFNetdev, v1.RDMADevice = "", "", ""
	require.NoError(t, p.checkState(v1), "fields an older state lacks are not required")

	for _, tc := range []struct {
		name   string
		change func(*State)
		want   string
	}{
		{"not in sysfs", func(s *State) { s.PCIAddress = "0000:3b:07.7" }, "VF 0000:3b:07.7"},
		{"a PF", func(s *State) { s.PCIAddress = "0000:3b:00.1" }, "not a VF"},
		{"another PF", func(s *State) { s.PFAddress = "0000:3b:00.1" }, "pfAddress 0000:3b:00.1 does not match the kernel's 0000:3b:00.0"},
		{"wrong index", func(s *State) { s.VFIndex = 3 }, "vfIndex 3 does not match the kernel's 1"},
		{"another PF's netdev", func(s *State) { s.PFNetdev = "ens1f1np1" }, "pfNetdev ens1f1np1 does not match"},
		{"a VF's netdev as the PF's", func(s *State) { s.PFNetdev = "ens1f0v1" }, "pfNetdev ens1f0v1 does not match"},
		{"another VF's RDMA device", func(s *State) { s.RDMADevice = "mlx5_9" }, "rdmaDevice mlx5_9 does not match the kernel's mlx5_3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := good()
			tc.change(st)
			err := p.checkState(st)
			require.ErrorIs(t, err, ErrBadState)
			require.ErrorContains(t, err, tc.want)
		})
	}
}
