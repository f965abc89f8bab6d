package plugin

import (
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// The paths the plugin writes, reads and dials are the node's
// (NodeConfig), not a NetworkAttachmentDefinition's, which a namespace
// admin writes (issue 44, findings 1-3). Each hostile conf here is
// refused, or its field ignored, with nothing on the node changed.

// snapshot is a directory tree: each entry's path, its mode and its
// content (a symlink's target).
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			v += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		out[path] = v
		return nil
	}))
	return out
}

// hostileDir is a directory anyone may write, as a pod's emptyDir is on
// the host, with what a tenant plants in it: a forged state and a
// .netns link of the VF, a file to be replaced.
func hostileDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.Chmod(dir, 0o777))
	require.NoError(t, os.WriteFile(filepath.Join(dir, vfioVF+".json"), []byte(`{"version":2,"phase":"added","pciAddress":"`+vfioVF+`"}`), 0o666))
	require.NoError(t, os.Symlink("/proc/self/ns/net", filepath.Join(dir, vfioVF+".netns")))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "victim"), []byte("the node's own file"), 0o644))
	return dir
}

// requireUntouched checks that a refused command changed nothing: the
// hostile dir as it was, no state dir made, the VF as it was, no address,
// no device-info file.
func (u *unit) requireUntouched(dir string, before map[string]string) {
	u.t.Helper()
	require.Equal(u.t, before, snapshot(u.t, dir), "nothing changed in %s", dir)
	_, err := os.Lstat(u.stateDir)
	require.ErrorIs(u.t, err, fs.ErrNotExist, "no state dir made")
	u.requireClean()
}

// Finding 1: a conf's stateDir, podResourcesSocket or draSocket other
// than the node's is refused, before anything changes; the node's own
// value, however spelt, is accepted.
func TestNodePathsFromConfRefused(t *testing.T) {
	for _, tc := range []struct{ name, key, value, want string }{
		{"stateDir in an emptyDir", "stateDir", "HOSTILE", `the state directory is the node's, not a network's: this node's is "STATE"`},
		{"podResourcesSocket", "podResourcesSocket", "HOSTILE/kubelet.sock", `the kubelet's PodResources socket is the node's, not a network's: this node's is "` + DefaultPodResourcesSocket + `"`},
		{"draSocket", "draSocket", "HOSTILE/cni.sock", `draSocket "HOSTILE/cni.sock": the DRA driver's socket is the node's, not a network's: this node's is none`},
		{"relative stateDir", "stateDir", "state", `stateDir "state": the state directory is the node's`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			u.p.nodeFile = "/etc/cni/net.d/fastpath.d/sriov.json"
			dir := hostileDir(t)
			before := snapshot(t, dir)
			value := strings.ReplaceAll(tc.value, "HOSTILE", dir)
			conf := u.conf(`"` + tc.key + `":"` + value + `"`)
			_, err := u.add(conf, "c1")
			want := strings.ReplaceAll(strings.ReplaceAll(tc.want, "HOSTILE", dir), "STATE", u.stateDir)
			require.ErrorContains(t, err, want)
			require.ErrorContains(t, err, `which the node's admin sets in /etc/cni/net.d/fastpath.d/sriov.json (key "`+tc.key+`")`)
			require.Equal(t, types.ErrInvalidNetworkConfig, CNIError(err).Code)
			u.requireUntouched(dir, before)

			for name, cmd := range map[string]func(string) error{
				"CHECK":  func(c string) error { return u.p.Check(u.args(c, "c1")) },
				"STATUS": func(c string) error { return u.p.Status(u.args(c, "")) },
				"GC":     func(c string) error { return u.p.GC(u.args(c, "")) },
			} {
				err := cmd(conf)
				require.ErrorContains(t, err, want, name)
				require.Equal(t, types.ErrInvalidNetworkConfig, CNIError(err).Code, name)
			}
			// DEL never fails forever: it goes on with the node's paths,
			// where this conf attached nothing, and reads nothing planted.
			require.NoError(t, u.del(conf, "c1"))
			require.Contains(t, u.log.String(), "DEL of a conf that names the node's paths; they are ignored")
			require.Equal(t, before, snapshot(t, dir))
			require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0))
		})
	}
}

