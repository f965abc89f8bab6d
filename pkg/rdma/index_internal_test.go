package rdma

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCharKind(t *testing.T) {
	for name, want := range map[string]string{
		"uverbs0": KindUverbs, "uverbs1023": KindUverbs, "umad7": KindUmad, "issm12": KindIssm,
		"uverbs": "", "umad": "", "rdma_cm": "", "uverbs1a": "", "xuverbs1": "", "1": "", "": "", "verbs3": "",
	} {
		kind, ok := charKind(name)
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
