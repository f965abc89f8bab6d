package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The uninstall DaemonSet's command line (deployments/uninstall/): the
// node's paths under --host-root, the report where the pod's status
// shows it, exit status 1 while a pod is attached.
func TestRunUninstall(t *testing.T) {
	root := t.TempDir()
	bin := filepath.Join(root, "opt", "cni", "bin")
	state := filepath.Join(root, "var", "lib", "cni", "sriov")
	devinfo := filepath.Join(root, "var", "run", "k8s.cni.cncf.io", "devinfo", "dp")
	for _, d := range []string{bin, state, devinfo} {
		require.NoError(t, os.MkdirAll(d, 0o700))
	}
	upstream := []byte("#!/bin/sh\necho '{\"cniVersion\":\"1.0.0\"}'\n")
	require.NoError(t, os.WriteFile(filepath.Join(bin, "sriov.pre-fastpath"), upstream, 0o755))
	self, err := os.Executable()
	require.NoError(t, err)
	fastpath, err := os.ReadFile(self)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(bin, "sriov"), fastpath, 0o755))
	devinfoFile := filepath.Join(devinfo, "mellanox.com-mlnx_sriov_rdma-0000:18:00.2-device.json")
	require.NoError(t, os.WriteFile(devinfoFile, []byte("{}"), 0o444))
	attachment := filepath.Join(state, "0000:18:00.2.json")
	require.NoError(t, os.WriteFile(attachment, []byte(`{"network":"default/sriov-rdma","containerID":"c1"}`), 0o600))
	report := filepath.Join(t.TempDir(), "termination-log")
	args := []string{"uninstall", "--host-root", root, "--config", filepath.Join("..", "..", "testdata", "config", "combined.json"),
		"--pod-resources-socket", "", "--report", report}

	var stdout, stderr bytes.Buffer
	err = run(context.Background(), args, &stdout, &stderr)
	require.ErrorContains(t, err, "pods still hold fastpath's VFs: 0000:18:00.2: CNI attachment of container c1 (network default/sriov-rdma)")
	require.Contains(t, stdout.String(), "not done: delete the pods named above")
	got, err := os.ReadFile(report)
	require.NoError(t, err)
	require.Equal(t, stdout.String(), string(got))
	require.FileExists(t, devinfoFile, "kept while a pod is attached")

	require.NoError(t, os.Remove(attachment))
	stdout.Reset()
	require.NoError(t, run(context.Background(), args, &stdout, &stderr))
	require.Equal(t, "sriov CNI: the binary fastpath replaced is back\n2 files and directories of fastpath's removed\nthis node is as before fastpath\n", stdout.String())
	got, err = os.ReadFile(filepath.Join(bin, "sriov"))
	require.NoError(t, err)
	require.Equal(t, upstream, got)
	require.NoFileExists(t, devinfoFile)
	require.NoDirExists(t, state, "the CNI's state directory, empty")
	require.Contains(t, stderr.String(), "uninstall: the sriov CNI binary fastpath replaced is back")

	require.ErrorContains(t, run(context.Background(), []string{"uninstall", "extra"}, &stdout, &stderr), `uninstall: unexpected argument "extra"`)
}
