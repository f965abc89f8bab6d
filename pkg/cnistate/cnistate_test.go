package cnistate_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
)

func TestVFOf(t *testing.T) {
	for name, want := range map[string]string{
		"0000:18:00.1.json":     "0000:18:00.1",
		"0000:18:00.1.lock":     "",
		"0000:18:00.1.json.bad": "",
		"ipam-abc.pending":      "",
		"eth0.json":             "",
	} {
		vf, ok := cnistate.VFOf(name)
		require.Equal(t, want != "", ok, name)
		if ok {
			require.Equal(t, want, vf, name)
			require.Equal(t, name, cnistate.FileName(vf))
		}
	}
}

func TestAttached(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600))
	}
	write("0000:18:00.1.json", `{"version":2,"phase":"added","network":"default/ib-rail0","containerID":"0123456789abcdef","ifName":"net1","pciAddress":"0000:18:00.1"}`)
	write("0000:18:00.2.json", `{"network":`) // torn: still held
	write("0000:18:00.2.lock", "")
	write("0000:18:00.3.json.bad", "{}")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "0000:18:00.4.json"), 0o700))
	require.NoError(t, os.Symlink("0000:18:00.1.json", filepath.Join(dir, "0000:18:00.5.json")))

	held, err := cnistate.Attached(dir)
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"0000:18:00.1": "CNI attachment of container 0123456789ab (network default/ib-rail0)",
		"0000:18:00.2": "CNI attachment of container - (network -)",
	}, held)

	held, err = cnistate.Attached(filepath.Join(dir, "none"))
	require.NoError(t, err, "no state dir: no CNI ran here yet")
	require.Empty(t, held)
}

func TestDecodeUpgradesVersion1(t *testing.T) {
	st, err := cnistate.Decode("0000:18:00.1", []byte(`{"version":1,"phase":"adding","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1","hostName":"eth1","rdmaDevice":"mlx5_2","ipamType":"host-local"}`))
	require.NoError(t, err)
	require.Equal(t, cnistate.Version, st.Version)
	require.True(t, st.LinkMoved)
	require.True(t, st.RDMAMoved)
	require.True(t, st.IPAMAdded)

	for name, data := range map[string]string{
		"newer major":  `{"version":3,"phase":"added","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1"}`,
		"other VF":     `{"version":2,"phase":"added","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.2"}`,
		"not JSON":     `{`,
		"bad ifName":   `{"version":2,"phase":"added","network":"n","containerID":"c","ifName":"../x","pciAddress":"0000:18:00.1"}`,
		"no container": `{"version":2,"phase":"added","network":"n","ifName":"net1","pciAddress":"0000:18:00.1"}`,
	} {
		_, err := cnistate.Decode("0000:18:00.1", []byte(data))
		require.Error(t, err, name)
	}
}

func TestLeftover(t *testing.T) {
	key := "0123456789abcdef01234567"
	for name, want := range map[string]bool{
		"0000:18:00.1.lock":               true,
		"0000:18:00.1.netns":              true,
		"0000:18:00.1.json.bad":           true,
		"attach-" + key + ".lock":         true,
		"deleted-" + key + ".json":        true,
		"ipam-" + key + ".pending":        true,
		"deleting-" + key:                 true,
		"deleting-" + key + ".x":          false,
		".0000:18:00.1.json.tmp-123":      true,
		".deleted-" + key + ".json.tmp-9": true,
		"0000:18:00.1.json":               false, // an attachment: not a leftover
		"3f2a9c-net1":                     false, // upstream sriov-cni's cache
		"deleted-abc.json":                false,
		"ipam-" + key + ".pending.old":    false,
		"eth0.lock":                       false,
		".3f2a9c-net1.tmp-1":              false,
	} {
		require.Equal(t, want, cnistate.Leftover(name), name)
	}
}
