package fromnic_test

// The floor pass over the VFs of a scanned host (they moved here from
// internal/testsupport/floor with fromnic, which package floor may not import).

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor/fromnic"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// generated is a 2x4-VF host and its VFs as a floor pass reads them.
func generated(t *testing.T) (string, []floor.VF) {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 2, 4))
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	vfs, err := fromnic.VFs(snap)
	require.NoError(t, err)
	require.Len(t, vfs, 8)
	return root, vfs
}

func TestPassReadsEveryEntry(t *testing.T) {
	root, vfs := generated(t)
	ops := floor.Ops(vfs)
	require.Len(t, ops, 8*len(vfs))
	p, err := floor.Open(root)
	require.NoError(t, err)
	defer p.Close()
	for _, threads := range []int{0, 1, runtime.GOMAXPROCS(0), 3 * len(ops)} {
		require.NoError(t, p.Run(ops, threads), "threads=%d", threads)
	}

	// An entry the pass reads that is not there is an error naming it,
	// from whichever part of the split it falls in.
	last := vfs[len(vfs)-1]
	require.NoError(t, os.Remove(filepath.Join(root, "sys/class/infiniband_mad", last.Umad)))
	err = p.Run(ops, 2)
	require.ErrorContains(t, err, "readlink class/infiniband_mad/"+last.Umad)
}

func TestListingsListEveryDirectory(t *testing.T) {
	root, _ := generated(t)
	ops := floor.Listings()
	require.Len(t, ops, 5)
	p, err := floor.Open(root)
	require.NoError(t, err)
	defer p.Close()
	for _, threads := range []int{0, 1, 2, 10} {
		require.NoError(t, p.Run(ops, threads), "threads=%d", threads)
	}

	// A directory gone since Open is an error naming it.
	require.NoError(t, os.RemoveAll(filepath.Join(root, "sys/class/infiniband_verbs")))
	err = p.Run(ops, 2)
	require.ErrorContains(t, err, "list class/infiniband_verbs")
}

func TestOpenNamesAMissingDirectory(t *testing.T) {
	root, _ := generated(t)
	require.NoError(t, os.RemoveAll(filepath.Join(root, "sys/class/infiniband_verbs")))
	_, err := floor.Open(root)
	require.ErrorContains(t, err, "class/infiniband_verbs")
}

func TestWriteRead(t *testing.T) {
	_, vfs := generated(t)
	var buf bytes.Buffer
	require.NoError(t, floor.Write(&buf, vfs))
	got, err := floor.Read(&buf)
	require.NoError(t, err)
	require.Equal(t, vfs, got)

	for _, bad := range []string{
		"0000:01:00.2 0000:01:00.0 0 eth0 mlx5_1 uverbs1 umad1\n",    // a field short
		"0000:01:00.2 0000:01:00.0 -1 eth0 mlx5_1 uverbs1 umad1 1\n", // negative index
		"0000:01:00.2 0000:01:00.0 0 eth0 mlx5_1 uverbs1 umad1 0\n",  // port 0
		"0000:01:00.2 0000:01:00.0 x eth0 mlx5_1 uverbs1 umad1 1\n",
	} {
		_, err := floor.Read(bytes.NewBufferString(bad))
		require.ErrorContains(t, err, "line 1", "%q", bad)
	}
}

func TestVFsNameTheVFThatLacksAPiece(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 1, 2))
	require.NoError(t, fixture.UnloadModule(root, "ib_umad"))
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	_, err = fromnic.VFs(snap)
	require.ErrorContains(t, err, "missing a piece")
}