// A conf that spells the node's own paths, as networks written before
// they were the node's do, keeps working: equal after filepath.Clean.
func TestNodePathsFromConfEqualAccepted(t *testing.T) {
	u := newUnit(t)
	sock := filepath.Join(t.TempDir(), "cni.sock")
	u.p.Node.DRASocket = sock
	conf := u.conf(`"podResourcesSocket":"` + DefaultPodResourcesSocket + `","draSocket":"` + sock + `"`)
	conf = strings.Replace(conf, `"stateDir":"`+u.stateDir+`"`, `"stateDir":"`+u.stateDir+`/./"`, 1)
	require.Contains(t, conf, u.stateDir+`/./`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
}

// Finding 1, the state dir itself: one that is a symlink, not the
// plugin's user's or that others can write is refused, whoever named it:
// a node admin who pointed stateDir at a shared directory gets an error,
// not a planted state acted on.
func TestStateDirRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, dir string) string
		want  string
	}{
		{"world-writable", func(t *testing.T, dir string) string {
			return dir
		}, "mode 0777 lets group or others write it"},
		{"symlink", func(t *testing.T, dir string) string {
			link := filepath.Join(t.TempDir(), "state")
			require.NoError(t, os.Chmod(dir, 0o700))
			require.NoError(t, os.Symlink(dir, link))
			return link
		}, "is a symlink, which is not followed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			dir := hostileDir(t)
			u.p.Node.StateDir = tc.setup(t, dir)
			before := snapshot(t, dir)
			conf := `{"cniVersion":"1.1.0","name":"rdma-net","type":"sriov","deviceID":"` + vfioVF + `"}`
			_, err := u.add(conf, "c1")
			require.ErrorContains(t, err, "state dir "+u.p.Node.StateDir)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, u.del(conf, "c1"), tc.want)
			require.ErrorContains(t, u.p.Status(u.args(conf, "")), tc.want)
			require.Equal(t, before, snapshot(t, dir))
			require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0))
		})
	}
}

func TestStateDirOtherOwnerRefused(t *testing.T) {
	testnet.RequireRoot(t, "chowns a directory to another user")
	dir := filepath.Join(t.TempDir(), "state")
	require.NoError(t, os.Mkdir(dir, 0o700))
	require.NoError(t, os.Chown(dir, 65534, 65534))
	_, err := NewStore(dir, nil)
	require.ErrorContains(t, err, "state dir "+dir+" refused: owned by uid 65534, not by uid 0")
}

// A missing state dir is made 0700, only once a conf passed.
func TestStateDirMade0700(t *testing.T) {
	u := newUnit(t)
	_, err := u.add(u.conf(""), "c1")
	require.NoError(t, err)
	fi, err := os.Lstat(u.stateDir)
	require.NoError(t, err)
	require.Equal(t, fs.ModeDir|0o700, fi.Mode())
	require.NoError(t, u.del(u.conf(""), "c1"))
}

