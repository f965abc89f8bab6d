package installcni_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/installcni"
)

// The test binary stands for an older fastpath CNI: it is a Go binary of
// fastpath's module, and answers CNI_COMMAND=VERSION as the CNI does
// (without running the tests again).
const fastpathAnswer = `{"cniVersion":"1.1.0","supportedVersions":["1.1.0"],"fastpath":"test"}`

func TestMain(m *testing.M) {
	if os.Getenv("CNI_COMMAND") == "VERSION" {
		fmt.Println(fastpathAnswer)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

const upstreamAnswer = `{"cniVersion":"1.0.0","supportedVersions":["0.3.1","1.0.0"]}`

// upstream is a stand-in for upstream sriov-cni: not a Go binary of
// fastpath's module, answers VERSION.
var upstream = []byte("#!/bin/sh\necho '" + upstreamAnswer + "'\n")

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func TestInstall(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	oldFastpath, err := os.ReadFile(self)
	require.NoError(t, err)
	newBin := []byte("\x7fELF the new sriov")

	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) // what the bin_dir has before
		// want
		prev       []byte // the replaced binary; nil: none
		fastpath   bool
		cniVersion string
		backup     []byte // sriov.pre-fastpath afterwards; nil: none
		madeBackup bool
		keptBackup bool
		unchanged  bool
	}{
		{name: "an empty bin_dir"},
		{
			name:  "upstream sriov-cni: kept as sriov.pre-fastpath",
			setup: func(t *testing.T, dir string) { writeFile(t, dir, "sriov", upstream) },
			prev:  upstream, cniVersion: upstreamAnswer, backup: upstream, madeBackup: true,
		},
		{
			name: "an earlier backup is never overwritten",
			setup: func(t *testing.T, dir string) {
				writeFile(t, dir, "sriov", upstream)
				writeFile(t, dir, "sriov.pre-fastpath", []byte("the original"))
			},
			prev: upstream, cniVersion: upstreamAnswer, backup: []byte("the original"), keptBackup: true,
		},
		{
			name:  "an older fastpath: replaced, no backup",
			setup: func(t *testing.T, dir string) { writeFile(t, dir, "sriov", oldFastpath) },
			prev:  oldFastpath, fastpath: true, cniVersion: fastpathAnswer,
		},
		{
			name:  "the same binary: left as it is",
			setup: func(t *testing.T, dir string) { writeFile(t, dir, "sriov", newBin) },
			prev:  newBin, cniVersion: "no answer: fork/exec", unchanged: true,
		},
		{
			name: "a stale temporary file that links elsewhere",
			setup: func(t *testing.T, dir string) {
				outside := filepath.Join(t.TempDir(), "victim")
				writeFile(t, filepath.Dir(outside), "victim", []byte("not yours"))
				require.NoError(t, os.Symlink(outside, filepath.Join(dir, ".sriov.fastpath-tmp")))
				t.Cleanup(func() {
					got, err := os.ReadFile(outside)
					require.NoError(t, err)
					require.Equal(t, "not yours", string(got), "the link's target")
				})
			},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, src := t.TempDir(), filepath.Join(t.TempDir(), "sriov")
			require.NoError(t, os.WriteFile(src, newBin, 0o755))
			if tc.setup != nil {
				tc.setup(t, dir)
			}
			var logs bytes.Buffer
			res, err := installcni.Install(context.Background(), src, dir, slog.New(slog.NewTextHandler(&logs, nil)))
			require.NoError(t, err)

			got, err := os.ReadFile(filepath.Join(dir, "sriov"))
			require.NoError(t, err)
			require.Equal(t, newBin, got)
			st, err := os.Stat(filepath.Join(dir, "sriov"))
			require.NoError(t, err)
			require.Equal(t, os.FileMode(0o755), st.Mode().Perm())
			_, err = os.Lstat(filepath.Join(dir, ".sriov.fastpath-tmp"))
			require.ErrorIs(t, err, os.ErrNotExist, "no temporary file left")

			require.Equal(t, tc.unchanged, res.Unchanged)
			if tc.prev == nil {
				require.Nil(t, res.Previous)
			} else {
				require.NotNil(t, res.Previous)
				require.Equal(t, int64(len(tc.prev)), res.Previous.Size)
				require.Equal(t, sum(tc.prev), res.Previous.SHA256)
				require.Equal(t, tc.fastpath, res.Previous.Fastpath())
				require.Contains(t, res.Previous.CNIVersion, tc.cniVersion)
				require.Contains(t, logs.String(), "sha256="+sum(tc.prev), "the log says what was replaced")
			}
			backup, err := os.ReadFile(filepath.Join(dir, "sriov.pre-fastpath"))
			if tc.backup == nil {
				require.ErrorIs(t, err, os.ErrNotExist)
			} else {
				require.NoError(t, err)
				require.Equal(t, tc.backup, backup)
			}
			require.Equal(t, tc.madeBackup, res.Backup != "")
			require.Equal(t, tc.keptBackup, res.BackupKept)
			entries, err := os.ReadDir(dir)
			require.NoError(t, err)
			want := map[bool]int{true: 2, false: 1}[tc.backup != nil]
			require.Len(t, entries, want, "only sriov (and its backup) in the bin_dir: %v", entries)
		})
	}
}

