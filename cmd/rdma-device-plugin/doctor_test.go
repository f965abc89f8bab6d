package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/doctor"
	fixturepkg "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
)

// runDoctorCmd runs `rdma-device-plugin doctor args…` and returns stdout,
// stderr and the exit status main would use.
func runDoctorCmd(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	var out, errs bytes.Buffer
	err := run(context.Background(), append([]string{"doctor"}, args...), &out, &errs)
	code := 0
	if err != nil {
		var ec *exitError
		require.True(t, errors.As(err, &ec), "doctor returned %v", err)
		code = ec.ExitCode()
		if ec.Error() != "" {
			errs.WriteString(ec.Error())
		}
	}
	return out.String(), errs.String(), code
}

// offline skips what the fixture host has no part of: this machine's
// kubelet and CNI directories.
var offline = []string{"--kubelet-dir", "", "--cni-bin-dir", "", "--cni-conf-dir", ""}

func TestDoctorTable(t *testing.T) {
	// The committed fixture's /dev/infiniband entries are plain files
	// (git cannot hold device nodes): doctor says so, and fails.
	out, _, code := runDoctorCmd(t, append([]string{"--host-root", fixture("dgx-h100"), "--config", config("combined.json")}, offline...)...)
	require.Equal(t, 2, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.True(t, strings.HasPrefix(lines[0], "STATUS"), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "FAIL"), "failures first: %s", lines[1])
	require.Contains(t, lines[1], "not char devices")
	require.Contains(t, lines[1], "→ mount the node's devtmpfs", "the fix beside the finding")
	require.Contains(t, out, "gpu-affinity")
	require.Regexp(t, `\n1 failed, 0 warnings, 0 skipped, \d+ ok$`, strings.TrimSpace(out))
}