// Finding 2: runtimeConfig.CNIDeviceInfoFile outside the node's
// device-info directory, or through a symlink below it, refuses the ADD
// before anything changes.
func TestDeviceInfoFileOutsideRefused(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(t *testing.T, u *unit, dir string) string
		want  string
	}{
		{"a node file", func(t *testing.T, u *unit, dir string) string {
			return filepath.Join(dir, "victim")
		}, "not inside the node's device-info directory"},
		{"/etc", func(t *testing.T, u *unit, dir string) string {
			// Where a regression would write it: removed after the test.
			t.Cleanup(func() { _ = os.Remove("/etc/fastpath-test-must-not-exist") })
			return "/etc/fastpath-test-must-not-exist"
		}, "not inside the node's device-info directory"},
		{"dot-dot out of the dir", func(t *testing.T, u *unit, dir string) string {
			return u.devinfoDir + "/cni/../../" + filepath.Base(u.devinfoDir) + "x/victim"
		}, "not inside the node's device-info directory"},
		{"a linked component", func(t *testing.T, u *unit, dir string) string {
			require.NoError(t, os.MkdirAll(u.devinfoDir, 0o755))
			require.NoError(t, os.Symlink(dir, filepath.Join(u.devinfoDir, "cni")))
			return filepath.Join(u.devinfoDir, "cni", "victim")
		}, "cni: a symlink or a non-directory on the way, which is not followed"},
		{"a linked component deeper", func(t *testing.T, u *unit, dir string) string {
			require.NoError(t, os.MkdirAll(filepath.Join(u.devinfoDir, "cni"), 0o755))
			require.NoError(t, os.Symlink(dir, filepath.Join(u.devinfoDir, "cni", "sub")))
			return filepath.Join(u.devinfoDir, "cni", "sub", "new.json")
		}, "sub: a symlink or a non-directory on the way"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			dir := hostileDir(t)
			path := tc.setup(t, u, dir)
			before := snapshot(t, dir)
			devBefore := snapshot(t, filepath.Dir(u.devinfoDir))
			conf := strings.Replace(u.conf(""), filepath.Join(u.devinfoDir, "c1-net1.json"), path, 1)
			require.Contains(t, conf, path)
			_, err := u.add(conf, "c1")
			require.ErrorContains(t, err, `runtimeConfig.CNIDeviceInfoFile "`+path+`": `)
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, types.ErrInvalidNetworkConfig, CNIError(err).Code)
			require.Equal(t, before, snapshot(t, dir))
			require.Equal(t, devBefore, snapshot(t, filepath.Dir(u.devinfoDir)))
			_, err = os.Lstat(u.stateDir)
			require.ErrorIs(t, err, fs.ErrNotExist, "no state dir made")
			require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0))
			require.Empty(t, u.leases())
			_, err = os.Lstat("/etc/fastpath-test-must-not-exist")
			require.ErrorIs(t, err, fs.ErrNotExist)
			require.NoError(t, u.del(conf, "c1"), "DEL of a refused ADD")
			require.Equal(t, before, snapshot(t, dir))
		})
	}
}

// A link planted below the device-info dir after ADD's check is still
// not followed when the file is written, and a state naming a file
// outside the dir, or reached through a link, removes nothing.
func TestDeviceInfoWriteAndRemoveFollowNoLink(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	devDir, victim := t.TempDir(), t.TempDir()
	require.NoError(t, os.Symlink(victim, filepath.Join(devDir, "cni")))
	err := writeDeviceInfo(devDir, filepath.Join(devDir, "cni", "x.json"), devinfo.NewPCI(vfioVF, "", ""))
	require.ErrorIs(t, err, errLinkBelow)
	require.Empty(t, ls(t, victim))

	// A file naming the VF, reached through the link, or outside the dir.
	require.NoError(t, devinfo.Write(filepath.Join(victim, "x.json"), devinfo.NewPCI(vfioVF, "", ""), 0o444))
	require.NoError(t, removeDeviceInfo(log, devDir, filepath.Join(devDir, "cni", "x.json"), vfioVF))
	require.NoError(t, removeDeviceInfo(log, devDir, filepath.Join(victim, "x.json"), vfioVF))
	require.Equal(t, []string{"x.json"}, ls(t, victim), "nothing removed")

	// Inside the dir: written, missing directories made, removed.
	require.NoError(t, os.Remove(filepath.Join(devDir, "cni")))
	path := filepath.Join(devDir, "cni", "a", "y.json")
	require.NoError(t, writeDeviceInfo(devDir, path, devinfo.NewPCI(vfioVF, "", "")))
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), fi.Mode())
	require.NoError(t, removeDeviceInfo(log, devDir, path, vfioVF))
	require.Empty(t, ls(t, filepath.Join(devDir, "cni", "a")))
}

