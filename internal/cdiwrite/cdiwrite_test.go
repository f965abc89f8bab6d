package cdiwrite

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

func spec(kind string) *cdispec.Spec {
	return &cdispec.Spec{
		Version: "0.5.0",
		Kind:    kind,
		Devices: []cdispec.Device{{
			Name:           "0000:18:00.1",
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: []*cdispec.DeviceNode{{Path: "/dev/infiniband/uverbs2", Type: "c", Major: 231, Minor: 194}}},
		}},
	}
}

// A runtime reading the CDI directory through the library never sees the
// staging directory, even with a killed write's garbage in it, and sees a
// written spec whole; RemoveStaging then takes the garbage, not the spec.
func TestStagingUnseen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "cdi")
	w, err := New(dir, ".test-staging")
	require.NoError(t, err)
	staging := filepath.Join(dir, ".test-staging")
	require.NoError(t, os.MkdirAll(staging, 0o755))
	for _, name := range []string{"spec.1234.tmp", "example.com_rails.json"} {
		require.NoError(t, os.WriteFile(filepath.Join(staging, name), []byte(`{"cdiVersion": "0.5.0", "kind": "example.com/rails", "devi`), 0o600))
	}
	runtime, err := cdi.NewCache(cdi.WithSpecDirs(dir), cdi.WithAutoRefresh(false))
	require.NoError(t, err)
	require.Empty(t, runtime.GetErrors())
	require.Empty(t, runtime.ListDevices())

	require.NoError(t, w.Write(spec("example.com/rails"), "example.com_rails.json"))
	require.NoError(t, runtime.Refresh())
	require.Empty(t, runtime.GetErrors())
	require.Equal(t, []string{"example.com/rails=0000:18:00.1"}, runtime.ListDevices())
	left, err := os.ReadDir(staging)
	require.NoError(t, err)
	require.Len(t, left, 2, "the write left nothing of its own in staging")

	require.NoError(t, w.RemoveStaging())
	require.NoDirExists(t, staging)
	require.NoError(t, runtime.Refresh())
	require.Len(t, runtime.ListDevices(), 1)

	require.NoError(t, w.Remove("example.com_rails.json"))
	require.NoError(t, w.Remove("example.com_rails.json"), "a spec already gone")
	require.NoError(t, runtime.Refresh())
	require.Empty(t, runtime.ListDevices())
}

// A spec the library refuses never reaches the CDI directory.
func TestInvalidSpecNotWritten(t *testing.T) {
	dir := t.TempDir()
	w, err := New(dir, ".s")
	require.NoError(t, err)
	err = w.Write(spec("example.com/9rails"), "bad.json")
	require.ErrorContains(t, err, filepath.Join(dir, "bad.json"))
	require.NoFileExists(t, filepath.Join(dir, "bad.json"))
}

func TestStagingName(t *testing.T) {
	for _, s := range []string{"", "a/b", "../x"} {
		_, err := New(t.TempDir(), s)
		require.ErrorContains(t, err, "staging directory", s)
	}
}

// Write accepts and refuses what the CDI library's Cache.WriteSpec
// accepts and refuses, for every part of a spec fastpath writes; a
// refused spec is not written.
func TestValidateAsTheLibrary(t *testing.T) {
	node := func(mod func(*cdispec.DeviceNode)) func(*cdispec.Spec) {
		return func(s *cdispec.Spec) { mod(s.Devices[0].ContainerEdits.DeviceNodes[0]) }
	}
	for _, tc := range []struct {
		name string
		mod  func(*cdispec.Spec)
		ok   bool
	}{
		{"valid", func(*cdispec.Spec) {}, true},
		{"env on the spec and a device", func(s *cdispec.Spec) {
			s.ContainerEdits.Env = []string{"A=1", "B="}
			s.Devices[0].ContainerEdits.Env = []string{"NCCL_IB_HCA==mlx5_0:1"}
		}, true},
		{"a device with env only", func(s *cdispec.Spec) {
			s.Devices = append(s.Devices, cdispec.Device{Name: "x", ContainerEdits: cdispec.ContainerEdits{Env: []string{"X=1"}}})
		}, true},
		{"two devices", func(s *cdispec.Spec) {
			s.Devices = append(s.Devices, spec("example.com/rails").Devices[0])
			s.Devices[1].Name = "b"
		}, true},
		{"permissions none", node(func(n *cdispec.DeviceNode) { n.Permissions = "none" }), true},
		{"permissions rwm", node(func(n *cdispec.DeviceNode) { n.Permissions = "rwm" }), true},
		{"no version", func(s *cdispec.Spec) { s.Version = "" }, false},
		{"unknown version", func(s *cdispec.Spec) { s.Version = "0.9.9" }, false},
		{"version below what the spec uses", func(s *cdispec.Spec) {
			s.Version = "0.3.0"
			s.Devices[0].ContainerEdits.DeviceNodes[0].Permissions = "rw"
		}, false},
		{"bad vendor", func(s *cdispec.Spec) { s.Kind = "9example.com/rails" }, false},
		{"bad class", func(s *cdispec.Spec) { s.Kind = "example.com/ra ils" }, false},
		{"no class", func(s *cdispec.Spec) { s.Kind = "example.com" }, false},
		{"no devices", func(s *cdispec.Spec) { s.Devices = nil }, false},
		{"device twice", func(s *cdispec.Spec) { s.Devices = append(s.Devices, s.Devices[0]) }, false},
		{"bad device name", func(s *cdispec.Spec) { s.Devices[0].Name = "a/b" }, false},
		{"empty device name", func(s *cdispec.Spec) { s.Devices[0].Name = "" }, false},
		{"empty device edits", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits = cdispec.ContainerEdits{} }, false},
		{"env without =", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits.Env = []string{"A"} }, false},
		{"env with an empty name", func(s *cdispec.Spec) { s.ContainerEdits.Env = []string{"=1"} }, false},
		{"nil device node", func(s *cdispec.Spec) { s.Devices[0].ContainerEdits.DeviceNodes[0] = nil }, false},
		{"empty device path", node(func(n *cdispec.DeviceNode) { n.Path = "" }), false},
		{"bad node type", node(func(n *cdispec.DeviceNode) { n.Type = "x" }), false},
		{"negative major", node(func(n *cdispec.DeviceNode) { n.Major = -1 }), false},
		{"bad permissions", node(func(n *cdispec.DeviceNode) { n.Permissions = "rx" }), false},
		{"bad spec-level node", func(s *cdispec.Spec) { s.ContainerEdits.DeviceNodes = []*cdispec.DeviceNode{{}} }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec("example.com/rails")
			tc.mod(s)
			lib, err := cdi.NewCache(cdi.WithSpecDirs(t.TempDir()), cdi.WithAutoRefresh(false))
			require.NoError(t, err)
			libErr := lib.WriteSpec(s, "example.com_rails.json")
			require.Equal(t, tc.ok, libErr == nil, "the library: %v", libErr)

			dir := t.TempDir()
			w, err := New(dir, ".s")
			require.NoError(t, err)
			err = w.Write(s, "example.com_rails.json")
			if tc.ok {
				require.NoError(t, err)
				require.FileExists(t, filepath.Join(dir, "example.com_rails.json"))
				return
			}
			require.Error(t, err)
			require.NoFileExists(t, filepath.Join(dir, "example.com_rails.json"))
		})
	}
}