func TestDoctorJSON(t *testing.T) {
	out, _, code := runDoctorCmd(t, append([]string{"--host-root", fixture("roce-cx6dx"), "--config", "", "-o", "json"}, offline...)...)
	require.Equal(t, 2, code)
	var v struct {
		Checks []map[string]any `json:"checks"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &v))
	require.NotEmpty(t, v.Checks)
	for _, c := range v.Checks {
		for _, k := range []string{"name", "status", "subject", "message", "fix"} {
			require.Contains(t, c, k)
		}
		require.Contains(t, []any{"ok", "warn", "fail", "skip"}, c["status"])
	}
}

func TestDoctorConfigDefaultAndErrors(t *testing.T) {
	host := fixture("edge")
	// A config given explicitly that does not exist is a failure; the
	// default one missing means "no config".
	out, _, _ := runDoctorCmd(t, append([]string{"--host-root", host, "--config", filepath.Join(t.TempDir(), "nope.json")}, offline...)...)
	require.Contains(t, out, "pool config file does not exist")
	bad := filepath.Join(t.TempDir(), "bad.json")
	require.NoError(t, os.WriteFile(bad, []byte(`{"resourceList":[{"resourceName":"x","selectors":{"drivers":["mlx5_ib"]}}]}`), 0o644))
	out, _, code := runDoctorCmd(t, append([]string{"--host-root", host, "--config", bad}, offline...)...)
	require.Equal(t, 2, code)
	require.Regexp(t, `FAIL\s+config\s+.*bad\.json.*mlx5_ib`, out)

	for _, args := range [][]string{{"-o", "yaml"}, {"--pod", "-1"}, {"extra"}, {"--no-such-flag"}} {
		_, errs, code := runDoctorCmd(t, args...)
		require.Equal(t, 2, code, "%v", args)
		require.NotEmpty(t, errs, "%v says why", args)
	}
	_, errs, code := runDoctorCmd(t, "-h")
	require.Equal(t, 0, code)
	require.Contains(t, errs, "Exit status: 0 all ok, 1 warnings only, 2 any failure")
}

func TestDoctorHostRootFromEnv(t *testing.T) {
	// The plugin's container has the node's /sys and /dev under
	// FASTPATH_HOST_ROOT: kubectl exec … doctor needs no flag.
	t.Setenv("FASTPATH_HOST_ROOT", fixture("edge"))
	out, _, _ := runDoctorCmd(t, append([]string{"--config", "", "-o", "json"}, offline...)...)
	require.Contains(t, out, filepath.Join(fixture("edge"), "sys", "module", "ib_core", "parameters", "netns_mode"))
}

func TestDoctorCNIBinDirFromEnv(t *testing.T) {
	// The node's CNI bin_dir is under FASTPATH_HOST_ROOT as well: in the
	// plugin's pod doctor checks the installed sriov there, no flag given.
	root := t.TempDir()
	require.NoError(t, fixturepkg.Write(root, "edge"))
	t.Setenv("FASTPATH_HOST_ROOT", root)
	bin := filepath.Join(root, "opt", "cni", "bin")
	require.NoError(t, os.MkdirAll(bin, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(bin, "sriov"), []byte("#!/bin/sh\n"), 0o755))
	out, _, _ := runDoctorCmd(t, "--config", "", "--kubelet-dir", "", "--cni-conf-dir", "", "-o", "json")
	var r doctor.Report
	require.NoError(t, json.Unmarshal([]byte(out), &r), out)
	i := slices.IndexFunc(r.Checks, func(c doctor.Check) bool { return c.Name == "cni" })
	require.GreaterOrEqual(t, i, 0, out)
	// Found and read: a script is not fastpath's sriov.
	require.Equal(t, doctor.Fail, r.Checks[i].Status, out)
	require.Equal(t, filepath.Join(bin, "sriov"), r.Checks[i].Subject)
	require.Contains(t, r.Checks[i].Message, "not fastpath's sriov")
}

// TestDoctorUnprivileged runs the real binary as nobody: what it may not
// read (the kubelet's directory, another user's process, a root-only log)
// is a skip that says so, not a failure.
func TestDoctorUnprivileged(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("drops to nobody with setpriv: run as root (CI does)")
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("no setpriv (util-linux)")
	}
	// A world-readable directory for the binary and the fixture host.
	open, err := os.MkdirTemp("", "doctor-unpriv-")
	require.NoError(t, err)
	t.Cleanup(func() { os.RemoveAll(open) })
	require.NoError(t, os.Chmod(open, 0o755))
	built := filepath.Join(testbin.Build(t, "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin"), "rdma-device-plugin")
	bin := filepath.Join(open, "rdma-device-plugin")
	b, err := os.ReadFile(built)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(bin, b, 0o755))
	host := filepath.Join(open, "host")
	require.NoError(t, fixturepkg.Write(host, "edge"))

	private := t.TempDir() // 0700, root's
	kdir := filepath.Join(private, "device-plugins")
	require.NoError(t, os.MkdirAll(kdir, 0o755))
	logPath := filepath.Join(private, "train.log")
	require.NoError(t, os.WriteFile(logPath, []byte("NCCL INFO Using network IB\n"), 0o600))

	cmd := exec.Command(setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", bin, "doctor", "--host-root", host,
		"--config", "", "--kubelet-dir", kdir, "--cni-bin-dir", "", "--cni-conf-dir", "",
		"--pod", strconv.Itoa(os.Getpid()), "--nccl-log", logPath, "-o", "json")
	out, _ := cmd.Output()
	var v struct {
		Checks []struct{ Name, Status, Message string } `json:"checks"`
	}
	require.NoError(t, json.Unmarshal(out, &v), "%s", out)
	seen := map[string]bool{}
	for _, c := range v.Checks {
		switch c.Name {
		case "kubelet", "pod", "nccl-log":
			require.Equal(t, "skip", c.Status, "%s: %s", c.Name, c.Message)
			require.Contains(t, c.Message, "permission denied")
			seen[c.Name] = true
		}
	}
	require.Equal(t, map[string]bool{"kubelet": true, "pod": true, "nccl-log": true}, seen)
	require.Contains(t, string(out), `"name": "kernel-module"`, "what sysfs shows is checked unprivileged")
}
