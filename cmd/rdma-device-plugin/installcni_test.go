package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// The DaemonSet's init container's command line (deployments/20-daemonset.yaml).
func TestRunInstallCNI(t *testing.T) {
	dir, src := t.TempDir(), filepath.Join(t.TempDir(), "sriov")
	require.NoError(t, os.WriteFile(src, []byte("new"), 0o755))
	var stdout, stderr bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"install-cni", "--from", src, "--to", dir}, &stdout, &stderr))
	got, err := os.ReadFile(filepath.Join(dir, "sriov"))
	require.NoError(t, err)
	require.Equal(t, "new", string(got))
	require.Contains(t, stderr.String(), "install-cni: installed")
	require.Empty(t, stdout.String())

	err = run(context.Background(), []string{"install-cni", "--from", src}, &stdout, &stderr)
	require.ErrorContains(t, err, "--to is required")
}
