package plugin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/netdata"
)

// NodeConfigEnv names a file that replaces DefaultNodeConfigPath. It is
// the runtime's environment, which the node's admin sets and a
// NetworkAttachmentDefinition cannot reach (tests and the e2e harnesses
// set it).
const NodeConfigEnv = "FASTPATH_CNI_NODE_CONFIG"

// DefaultNodeConfigPath is where the node's admin may put a NodeConfig.
// It sits in a subdirectory of the CNI configuration directory, as
// whereabouts keeps whereabouts.d/ there: runtimes and Multus read only
// the directory's own files, so it is never taken for a network.
const DefaultNodeConfigPath = "/etc/cni/net.d/fastpath.d/sriov.json"

// DefaultDeviceInfoDir is Multus's directory of the device-info files of
// CNIs (NodeConfig.DeviceInfoDir).
const DefaultDeviceInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/cni"

// DeviceIDCheck values: whether ADD checks that the pod holds the VF a
// conf's deviceID names.
const (
	// DeviceIDCheckPodResources asks the kubelet's PodResources API (the
	// device plugin's allocation, or the pod's DRA claims) and refuses a
	// VF the pod does not hold. The default.
	DeviceIDCheckPodResources = "podresources"
	// DeviceIDCheckOff trusts deviceID: for a runtime without the
	// kubelet's PodResources API.
	DeviceIDCheckOff = "off"
)

// NodeConfig is what belongs to the node, not to a network: the paths the
// root-run plugin reads, writes and dials, and its checks. A
// NetworkAttachmentDefinition is a namespace admin's input and cannot
// change any of it.
type NodeConfig struct {
	// StateDir holds the plugin's state files and locks.
	StateDir string `json:"stateDir,omitempty"`
	// LogDir is the only directory a conf's logFile may name a file in;
	// "" ignores every logFile (the log goes to stderr, which the
	// runtime keeps).
	LogDir string `json:"logDir,omitempty"`
	// PodResourcesSocket is the kubelet's PodResources API socket.
	PodResourcesSocket string `json:"podResourcesSocket,omitempty"`
	// DRASocket is fastpath's DRA driver's socket for the network data of
	// the VFs it prepared; "" tells it nothing.
	DRASocket string `json:"draSocket,omitempty"`
	// DeviceInfoDir is Multus's directory of the device-info files it
	// asks CNIs for: the only place a runtimeConfig.CNIDeviceInfoFile may
	// be written, or removed. Multus v4.3.0 names them
	// /var/run/k8s.cni.cncf.io/devinfo/cni/<network>-<containerID>_<ifname>
	// (network-attachment-definition-client v1.7.6,
	// GetCNIDeviceInfoPath); the device plugins' files are beside it, in
	// devinfo/dp, out of a conf's reach.
	DeviceInfoDir string `json:"deviceInfoDir,omitempty"`
	// DeviceIDCheck is DeviceIDCheckPodResources or DeviceIDCheckOff.
	DeviceIDCheck string `json:"deviceIDCheck,omitempty"`
}

// DefaultNodeConfig is the node configuration where the node's admin
// wrote none: the kubelet's and Multus's own default paths.
func DefaultNodeConfig() NodeConfig {
	return NodeConfig{
		StateDir:           DefaultStateDir,
		PodResourcesSocket: DefaultPodResourcesSocket,
		DRASocket:          netdata.DefaultSocket,
		DeviceInfoDir:      DefaultDeviceInfoDir,
		DeviceIDCheck:      DeviceIDCheckPodResources,
	}
}

// maxNodeConfigSize bounds what LoadNodeConfig reads: a node config is a
// few hundred bytes.
const maxNodeConfigSize = 64 << 10

// LoadNodeConfig reads the node configuration from the file getenv names
// in NodeConfigEnv, or else from DefaultNodeConfigPath, and returns it
// with the file it came from. No file at the default path is
// DefaultNodeConfig; a file named in NodeConfigEnv must exist. Keys the
// file leaves out keep DefaultNodeConfig's values.
//
// The file decides where a root process writes, so it is trusted only as
// the node's admin left it: a regular file (a symlink is refused, not
// followed) owned by root (the user the plugin runs as), writable by its
// owner only, at most maxNodeConfigSize bytes, strict JSON (an unknown key
// is refused: a misspelt key would silently keep a default), with
// absolute, clean paths.
func LoadNodeConfig(getenv func(string) string) (NodeConfig, string, error) {
	if path := getenv(NodeConfigEnv); path != "" {
		n, err := loadNodeConfig(path, true)
		return n, path, err
	}
	n, err := loadNodeConfig(DefaultNodeConfigPath, false)
	return n, DefaultNodeConfigPath, err
}

// loadNodeConfig loads the node config at path; a file that is not there
// is DefaultNodeConfig unless named (by NodeConfigEnv).
func loadNodeConfig(path string, named bool) (NodeConfig, error) {
	n, err := loadNodeConfigFile(path)
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, fs.ErrNotExist) && !named:
		return DefaultNodeConfig(), nil
	case errors.Is(err, fs.ErrNotExist):
		return NodeConfig{}, nodeConfigError(path, fmt.Errorf("%s names it, but it does not exist: write it, or unset %s to use %s", NodeConfigEnv, NodeConfigEnv, DefaultNodeConfigPath))
	}
	return NodeConfig{}, nodeConfigError(path, err)
}

// nodeConfigError is the error every command returns while the node
// config is bad: the runtime shows it, and only the node's admin can fix
// it (code 50, "plugin not available").
func nodeConfigError(path string, err error) error {
	return types.NewError(types.ErrPluginNotAvailable,
		fmt.Sprintf("node config %s: %v (the node's admin fixes this file; docs/cni.md, \"Node configuration\")", path, err), "")
}

