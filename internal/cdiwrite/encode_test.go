package cdiwrite

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// appendSpec writes what json.Marshal writes, for every field it may see.
func TestAppendSpecIsJSONMarshal(t *testing.T) {
	mode := os.FileMode(0o660)
	uid, gid := uint32(0), uint32(4294967295)
	for _, s := range []*cdispec.Spec{
		{Version: "0.5.0", Kind: "example.com/rails"},
		{Version: "0.5.0", Kind: "example.com/rails", Devices: []cdispec.Device{}},
		spec("example.com/rails"),
		{Version: "1.1.0", Kind: "example.com/x", ContainerEdits: cdispec.ContainerEdits{Env: []string{"A=1", "B="}, DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/x"}}},
			Devices: []cdispec.Device{
				{Name: "a", ContainerEdits: cdispec.ContainerEdits{Env: []string{`Q="<&>"\`, "U=ünï\u2028\x01", "BAD=\xff\xfe"}}},
				{Name: "b", ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{
					{Path: "/dev/infiniband/uverbs0", HostPath: "/host/dev/infiniband/uverbs0", Type: "c", Major: 231, Minor: 192, FileMode: &mode, Permissions: "rw", UID: &uid, GID: &gid},
					{Path: "/dev/a b\t", Major: -1, Minor: 1 << 40},
				}}},
			}},
	} {
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendSpec(nil, s)))
	}

	// And for specs made of random strings from an alphabet with every
	// kind of character json treats apart.
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []string{"a", "Z", "0", "/", ":", ".", "-", "_", "=", " ", `"`, `\`, "<", ">", "&", "\n", "\x00", "\x7f", "é", "\u2028", "\u2029", "\xff", "😀"}
	str := func() string {
		var b strings.Builder
		for range r.IntN(12) {
			b.WriteString(alphabet[r.IntN(len(alphabet))])
		}
		return b.String()
	}
	for range 500 {
		s := &cdispec.Spec{Version: str(), Kind: str()}
		for range r.IntN(4) {
			d := cdispec.Device{Name: str()}
			for range r.IntN(3) {
				d.ContainerEdits.Env = append(d.ContainerEdits.Env, str())
			}
			for range r.IntN(3) {
				n := &cdispec.DeviceNode{Path: str(), HostPath: str(), Type: str(), Permissions: str(), Major: r.Int64N(600) - 300, Minor: r.Int64N(3)}
				if r.IntN(2) == 0 {
					m := os.FileMode(r.Uint32())
					n.FileMode = &m
				}
				if r.IntN(2) == 0 {
					u := r.Uint32()
					n.UID, n.GID = &u, &u
				}
				d.ContainerEdits.DeviceNodes = append(d.ContainerEdits.DeviceNodes, n)
			}
			s.Devices = append(s.Devices, d)
		}
		want, err := json.Marshal(s)
		require.NoError(t, err)
		require.Equal(t, string(want), string(appendSpec(nil, s)))
	}
}
