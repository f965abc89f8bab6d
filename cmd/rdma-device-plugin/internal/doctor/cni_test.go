package doctor

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
)

var (
	sriovOnce sync.Once
	sriovBin  string
	sriovErr  error
)

// buildSRIOV builds fastpath's CNI once, as the Makefile and the image do,
// with version v0.0.1-test and revision abc123 stamped, into dir/sriov.
func buildSRIOV(t *testing.T, dir string) {
	t.Helper()
	sriovOnce.Do(func() {
		d, err := os.MkdirTemp("", "doctor-sriov-")
		if err != nil {
			sriovErr = err
			return
		}
		sharedMu.Lock()
		shared["sriov"] = d // removed by TestMain
		sharedMu.Unlock()
		sriovBin = filepath.Join(d, "sriov")
		out, err := exec.Command("go", "build", "-buildvcs=false", "-o", sriovBin,
			"-ldflags", "-X "+versionPkg+".Version=v0.0.1-test -X "+versionPkg+".Revision=abc123", CNIPath).CombinedOutput()
		if err != nil {
			sriovErr = fmt.Errorf("go build %s: %v\n%s", CNIPath, err, out)
		}
	})
	require.NoError(t, sriovErr)
	require.NoError(t, os.Symlink(sriovBin, filepath.Join(dir, "sriov")))
}

func TestCNIBinary(t *testing.T) {
	root := newHost(t, "generate")
	run := func(dir string, b Build) *Report { return Run(Options{HostRoot: root, CNIBinDir: dir, Build: b}) }
	if testing.Short() {
		t.Skip("builds cmd/sriov-cni")
	}
	ours := t.TempDir()
	buildSRIOV(t, ours)

	t.Run("this build's", func(t *testing.T) {
		r := run(ours, Build{Version: "v0.0.1-test", Revision: "abc123"})
		requireCheck(t, r, "cni", OK, "fastpath's sriov (revision abc123)", "0.3.1, 0.4.0, 1.0.0, 1.1.0")
	})
	t.Run("another build's", func(t *testing.T) {
		requireCheck(t, run(ours, Build{Version: "v0.0.2", Revision: "def456"}), "cni", Warn, "revision abc123", "revision def456", "rollout restart")
	})
	t.Run("missing", func(t *testing.T) {
		requireCheck(t, run(t.TempDir(), Build{}), "cni", Fail, "failed to find plugin \"sriov\"", "init container")
	})
	t.Run("no such directory", func(t *testing.T) {
		requireCheck(t, run(filepath.Join(t.TempDir(), "x"), Build{}), "cni", Skip, "--cni-bin-dir")
	})
	t.Run("not executable", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "sriov"), []byte("#!/bin/sh\n"), 0o644))
		requireCheck(t, run(dir, Build{}), "cni", Fail, "not executable", "chmod 0755")
	})
	t.Run("not a Go binary", func(t *testing.T) {
		dir := t.TempDir()
		require.NoError(t, os.WriteFile(filepath.Join(dir, "sriov"), []byte("#!/bin/sh\necho '{}'\n"), 0o755))
		requireCheck(t, run(dir, Build{}), "cni", Fail, "not fastpath's sriov")
	})
	t.Run("another project's plugin under our name", func(t *testing.T) {
		dir := testbin.Build(t, testbin.HostLocal+"=sriov")
		requireCheck(t, run(dir, Build{}), "cni", Fail, "github.com/containernetworking/plugins/plugins/ipam/host-local, not fastpath's sriov")
	})
}

// TestCNIVersionsMatchTheCNI holds CNIVersions to what cmd/sriov-cni
// answers.
func TestCNIVersionsMatchTheCNI(t *testing.T) {
	if testing.Short() {
		t.Skip("builds cmd/sriov-cni")
	}
	dir := t.TempDir()
	buildSRIOV(t, dir)
	bin := filepath.Join(dir, "sriov")
	got, err := versionAnswer(bin)
	require.NoError(t, err)
	require.Equal(t, CNIVersions, got)
	path, b, err := binaryBuild(bin)
	require.NoError(t, err)
	require.Equal(t, CNIPath, path)
	require.Equal(t, Build{Version: "v0.0.1-test", Revision: "abc123"}, b)
}

func TestMultus(t *testing.T) {
	root := newHost(t, "generate")
	write := func(dir, name, content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644))
	}
	run := func(dir string) *Report { return Run(Options{HostRoot: root, CNIConfDir: dir}) }
	multus := `{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus-shim","logLevel":"verbose"}`
	bridge := `{"cniVersion":"1.0.0","name":"cbr0","plugins":[{"type":"bridge"},{"type":"portmap"}]}`

	t.Run("thick Multus first", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "00-multus.conf", multus)
		write(dir, "10-bridge.conflist", bridge)
		requireCheck(t, run(dir), "multus", OK, "00-multus.conf", "multus-shim")
	})
	t.Run("thin Multus in a conflist", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "00-multus.conflist", `{"cniVersion":"1.0.0","name":"m","plugins":[{"type":"multus","kubeconfig":"/etc/cni/net.d/multus.d/multus.kubeconfig"}]}`)
		requireCheck(t, run(dir), "multus", OK, "(multus)")
	})
	t.Run("Multus not first", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "10-flannel.conflist", bridge)
		write(dir, "99-multus.conf", multus)
		requireCheck(t, run(dir), "multus", Fail, "99-multus.conf", "10-flannel.conflist", "00-multus.conf")
	})
	t.Run("no Multus", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "10-bridge.conflist", bridge)
		write(dir, "README", "not a config")
		requireCheck(t, run(dir), "multus", Fail, "no Multus config", "bridge", "NET/Socket")
	})
	t.Run("empty", func(t *testing.T) {
		requireCheck(t, run(t.TempDir()), "multus", Fail, "no network config at all")
	})
	t.Run("unparsable first config", func(t *testing.T) {
		dir := t.TempDir()
		write(dir, "00-broken.conf", "{")
		requireCheck(t, run(dir), "multus", Fail, "00-broken.conf", "does not parse")
	})
	t.Run("not mounted", func(t *testing.T) {
		requireCheck(t, run(filepath.Join(t.TempDir(), "net.d")), "multus", Skip, "--cni-conf-dir")
	})
}
