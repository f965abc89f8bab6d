package sriov_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

func fixtureRoot(name string) string { return filepath.Join("..", "..", "testdata", "sysfs", name) }

func readPF(t *testing.T, root, addr string) (sriov.PF, bool) {
	t.Helper()
	f, err := pci.New(root).Function(addr)
	require.NoError(t, err)
	p, ok, err := sriov.ReadPFOf(&f)
	require.NoError(t, err)
	return p, ok
}

func TestReadPF(t *testing.T) {
	for _, tc := range []struct {
		name, root, addr string
		ok               bool
		want             sriov.PF
	}{
		{"PF with 4 of 16 VFs", fixtureRoot("dgx-h100"), "0000:18:00.0", true,
			sriov.PF{TotalVFs: 16, NumVFs: 4, VFs: []string{"0000:18:00.1", "0000:18:00.2", "0000:18:00.3", "0000:18:00.4"}}},
		{"PF with none enabled", fixtureRoot("edge"), "0000:af:00.1", true, sriov.PF{TotalVFs: 8}},
		{"a VF has no SR-IOV capability", fixtureRoot("dgx-h100"), "0000:18:00.1", false, sriov.PF{}},
		{"nor does a GPU", fixtureRoot("dgx-h100"), "0000:19:00.0", false, sriov.PF{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := readPF(t, tc.root, tc.addr)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.want, p)
		})
	}
}

func TestIndex(t *testing.T) {
	p, ok := readPF(t, fixtureRoot("edge"), "0000:86:00.0")
	require.True(t, ok)
	require.Equal(t, 0, p.Index("0000:86:00.1"))
	require.Equal(t, 3, p.Index("0000:86:00.4"))
	require.Equal(t, -1, p.Index("0000:af:00.2"), "another PF's VF")
}

// VFs being disabled: the kernel removes the PF's virtfnN links first.
// What the PF still lists keeps its index; nothing after a gap is taken.
func TestReadPFWhileVFsChange(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 1, 3))
	pf := fixture.PCIAddress(0, 0x10, 0, 0)
	dir := filepath.Join(root, "sys/bus/pci/devices", pf)
	require.NoError(t, os.Remove(filepath.Join(dir, "virtfn1")))
	p, ok := readPF(t, root, pf)
	require.True(t, ok)
	require.Equal(t, 3, p.NumVFs)
	require.Equal(t, []string{fixture.VFAddress(0x10, 0)}, p.VFs)

	// A virtfn link that names no PCI function ends the list too.
	require.NoError(t, os.Symlink("../garbage", filepath.Join(dir, "virtfn1")))
	p, _ = readPF(t, root, pf)
	require.Equal(t, []string{fixture.VFAddress(0x10, 0)}, p.VFs)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "sriov_numvfs"), []byte("x\n"), 0o644))
	p, ok = readPF(t, root, pf)
	require.True(t, ok, "the capability is there")
	require.Zero(t, p.NumVFs)
	require.Empty(t, p.VFs)
}
