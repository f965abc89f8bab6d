package plugin

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
)

// TestProvisioningSeesStateTheStoreWrites: provisioning (cmd/rdma-device-plugin
// provision) counts a VF as in use when cnistate.Attached finds its state
// file; what the Store writes must be found, with its container and
// network, in the dir provisioning reads by default.
func TestProvisioningSeesStateTheStoreWrites(t *testing.T) {
	require.Equal(t, cnistate.DefaultDir, DefaultStateDir, "provisioning's --cni-state-dir default is the CNI's stateDir")

	s := newStore(t)
	st := validState("0000:18:00.1")
	st.ContainerID, st.Network = "0123456789abcdef", "default/ib-rail0"
	require.NoError(t, s.Save(st))
	adding := validState("0000:18:00.2")
	adding.Phase = PhaseAdding
	require.NoError(t, s.Save(adding))

	held, err := cnistate.Attached(s.dir)
	require.NoError(t, err)
	require.Equal(t, map[string]string{
		"0000:18:00.1": "CNI attachment of container 0123456789ab (network default/ib-rail0)",
		"0000:18:00.2": "CNI attachment of container c1 (network net)",
	}, held)

	got, err := s.Load("0000:18:00.1")
	require.NoError(t, err)
	require.Equal(t, st, got)
}

// TestUninstallKnowsTheStoreFiles: an uninstall removes the files the
// Store writes beside its state files (cnistate.Leftover), and nothing of
// upstream sriov-cni's in the same directory.
func TestUninstallKnowsTheStoreFiles(t *testing.T) {
	s := newStore(t)
	for _, p := range []string{s.lockPath("0000:18:00.1"), s.netnsPath("0000:18:00.1"), s.path("0000:18:00.1") + ".bad",
		s.attachLockPath("default/net", "c1", "net1"), s.tombstonePath("default/net", "c1", "net1"),
		s.pendingPath("default/net", "c1", "net1")} {
		require.True(t, cnistate.Leftover(filepath.Base(p)), p)
	}
	require.False(t, cnistate.Leftover(filepath.Base(s.upstreamPath("c1", "net1"))))
	require.False(t, cnistate.Leftover(filepath.Base(s.path("0000:18:00.1"))), "a state file is an attachment")
}