func loadNodeConfigFile(path string) (NodeConfig, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ELOOP) {
		return NodeConfig{}, errors.New("a symlink, which is not followed: put the file itself there")
	}
	if err != nil {
		return NodeConfig{}, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return NodeConfig{}, err
	}
	if !fi.Mode().IsRegular() {
		return NodeConfig{}, fmt.Errorf("not a regular file (%s)", fi.Mode().Type())
	}
	if err := ownedByPlugin(fi); err != nil {
		return NodeConfig{}, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxNodeConfigSize+1))
	if err != nil {
		return NodeConfig{}, err
	}
	if len(data) > maxNodeConfigSize {
		return NodeConfig{}, fmt.Errorf("larger than %d bytes", maxNodeConfigSize)
	}
	n := DefaultNodeConfig()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&n); err != nil {
		return NodeConfig{}, fmt.Errorf("parse: %w", err)
	}
	if dec.More() {
		return NodeConfig{}, errors.New("parse: data after the JSON object")
	}
	if err := n.validate(); err != nil {
		return NodeConfig{}, err
	}
	return n, nil
}

// ownedByPlugin refuses a file or directory the plugin would trust that
// someone else could change: one not owned by the user the plugin runs
// as (root, under every runtime; a test's own user otherwise), or
// writable by its group or others.
func ownedByPlugin(fi fs.FileInfo) error {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return errors.New("owner unknown")
	}
	if euid := os.Geteuid(); int(st.Uid) != euid {
		return fmt.Errorf("owned by uid %d, not by uid %d (root, the user the plugin runs as): chown it to root", st.Uid, euid)
	}
	if perm := fi.Mode().Perm(); perm&0o022 != 0 {
		return fmt.Errorf("mode %#o lets group or others write it: chmod go-w", perm)
	}
	return nil
}

// validate checks that every path is absolute and clean and that the
// checks have known values. stateDir, podResourcesSocket and
// deviceInfoDir are needed; logDir and draSocket may be "" (none).
func (n *NodeConfig) validate() error {
	for _, f := range []struct {
		key, v   string
		optional bool
	}{
		{"stateDir", n.StateDir, false}, {"logDir", n.LogDir, true}, {"podResourcesSocket", n.PodResourcesSocket, false},
		{"draSocket", n.DRASocket, true}, {"deviceInfoDir", n.DeviceInfoDir, false},
	} {
		switch {
		case f.v == "" && f.optional:
		case f.v == "":
			return fmt.Errorf("%s is empty: leave the key out for the default", f.key)
		case !filepath.IsAbs(f.v) || filepath.Clean(f.v) != f.v:
			return fmt.Errorf("%s %q: want an absolute path without . or .. components or a trailing /, e.g. %q", f.key, f.v, filepath.Clean("/"+f.v))
		}
	}
	switch n.DeviceIDCheck {
	case DeviceIDCheckPodResources, DeviceIDCheckOff:
	default:
		return fmt.Errorf("deviceIDCheck %q: want %q or %q", n.DeviceIDCheck, DeviceIDCheckPodResources, DeviceIDCheckOff)
	}
	return nil
}

// conf is what ADD, CHECK, STATUS and GC read: the plugin ready (its node
// config loaded), stdin decoded and validated (parseConf), and the conf's
// paths held against the node's (checkNodePaths).
func (p *Plugin) conf(data []byte) (*NetConf, error) {
	if err := p.ready(); err != nil {
		return nil, err
	}
	c, err := parseConf(data)
	if err != nil {
		return nil, err
	}
	if err := p.checkNodePaths(c); err != nil {
		return nil, err
	}
	return c, nil
}

// checkNodePaths refuses a conf that names a path of the node's other
// than the node's own: stateDir, podResourcesSocket and draSocket may be
// left out or spell the node's value (after filepath.Clean, so that
// networks written for upstream sriov-cni, or for fastpath before these
// were the node's, keep working where they spell the default); and
// runtimeConfig.CNIDeviceInfoFile must be inside the node's
// device-info directory. logFile is not refused: logger ignores one
// outside the node's LogDir.
func (p *Plugin) checkNodePaths(c *NetConf) error {
	for _, f := range []struct{ key, what, conf, node string }{
		{"stateDir", "the state directory", c.StateDir, p.Node.StateDir},
		{"podResourcesSocket", "the kubelet's PodResources socket", c.PodResourcesSocket, p.Node.PodResourcesSocket},
		{"draSocket", "the DRA driver's socket", c.DRASocket, p.Node.DRASocket},
	} {
		if f.conf == "" || filepath.Clean(f.conf) == f.node {
			continue
		}
		node := fmt.Sprintf("%q", f.node)
		if f.node == "" {
			node = "none"
		}
		return invalidConf("%s %q: %s is the node's, not a network's: this node's is %s, which the node's admin sets in %s (key %q); drop %s from the network's conf",
			f.key, f.conf, f.what, node, p.nodeConfigFile(), f.key, f.key)
	}
	if path := c.RuntimeConfig.CNIDeviceInfoFile; path != "" {
		if _, ok := relBeneath(p.Node.DeviceInfoDir, path); !ok {
			return invalidConf("runtimeConfig.CNIDeviceInfoFile %q: not inside the node's device-info directory %s, where Multus puts these files; the node's admin sets it in %s (key \"deviceInfoDir\")",
				path, p.Node.DeviceInfoDir, p.nodeConfigFile())
		}
	}
	return nil
}
