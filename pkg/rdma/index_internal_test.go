package rdma

import (
	"slices"
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
	names := []string{"issm3", "rdma_cm", "umad3", "umad10", "uverbs01", "uverbs1234567890", "uverbs2", "uverbs7"}
	slices.Sort(names)
	nodes := newDevNodes(names, nil)
	for name, want := range map[string]bool{
		"uverbs2": true, "uverbs7": true, "umad3": true, "umad10": true, "issm3": true, "rdma_cm": true,
		"uverbs01": true, "uverbs1234567890": true,
		"uverbs1": false, "uverbs3": false, "umad2": false, "issm10": false, "umad1": false, "uverbs02": false,
		"uverbs123456789": false, "abi_version": false, "": false,
	} {
		require.Equal(t, want, nodes.Has(DevDir+"/"+name), name)
	}
	require.False(t, nodes.Has("uverbs2"), "a host path, not a name")
	require.Equal(t, len(names), nodes.Len())
	// Keys are distinct per kind and order as their numbers.
	a, _ := charKey("umad9")
	b, _ := charKey("umad10")
	c, _ := charKey("issm9")
	require.Less(t, a, b)
	require.NotEqual(t, a, c)
}
