package plugin

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

func inode(t *testing.T, path string) uint64 {
	t.Helper()
	st, err := os.Stat(path)
	require.NoError(t, err)
	return st.Sys().(*syscall.Stat_t).Ino
}

// A device allocated again keeps its current file; a file that is not
// current (changed, made writable, removed) is written again.
func TestDevInfoRewrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "devinfo")
	s := newDevInfoStore(dir)
	d := &nic.Device{PCIAddress: "0000:18:00.1", RDMADevice: "mlx5_12", PFAddress: "0000:18:00.0"}
	path := DevInfoPath(dir, "mellanox.com", "rails", d.PCIAddress)
	const want = `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.1","rdma-device":"mlx5_12","pf-pci-address":"0000:18:00.0"}}`
	check := func(t *testing.T) {
		t.Helper()
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.JSONEq(t, want, string(data))
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o444), st.Mode().Perm())
	}

	require.NoError(t, s.write("mellanox.com", "rails", d))
	check(t)
	ino := inode(t, path)
	require.NoError(t, s.write("mellanox.com", "rails", d))
	require.Equal(t, ino, inode(t, path), "a current file is left alone")

	for _, tc := range []struct {
		name   string
		tamper func(t *testing.T)
	}{
		{"made writable", func(t *testing.T) { require.NoError(t, os.Chmod(path, 0o644)) }},
		{"other content", func(t *testing.T) {
			require.NoError(t, os.Chmod(path, 0o644))
			require.NoError(t, os.WriteFile(path, []byte(`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.2"}}`), 0o444))
			require.NoError(t, os.Chmod(path, 0o444))
		}},
		{"removed", func(t *testing.T) { require.NoError(t, os.Remove(path)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.tamper(t)
			require.NoError(t, s.write("mellanox.com", "rails", d))
			check(t)
		})
	}

	require.NoError(t, s.removeAll())
	_, err := os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// The sweep of an earlier run's files never takes this run's writes, in
// flight or done, for leftovers: every write that succeeded has its file.
func TestDevInfoSweepSparesWrites(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "devinfo")
	s := newDevInfoStore(dir)
	var devs []*nic.Device
	for i := range 64 {
		devs = append(devs, &nic.Device{PCIAddress: fmt.Sprintf("0000:18:%02x.%d", i/8, i%8), RDMADevice: fmt.Sprintf("mlx5_%d", i)})
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range 200 {
			if err := s.removeLeftovers("mellanox.com", "rails"); err != nil {
				t.Error(err)
				return
			}
		}
	}()
	for _, d := range devs {
		require.NoError(t, s.write("mellanox.com", "rails", d))
	}
	<-done
	for _, d := range devs {
		_, err := os.Stat(DevInfoPath(dir, "mellanox.com", "rails", d.PCIAddress))
		require.NoError(t, err, d.PCIAddress)
	}
	names, err := filepath.Glob(filepath.Join(dir, ".*"))
	require.NoError(t, err)
	require.Empty(t, names, "temporary files left")
}
