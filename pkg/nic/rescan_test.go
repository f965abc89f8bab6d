package nic_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// A Scanner's rescans reuse the last scan's memory: each one must find
// what a new Scanner finds, however the host changed in between, and must
// leave the snapshots it returned before as they were.
func TestRescanAfterChanges(t *testing.T) {
	host := t.TempDir()
	require.NoError(t, fixture.Generate(host, 4, 8))
	sc := nic.NewScanner(host)
	type kept struct {
		snap *nic.Snapshot
		json []byte
	}
	var snaps []kept
	rescan := func(step string) *nic.Snapshot {
		t.Helper()
		got, err := sc.Scan()
		require.NoError(t, err, step)
		want, err := nic.NewScanner(host).Scan()
		require.NoError(t, err, step)
		require.Equal(t, want, got, step)
		b, err := json.Marshal(got)
		require.NoError(t, err)
		snaps = append(snaps, kept{got, b})
		return got
	}
	first := rescan("first")
	rescan("unchanged")
	rescan("unchanged again")

	vf := first.Devices[3]
	require.True(t, vf.IsVF())
	require.NotEmpty(t, vf.Netdev)
	// The VF's netdev renamed (udev): its class link and its directory.
	renamed := vf.Netdev + "x"
	classNet := filepath.Join(host, "sys", "class", "net")
	target, err := os.Readlink(filepath.Join(classNet, vf.Netdev))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(classNet, vf.Netdev)))
	require.NoError(t, os.Symlink(filepath.Join(filepath.Dir(target), renamed), filepath.Join(classNet, renamed)))
	devDir, err := filepath.EvalSymlinks(filepath.Join(host, "sys", "bus", "pci", "devices", vf.PCIAddress))
	require.NoError(t, err)
	require.NoError(t, os.Rename(filepath.Join(devDir, "net", vf.Netdev), filepath.Join(devDir, "net", renamed)))
	snap := rescan("netdev renamed")
	d, ok := snap.Device(vf.PCIAddress)
	require.True(t, ok)
	require.Equal(t, renamed, d.Netdev)

	// One of its char devices gone and back; then /dev/infiniband gone
	// (the RDMA modules unloaded) and back with the same names.
	require.NotEmpty(t, d.CharDevices)
	node := filepath.Join(host, d.CharDevices[0].Path)
	away := filepath.Join(host, "away")
	require.NoError(t, os.Rename(node, away))
	rescan("a char device gone")
	require.NoError(t, os.Rename(away, node))
	rescan("the char device back")
	ib := filepath.Join(host, "dev", "infiniband")
	require.NoError(t, os.Rename(ib, away))
	rescan("/dev/infiniband gone")
	require.NoError(t, os.Rename(away, ib))
	rescan("/dev/infiniband back as it was")

	require.NoError(t, fixture.DisableVFs(host, first.Devices[0].PCIAddress))
	rescan("VFs of the first PF disabled")
	require.NoError(t, fixture.UnloadModule(host, "ib_umad"))
	rescan("ib_umad unloaded")
	require.NoError(t, fixture.EmptyDevDir(host))
	rescan("/dev/infiniband emptied")
	rescan("unchanged after the changes")

	// Another host at the same root.
	require.NoError(t, os.RemoveAll(host))
	require.NoError(t, fixture.Generate(host, 2, 16))
	rescan("another host")
	rescan("another host, unchanged")

	for i, k := range snaps {
		b, err := json.Marshal(k.snap)
		require.NoError(t, err)
		require.JSONEq(t, string(k.json), string(b), "snapshot %d changed by a later scan", i)
	}
}

// Scans on one Scanner may run at once (a reload beside a status
// request): each has its own memory.
func TestConcurrentScans(t *testing.T) {
	host := t.TempDir()
	require.NoError(t, fixture.Generate(host, 4, 8))
	sc := nic.NewScanner(host)
	want, err := sc.Scan()
	require.NoError(t, err)
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 5 {
				got, err := sc.Scan()
				if !assert.NoError(t, err) || !assert.Equal(t, want, got) {
					return
				}
			}
		})
	}
	wg.Wait()
}