// Edits fastpath never writes are refused by name, not written unchecked.
func TestUnwrittenEditsRefused(t *testing.T) {
	for what, mod := range map[string]func(*cdispec.ContainerEdits){
		"hooks": func(e *cdispec.ContainerEdits) {
			e.Hooks = []*cdispec.Hook{{HookName: "createContainer", Path: "/bin/true"}}
		},
		"mounts":          func(e *cdispec.ContainerEdits) { e.Mounts = []*cdispec.Mount{{HostPath: "/a", ContainerPath: "/a"}} },
		"additional GIDs": func(e *cdispec.ContainerEdits) { e.AdditionalGIDs = []uint32{5} },
	} {
		s := spec("example.com/rails")
		s.Version = "0.7.0"
		mod(&s.Devices[0].ContainerEdits)
		dir := t.TempDir()
		w, err := New(dir, ".s")
		require.NoError(t, err)
		require.ErrorContains(t, w.Write(s, "x.json"), what+": not written by fastpath", what)
		require.NoFileExists(t, filepath.Join(dir, "x.json"))
	}
}

// What Write puts in place is what the library writes: the spec as JSON.
func TestWrittenAsTheLibrary(t *testing.T) {
	s := spec("example.com/rails")
	s.ContainerEdits.Env = []string{"A=1"}
	libDir := t.TempDir()
	lib, err := cdi.NewCache(cdi.WithSpecDirs(libDir), cdi.WithAutoRefresh(false))
	require.NoError(t, err)
	require.NoError(t, lib.WriteSpec(s, "example.com_rails.json"))
	dir := t.TempDir()
	w, err := New(dir, ".s")
	require.NoError(t, err)
	require.NoError(t, w.Write(s, "example.com_rails.json"))
	want, err := os.ReadFile(filepath.Join(libDir, "example.com_rails.json"))
	require.NoError(t, err)
	got, err := os.ReadFile(filepath.Join(dir, "example.com_rails.json"))
	require.NoError(t, err)
	require.Equal(t, string(want), string(got))
	entries, err := os.ReadDir(filepath.Join(dir, ".s"))
	require.NoError(t, err)
	require.Empty(t, entries, "nothing left in staging")
	require.ErrorContains(t, w.Write(s, "x.yaml"), "want a plain name ending in .json")
}

// BenchmarkWrite writes a 1024-VF pool's spec (each VF's uverbs, umad,
// issm and rdma_cm), as the device plugin does after registration.
func BenchmarkWrite(b *testing.B) {
	s := &cdispec.Spec{Version: "0.5.0", Kind: "mellanox.com/mlnx_sriov_rdma"}
	for i := range 1024 {
		var nodes []*cdispec.DeviceNode
		for _, p := range []string{"uverbs", "umad", "issm"} {
			path := fmt.Sprintf("/dev/infiniband/%s%d", p, i)
			nodes = append(nodes, &cdispec.DeviceNode{Path: path, HostPath: path, Permissions: "rw"})
		}
		nodes = append(nodes, &cdispec.DeviceNode{Path: "/dev/infiniband/rdma_cm", HostPath: "/dev/infiniband/rdma_cm", Permissions: "rw"})
		s.Devices = append(s.Devices, cdispec.Device{Name: fmt.Sprintf("0000:%02x:%02x.%d", 0x10+i/128, (i%128)/8, i%8), ContainerEdits: cdispec.ContainerEdits{DeviceNodes: nodes}})
	}
	w, err := New(b.TempDir(), ".s")
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if err := w.Write(s, "mellanox.com_rails.json"); err != nil {
			b.Fatal(err)
		}
	}
}
