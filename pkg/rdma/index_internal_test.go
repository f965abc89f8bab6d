package rdma

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCharKind(t *testing.T) {
	for name, want := range map[string]string{
		"uverbs0": KindUverbs, "uverbs1023": KindUverbs, "umad7": KindUmad, "issm12": KindIssm,
		"uverbs": "", "umad": "", "rdma_cm": "", "uverbs1a": "", "xuverbs1": "", "1": "", "": "", "verbs3": "",
	} {
		kind, ok := CharKind(name)
		require.Equal(t, want != "", ok, name)
		require.Equal(t, want, kind, name)
	}
}

// staticAttrs answers every read with the same value, allocating nothing.
type staticAttrs []byte

func (a staticAttrs) Read(string) ([]byte, error)           { return a, nil }
func (a staticAttrs) ReadTo(string, []byte) ([]byte, error) { return a, nil }

// A function with one device, one port and its three char devices (a
// node scan's thousands of VFs) costs three allocations: the device with
// its port and char devices, their paths, and the name of the port's
// link_layer.
func TestDevicesFromOneDeviceAllocations(t *testing.T) {
	var dir Attrs = staticAttrs(LinkLayerInfiniBand)
	names, verbs, mad := []string{"mlx5_12"}, []string{"uverbs12"}, []string{"issm12", "umad12"}
	devs, err := devicesFrom(dir, names, verbs, mad)
	require.NoError(t, err)
	require.Equal(t, []Device{{
		Name:  "mlx5_12",
		Ports: []Port{{Number: 1, LinkLayer: LinkLayerInfiniBand}},
		CharDevices: []CharDevice{
			{Kind: KindUverbs, Name: "uverbs12", Path: "/dev/infiniband/uverbs12"},
			{Kind: KindUmad, Name: "umad12", Path: "/dev/infiniband/umad12", Port: 1},
			{Kind: KindIssm, Name: "issm12", Path: "/dev/infiniband/issm12", Port: 1},
		},
	}}, devs)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := devicesFrom(dir, names, verbs, mad); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 3.0)
}

func TestDevNodesHas(t *testing.T) {
	// In a listing's order, not sorted.
	names := []string{"uverbs7", "issm3", "umad10", "uverbs1234567890", "rdma_cm", "umad3", "uverbs01", "abi_versionx", "uverbs2",
		"uverbs65535", "umad65536", "issm70000", "uverbs130"}
	// Built in the memory of a set with more, and larger, numbers: none
	// of its bits stay.
	prev := newDevNodes([]string{"uverbs6", "umad11", "issm4", "uverbs129", "issm64", "umad4000"}, DevNodes{})
	nodes := newDevNodes(names, prev)
	for name, want := range map[string]bool{
		"uverbs2": true, "uverbs7": true, "umad3": true, "umad10": true, "issm3": true, "rdma_cm": true,
		"uverbs01": true, "uverbs1234567890": true, "abi_versionx": true,
		"uverbs1": false, "uverbs3": false, "umad2": false, "issm10": false, "umad1": false, "uverbs02": false,
		"uverbs123456789": false, "abi_version": false, "": false,
		"uverbs65535": true, "umad65536": true, "issm70000": true, "uverbs130": true,
		"uverbs65534": false, "umad65537": false, "issm69999": false, "uverbs131": false, "uverbs128": false,
		"uverbs6": false, "umad11": false, "issm4": false, "uverbs129": false, "issm64": false, "umad4000": false,
	} {
		require.Equal(t, want, nodes.Has(DevDir+"/"+name), name)
	}
	require.False(t, nodes.Has("uverbs2"), "a host path, not a name")
	require.Equal(t, len(names), nodes.Len())
	// Keys are distinct per kind and order as their numbers.
	a, _ := charKeyOf("umad9")
	b, _ := charKeyOf("umad10")
	c, _ := charKeyOf("issm9")
	require.Less(t, a, b)
	require.NotEqual(t, a, c)
}

// An index read again keeps its char devices while /dev/infiniband is
// unchanged, and follows it when entries come and go, and when the
// directory goes and comes back as it was.
func TestScanIndexNodes(t *testing.T) {
	root := t.TempDir()
	ib := filepath.Join(root, "dev", "infiniband")
	require.NoError(t, os.MkdirAll(ib, 0o755))
	touch := func(names ...string) {
		for _, n := range names {
			require.NoError(t, os.WriteFile(filepath.Join(ib, n), nil, 0o644))
		}
	}
	touch("uverbs0", "umad0", "issm0", "rdma_cm")
	r := NewReader(root)
	var idx ScanIndex
	check := func(step string, want ...string) {
		t.Helper()
		require.NoError(t, idx.Read(r, 2), step)
		nodes := idx.Nodes()
		require.Equal(t, len(want), nodes.Len(), step)
		for _, n := range want {
			require.True(t, nodes.Has(DevDir+"/"+n), "%s: %s", step, n)
		}
		for _, n := range []string{"uverbs0", "umad0", "issm0", "rdma_cm", "uverbs1"} {
			if !slices.Contains(want, n) {
				require.False(t, nodes.Has(DevDir+"/"+n), "%s: %s", step, n)
			}
		}
	}
	check("first", "uverbs0", "umad0", "issm0", "rdma_cm")
	check("unchanged", "uverbs0", "umad0", "issm0", "rdma_cm")
	require.NoError(t, os.Remove(filepath.Join(ib, "umad0")))
	check("umad0 removed", "uverbs0", "issm0", "rdma_cm")
	away := filepath.Join(root, "away")
	require.NoError(t, os.Rename(ib, away))
	check("/dev/infiniband gone")
	require.NoError(t, os.Rename(away, ib))
	check("back as it was", "uverbs0", "issm0", "rdma_cm")
	touch("uverbs1")
	check("uverbs1 added", "uverbs0", "issm0", "rdma_cm", "uverbs1")
	require.NoError(t, os.Remove(filepath.Join(ib, "rdma_cm")))
	check("rdma_cm removed", "uverbs0", "issm0", "uverbs1")
}

// BenchmarkDevNodes builds the char device set of a 1024-VF host's
// /dev/infiniband (its 3,097 names in a shuffled order, as a kernel lists
// them) in the memory of the last one, as a scan that finds it changed
// does, and asks for every VF's three char devices, as every scan's join
// does.
func BenchmarkDevNodes(b *testing.B) {
	var names, paths []string
	for i := range 1032 {
		for _, kind := range []string{KindUverbs, KindUmad, KindIssm} {
			names = append(names, kind+strconv.Itoa(i))
			paths = append(paths, DevDir+"/"+kind+strconv.Itoa(i))
		}
	}
	names = append(names, "rdma_cm")
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	b.Run("build", func(b *testing.B) {
		var n DevNodes
		for b.Loop() {
			n = newDevNodes(names, n)
		}
	})
	b.Run("has", func(b *testing.B) {
		n := newDevNodes(names, DevNodes{})
		for b.Loop() {
			for _, p := range paths {
				if !n.Has(p) {
					b.Fatal(p)
				}
			}
		}
	})
}
