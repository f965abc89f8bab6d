package plugin

import "github.com/fastpath-k8s/fastpath/internal/netdata"

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
	// DeviceInfoDir is Multus's device-info directory: the only place a
	// runtimeConfig.CNIDeviceInfoFile may be written.
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
		DeviceInfoDir:      "/var/run/k8s.cni.cncf.io/devinfo",
		DeviceIDCheck:      DeviceIDCheckPodResources,
	}
}
