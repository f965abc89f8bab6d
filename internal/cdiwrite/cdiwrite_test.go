package cdiwrite

import (
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
	require.NoFileExists(t, filepath.Join(staging, "example.com_rails.json"))

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
