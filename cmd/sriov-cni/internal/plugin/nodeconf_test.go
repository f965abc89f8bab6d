package plugin

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

func TestLoadNodeConfig(t *testing.T) {
	def := DefaultNodeConfig()
	for _, tc := range []struct {
		name, data string
		mode       os.FileMode
		want       *NodeConfig
		err        string
	}{
		{name: "every key", mode: 0o644, data: `{"stateDir":"/run/fastpath/state","logDir":"/var/log/fastpath","podResourcesSocket":"/run/kubelet/pr.sock",
			"draSocket":"","deviceInfoDir":"/run/devinfo","deviceIDCheck":"off"}`,
			want: &NodeConfig{StateDir: "/run/fastpath/state", LogDir: "/var/log/fastpath", PodResourcesSocket: "/run/kubelet/pr.sock",
				DeviceInfoDir: "/run/devinfo", DeviceIDCheck: DeviceIDCheckOff}},
		{name: "missing keys take defaults", mode: 0o600, data: `{"stateDir":"/run/fastpath/state"}`,
			want: &NodeConfig{StateDir: "/run/fastpath/state", PodResourcesSocket: def.PodResourcesSocket, DRASocket: def.DRASocket,
				DeviceInfoDir: def.DeviceInfoDir, DeviceIDCheck: def.DeviceIDCheck}},
		{name: "empty object", mode: 0o644, data: `{}`, want: &def},
		{name: "unknown key", mode: 0o644, data: `{"stateDir":"/run/s","cniDir":"/tmp"}`, err: `unknown field "cniDir"`},
		{name: "relative path", mode: 0o644, data: `{"stateDir":"state"}`, err: `stateDir "state": want an absolute path`},
		{name: "unclean path", mode: 0o644, data: `{"logDir":"/var/log/../tmp"}`, err: `logDir "/var/log/../tmp": want an absolute path without . or ..`},
		{name: "empty state dir", mode: 0o644, data: `{"stateDir":""}`, err: "stateDir is empty"},
		{name: "unknown check", mode: 0o644, data: `{"deviceIDCheck":"maybe"}`, err: `deviceIDCheck "maybe": want "podresources" or "off"`},
		{name: "not JSON", mode: 0o644, data: `stateDir=/run`, err: "parse:"},
		{name: "two objects", mode: 0o644, data: `{} {}`, err: "data after the JSON object"},
		{name: "too large", mode: 0o644, data: `{"stateDir":"/` + strings.Repeat("a", maxNodeConfigSize) + `"}`, err: "larger than 65536 bytes"},
		{name: "world-writable", mode: 0o666, data: `{}`, err: "mode 0666 lets group or others write it"},
		{name: "group-writable", mode: 0o620, data: `{}`, err: "mode 0620 lets group or others write it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sriov.json")
			require.NoError(t, os.WriteFile(path, []byte(tc.data), 0o600))
			require.NoError(t, os.Chmod(path, tc.mode))
			n, err := loadNodeConfig(path, true)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, "node config "+path+": ", "the error names the file")
				require.Equal(t, types.ErrPluginNotAvailable, CNIError(err).Code)
				return
			}
			require.NoError(t, err)
			require.Equal(t, *tc.want, n)
		})
	}
}

func TestLoadNodeConfigFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	require.NoError(t, os.WriteFile(good, []byte(`{"stateDir":"/run/s"}`), 0o644))

	n, err := loadNodeConfig(filepath.Join(dir, "absent.json"), false)
	require.NoError(t, err, "no file at the default path")
	require.Equal(t, DefaultNodeConfig(), n)

	_, err = loadNodeConfig(filepath.Join(dir, "absent.json"), true)
	require.ErrorContains(t, err, "FASTPATH_CNI_NODE_CONFIG names it, but it does not exist")

	link := filepath.Join(dir, "link.json")
	require.NoError(t, os.Symlink(good, link))
	_, err = loadNodeConfig(link, false)
	require.ErrorContains(t, err, "node config "+link+": a symlink, which is not followed")

	_, err = loadNodeConfig(dir, false)
	require.ErrorContains(t, err, "not a regular file")

	env := map[string]string{NodeConfigEnv: good}
	n, file, err := LoadNodeConfig(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, good, file)
	require.Equal(t, "/run/s", n.StateDir)
}

func TestLoadNodeConfigOwner(t *testing.T) {
	testnet.RequireRoot(t, "chowns a file to another user")
	path := filepath.Join(t.TempDir(), "sriov.json")
	require.NoError(t, os.WriteFile(path, []byte(`{}`), 0o644))
	require.NoError(t, os.Chown(path, 65534, 65534))
	_, err := loadNodeConfig(path, false)
	require.ErrorContains(t, err, "owned by uid 65534, not by uid 0 (root, the user the plugin runs as): chown it to root")
}

// A node config that cannot be loaded fails every command with its
// error, before the conf is read or anything on the node changes; DEL
// too, so that the runtime retries it until the admin fixes the file
// rather than drop an attachment whose state it cannot find.
func TestBadNodeConfigFailsEveryCommand(t *testing.T) {
	u := newUnit(t)
	path := filepath.Join(t.TempDir(), "sriov.json")
	require.NoError(t, os.WriteFile(path, []byte(`{"stateDir":"relative"}`), 0o644))
	var err error
	u.p.Node, err = loadNodeConfig(path, true)
	u.p.nodeErr, u.p.nodeFile = err, path
	require.Error(t, err)
	conf := u.conf("")
	for name, cmd := range map[string]func(*skel.CmdArgs) error{
		"ADD": u.p.Add, "DEL": u.p.Del, "CHECK": u.p.Check, "STATUS": u.p.Status, "GC": u.p.GC,
	} {
		err := cmd(u.args(conf, "c1"))
		require.ErrorContains(t, err, "node config "+path+`: stateDir "relative": want an absolute path`, name)
		require.Equal(t, types.ErrPluginNotAvailable, CNIError(err).Code, name)
	}
	u.requireClean()
	_, err = os.Lstat(u.stateDir)
	require.ErrorIs(t, err, os.ErrNotExist, "no state dir made")

	// A Plugin built without a node config is refused the same way.
	p := &Plugin{Stderr: &u.log}
	err = p.Add(u.args(conf, "c1"))
	require.ErrorContains(t, err, "node config "+DefaultNodeConfigPath+": stateDir is empty")
}