// Finding 3: a logFile outside the node's LogDir, or through a link
// below it, or in a directory that is not there, is ignored with a
// warning on stderr: nothing is created or appended, no directory made;
// and a refused ADD makes no state dir.
func TestLogFileOutsideLogDirIgnored(t *testing.T) {
	for _, tc := range []struct {
		name   string
		logDir func(t *testing.T, dir string) string
		file   func(t *testing.T, logDir, dir string) string
		want   string
	}{
		{"no logDir", func(t *testing.T, dir string) string { return "" },
			func(t *testing.T, _, dir string) string { return filepath.Join(dir, "sriov.log") },
			"the node's config has no logDir"},
		{"outside logDir", func(t *testing.T, dir string) string { return t.TempDir() },
			func(t *testing.T, _, dir string) string { return filepath.Join(dir, "victim") },
			"not in the node's logDir"},
		{"through a linked dir", func(t *testing.T, dir string) string { return t.TempDir() },
			func(t *testing.T, logDir, dir string) string {
				require.NoError(t, os.Symlink(dir, filepath.Join(logDir, "sub")))
				return filepath.Join(logDir, "sub", "victim")
			}, "sub: a symlink or a non-directory on the way"},
		{"a linked file", func(t *testing.T, dir string) string { return t.TempDir() },
			func(t *testing.T, logDir, dir string) string {
				require.NoError(t, os.Symlink(filepath.Join(dir, "victim"), filepath.Join(logDir, "sriov.log")))
				return filepath.Join(logDir, "sriov.log")
			}, "a symlink or a non-directory on the way"},
		{"a missing dir", func(t *testing.T, dir string) string { return t.TempDir() },
			func(t *testing.T, logDir, dir string) string { return filepath.Join(logDir, "new", "sriov.log") },
			"no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			dir := hostileDir(t)
			u.p.Node.LogDir = tc.logDir(t, dir)
			logFile := tc.file(t, u.p.Node.LogDir, dir)
			before := snapshot(t, dir)
			var logBefore map[string]string
			if u.p.Node.LogDir != "" {
				logBefore = snapshot(t, u.p.Node.LogDir)
			}
			// Refused after the logger is set up: CNI_IFNAME is bad.
			a := u.args(u.conf(`"logFile":"`+logFile+`"`), "c1")
			a.IfName = "../eth0"
			err := u.p.Add(a)
			require.Equal(t, types.ErrInvalidEnvironmentVariables, CNIError(err).Code, "%v", err)
			require.Contains(t, u.log.String(), "logFile ignored; logging to stderr")
			require.Contains(t, u.log.String(), tc.want)
			u.requireUntouched(dir, before)
			require.NoError(t, u.p.Del(a), "the runtime's DEL of the refused ADD")
			require.Equal(t, before, snapshot(t, dir))
			if logBefore != nil {
				require.Equal(t, logBefore, snapshot(t, u.p.Node.LogDir))
			}
			// A successful ADD and its DEL log to stderr.
			u.log.Reset()
			conf := u.conf(`"logFile":"` + logFile + `"`)
			_, err = u.add(conf, "c1")
			require.NoError(t, err)
			require.NoError(t, u.del(conf, "c1"))
			require.Contains(t, u.log.String(), "msg=attached")
			require.Equal(t, before, snapshot(t, dir))
			if logBefore != nil {
				require.Equal(t, logBefore, snapshot(t, u.p.Node.LogDir))
			}
		})
	}
}

// A logFile in the node's LogDir or below it is written there.
func TestLogFileInLogDir(t *testing.T) {
	u := newUnit(t)
	u.p.Node.LogDir = t.TempDir()
	require.NoError(t, os.Mkdir(filepath.Join(u.p.Node.LogDir, "net"), 0o755))
	logFile := filepath.Join(u.p.Node.LogDir, "net", "sriov.log")
	conf := u.conf(`"logFile":"` + logFile + `"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	b, err := os.ReadFile(logFile)
	require.NoError(t, err)
	require.Contains(t, string(b), "msg=attached")
	fi, err := os.Stat(logFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode())
	require.NoError(t, u.del(conf, "c1"))
}