// What is not a regular file named sriov in a directory reached without a
// link is refused, and left as it was.
func TestInstallRefuses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string // returns the dir to install into
		err   string
	}{
		{
			name: "sriov is a symbolic link",
			setup: func(t *testing.T, dir string) string {
				writeFile(t, dir, "multus", []byte("multus"))
				require.NoError(t, os.Symlink("multus", filepath.Join(dir, "sriov")))
				return dir
			},
			err: "is a symbolic link (to \"multus\")",
		},
		{
			name: "sriov is a directory",
			setup: func(t *testing.T, dir string) string {
				require.NoError(t, os.Mkdir(filepath.Join(dir, "sriov"), 0o755))
				return dir
			},
			err: "is not a regular file",
		},
		{
			name: "the bin_dir is a symbolic link",
			setup: func(t *testing.T, dir string) string {
				link := filepath.Join(t.TempDir(), "bin")
				require.NoError(t, os.Symlink(dir, link))
				return link
			},
			err: "open the directory",
		},
		{
			name:  "the bin_dir is missing",
			setup: func(t *testing.T, dir string) string { return filepath.Join(dir, "nope") },
			err:   "must exist",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir, src := t.TempDir(), filepath.Join(t.TempDir(), "sriov")
			require.NoError(t, os.WriteFile(src, []byte("new"), 0o755))
			target := tc.setup(t, dir)
			before := listing(t, dir)
			_, err := installcni.Install(context.Background(), src, target, slog.New(slog.DiscardHandler))
			require.ErrorContains(t, err, tc.err)
			require.Equal(t, before, listing(t, dir), "nothing changed")
			if got, err := os.ReadFile(filepath.Join(dir, "multus")); err == nil {
				require.Equal(t, "multus", string(got))
			}
		})
	}
}

func writeFile(t *testing.T, dir, name string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), data, 0o755))
}

func listing(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	var out []string
	for _, e := range entries {
		out = append(out, e.Name()+":"+e.Type().String())
	}
	return out
}

// Restore undoes Install: the upstream binary it kept comes back byte for
// byte, fastpath's alone is removed, and a sriov someone put there since
// is left.
func TestRestore(t *testing.T) {
	self, err := os.Executable()
	require.NoError(t, err)
	fastpath, err := os.ReadFile(self)
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		before func(t *testing.T, dir string) // the bin_dir before the install
		after  func(t *testing.T, dir string) // after the install, before Restore
		what   string
		sriov  []byte // afterwards; nil: none
		files  []string
	}{
		{name: "upstream kept: put back", before: func(t *testing.T, dir string) { writeFile(t, dir, "sriov", upstream) },
			what: "upstream", sriov: upstream, files: []string{"sriov:----------"}},
		{name: "none before: fastpath's removed", what: "removed"},
		{name: "replaced since the install: left, with the backup",
			before: func(t *testing.T, dir string) { writeFile(t, dir, "sriov", upstream) },
			after:  func(t *testing.T, dir string) { writeFile(t, dir, "sriov", []byte("#!/bin/sh\nexit 1\n")) },
			what:   "left", sriov: []byte("#!/bin/sh\nexit 1\n"), files: []string{"sriov:----------", "sriov.pre-fastpath:----------"}},
		{name: "uninstalled twice: nothing", after: func(t *testing.T, dir string) { require.NoError(t, os.Remove(filepath.Join(dir, "sriov"))) },
			what: "none"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.before != nil {
				tc.before(t, dir)
			}
			_, err := installcni.Install(context.Background(), self, dir, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			got, err := os.ReadFile(filepath.Join(dir, "sriov"))
			require.NoError(t, err)
			require.Equal(t, sum(fastpath), sum(got), "fastpath's is installed")
			if tc.after != nil {
				tc.after(t, dir)
			}
			var logs bytes.Buffer
			res, err := installcni.Restore(context.Background(), dir, slog.New(slog.NewTextHandler(&logs, nil)))
			require.NoError(t, err)
			require.Equal(t, tc.what, res.What)
			require.Equal(t, tc.files, listing(t, dir))
			if tc.sriov != nil {
				got, err := os.ReadFile(filepath.Join(dir, "sriov"))
				require.NoError(t, err)
				require.Equal(t, tc.sriov, got)
				require.Equal(t, sum(tc.sriov), res.Now.SHA256)
			}
			require.Contains(t, logs.String(), "uninstall: ")
		})
	}
}

// A backup that is not a regular file is not fastpath's: Restore refuses.
func TestRestoreRefusesOddBackup(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.Symlink("/bin/true", filepath.Join(dir, "sriov.pre-fastpath")))
	_, err := installcni.Restore(context.Background(), dir, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "not a regular file")
}
