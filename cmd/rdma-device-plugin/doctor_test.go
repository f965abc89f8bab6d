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
	// The DGX host before provisioning: every PF a pool would take VFs
	// from has none.
	out, _, code := runDoctorCmd(t, "--host-root", fixture("dgx-h100-novfs"), "--config", config("combined.json"))
	require.Equal(t, 2, code)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.True(t, strings.HasPrefix(lines[0], "STATUS"), lines[0])
	require.True(t, strings.HasPrefix(lines[1], "FAIL"), "failures first: %s", lines[1])
	require.Contains(t, out, "sriov_numvfs is 0 (of 16)")
	require.Contains(t, out, "→ echo N > /sys/bus/pci/devices/", "the fix beside the finding")
	require.Contains(t, out, "gpu-affinity")
	require.Regexp(t, `\n13 failed, 0 warnings, 1 skipped, \d+ ok$`, strings.TrimSpace(out))
}

// A fixture host (doctor.FixtureMarker at its top) has empty files for
// char devices, and neither kubelet nor CNI: doctor says so once. The same
// tree without the marker, as a copied /dev on a node would be, fails;
// a node missing under the fixture's /dev/infiniband fails too.
func TestDoctorFixtureHost(t *testing.T) {
	for _, tc := range []struct {
		name       string
		edit       func(t *testing.T, root string)
		wantCode   int
		wantStatus doctor.Status
		wantMsg    string
	}{
		{"as written", func(*testing.T, string) {}, 0, doctor.OK, "empty files of the fixture stand in for char devices"},
		{"no marker", func(t *testing.T, root string) {
			require.NoError(t, os.Remove(filepath.Join(root, doctor.FixtureMarker)))
		}, 2, doctor.Fail, "not char devices"},
		{"a node missing", func(t *testing.T, root string) {
			require.NoError(t, os.Remove(filepath.Join(root, "dev", "infiniband", "uverbs4")))
		}, 2, doctor.Fail, "uverbs4: in sysfs but missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			require.NoError(t, fixturepkg.Write(root, "roce-cx6dx"))
			require.FileExists(t, filepath.Join(root, fixturepkg.Marker), "the generator writes the marker doctor reads")
			require.Equal(t, doctor.FixtureMarker, fixturepkg.Marker)
			tc.edit(t, root)
			out, _, code := runDoctorCmd(t, "--host-root", root, "--config", config("sriov-dp.json"), "-o", "json")
			require.Equal(t, tc.wantCode, code, out)
			var r doctor.Report
			require.NoError(t, json.Unmarshal([]byte(out), &r), out)
			var got []doctor.Check
			for _, c := range r.Checks {
				if c.Name == "char-device" {
					got = append(got, c)
				}
				if tc.wantCode == 0 {
					require.NotContains(t, []string{"kubelet", "cni", "multus"}, c.Name, "no kubelet or CNI checks on a fixture unless named")
				}
			}
			require.Len(t, got, 1, out)
			require.Equal(t, tc.wantStatus, got[0].Status, out)
			require.Contains(t, got[0].Message, tc.wantMsg)
		})
	}
	// A kubelet directory given on a fixture is checked.
	out, _, code := runDoctorCmd(t, "--host-root", fixture("roce-cx6dx"), "--config", config("sriov-dp.json"), "--kubelet-dir", t.TempDir())
	require.Equal(t, 2, code)
	require.Regexp(t, `FAIL\s+kubelet\s+.*kubelet.sock does not exist`, out)
}

func TestDoctorJSON(t *testing.T) {
	out, _, code := runDoctorCmd(t, append([]string{"--host-root", fixture("roce-cx6dx"), "--config", "", "-o", "json"}, offline...)...)
	require.Equal(t, 0, code, "nothing wrong with the host: %s", out)
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
	// The node's / as the plugin's pod sees it: no fixture marker.
	require.NoError(t, os.Remove(filepath.Join(root, doctor.FixtureMarker)))
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

// TestDoctorBundledHosts runs doctor on every bundled fixture host with
// the config docs/troubleshooting.md gives it, and compares its exit
// status and findings (WARN and FAIL lines, by check) with that page's
// table: a host left out of the table, or a finding it does not list,
// fails.
func TestDoctorBundledHosts(t *testing.T) {
	repo := filepath.Join("..", "..")
	page, err := os.ReadFile(filepath.Join(repo, "docs", "troubleshooting.md"))
	require.NoError(t, err)
	type row struct {
		config   string
		exit     int
		findings map[string]int // "FAIL pool" -> how many
	}
	rows := map[string]row{}
	for _, l := range strings.Split(string(page), "\n") {
		if !strings.HasPrefix(l, "| `testdata/sysfs") {
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		require.GreaterOrEqual(t, len(cells), 4, l)
		for i := range cells {
			cells[i] = strings.Trim(strings.TrimSpace(cells[i]), "`")
		}
		exit, err := strconv.Atoi(cells[2])
		require.NoError(t, err, l)
		r := row{config: cells[1], exit: exit, findings: map[string]int{}}
		if cells[3] != "none" {
			for _, f := range strings.Split(cells[3], ", ") {
				n := 1
				if count, rest, ok := strings.Cut(f, "× "); ok {
					n, err = strconv.Atoi(count)
					require.NoError(t, err, l)
					f = rest
				}
				r.findings[f] += n
			}
		}
		rows[cells[0]] = r
	}
	var hosts []string
	for _, pattern := range []string{"testdata/sysfs/*", "testdata/sysfs-captured/*"} {
		m, err := filepath.Glob(filepath.Join(repo, pattern))
		require.NoError(t, err)
		for _, h := range m {
			if fi, err := os.Stat(h); err == nil && fi.IsDir() {
				rel, err := filepath.Rel(repo, h)
				require.NoError(t, err)
				hosts = append(hosts, filepath.ToSlash(rel))
			}
		}
	}
	require.GreaterOrEqual(t, len(hosts), 7, "bundled hosts: %v", hosts)
	for _, h := range hosts {
		t.Run(h, func(t *testing.T) {
			want, ok := rows[h]
			require.True(t, ok, "docs/troubleshooting.md's table of bundled hosts has no row for %s", h)
			// As the page says to run it: no flag but --host-root and --config.
			out, _, code := runDoctorCmd(t, "--host-root", filepath.Join(repo, h), "--config", filepath.Join(repo, want.config), "-o", "json")
			var r doctor.Report
			require.NoError(t, json.Unmarshal([]byte(out), &r), out)
			got := map[string]int{}
			for _, c := range r.Checks {
				if c.Status == doctor.Warn || c.Status == doctor.Fail {
					got[strings.ToUpper(string(c.Status))+" "+c.Name]++
				}
			}
			require.Equal(t, want.findings, got, "doctor's findings on %s differ from docs/troubleshooting.md's: %s", h, out)
			require.Equal(t, want.exit, code)
		})
	}
}
