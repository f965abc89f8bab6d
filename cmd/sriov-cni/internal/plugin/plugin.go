// Package plugin is the sriov CNI plugin: it gives a pod a ConnectX SR-IOV
// VF — the netdev and its RDMA device — and on DEL puts everything back.
//
// Every ADD is journaled write-ahead: the VF's original state is written to
// a state file before anything on the node changes, and each step is
// recorded there before it begins. The one teardown that undoes an
// attachment serves ADD's rollback, DEL and GC alike, undoes every step the
// journal names whether or not it completed, and finds the VF's netdev
// wherever a crash left it. DEL therefore works when the pod's netns is
// gone, when ADD was killed half-way, when the state file is damaged, and
// twice.
//
// A state file is evidence, not instructions (evidence.go): before any
// teardown, DEL, GC, CHECK or reclaim uses one, checkState confirms
// against sysfs, by the VF's PCI address, that the VF, its PF, its PF
// netdev, its index and its RDMA device are what the file says; one that
// fails is set aside like a damaged one and the VF restored by its PCI
// address alone. Teardown touches only a link that is the VF's own and
// follows no leftover .netns pin that is not one.
//
// The flow is split by lifecycle: plan.go decides (pure, no I/O), add.go
// reads the node and applies, teardown.go undoes (netdev.go brings the
// netdev home), reclaim.go frees for ADD a VF whose pod is gone without a
// DEL, ipam.go runs the IPAM plugin, check.go serves CHECK, STATUS and GC,
// upstream.go translates an attachment upstream sriov-cni made before the
// swap into a State, for teardown on DEL and GC. attachlock.go orders an
// ADD and a DEL of one attachment that run side by side (a runtime's
// timeout kills Multus, not this plugin): DEL waits for the ADD, and an
// ADD that comes after its DEL changes nothing.
package plugin

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// HostRootEnv names the directory that stands for / when reading sysfs
// (tests and the fixture host set it; runtimes pass their environment on).
const HostRootEnv = "FASTPATH_HOST_ROOT"

// maxDelAttempts is how many DELs may fail to restore a VF before DEL gives
// up, drops the state and reports success: a runtime retries a failing DEL
// forever, and what failed three times will not heal by itself. A failed
// IPAM DEL does not count: it holds no VF, and its address stays pending
// (Pending) until a DEL or GC releases it.
const maxDelAttempts = 3

// Plugin holds the plugin's dependencies; main wires the real ones, tests
// inject fakes for what this machine's kernel cannot do.
// VFDriver is what a VF's netdev driver does that the plugin depends on
// beyond netlink: its answer to a change of the netdev's own MAC (not the
// PF's administrative MAC for the VF), asked before the plugin makes one,
// and what it does when the plugin closes the netdev (igbvf resets the VF
// and takes the MAC its PF holds for it).
type VFDriver interface {
	MACChange(st *State, mac net.HardwareAddr) error
	Closed(st *State, h *netlink.Handle, l netlink.Link) error
}

type Plugin struct {
	// HostRoot is where sysfs is read ("/" in production).
	HostRoot string
	// Node is the node's configuration: paths and checks no conf can
	// change (nodeconf.go).
	Node NodeConfig
	// NewPFLink returns the PF calls over a netlink handle in the host netns.
	NewPFLink func(h *netlink.Handle) sriov.PFLink
	// RDMA moves RDMA devices between namespaces.
	RDMA RDMA
	// NewPodResources returns a client of the kubelet's PodResources API.
	NewPodResources func(socket string) PodResources
	// NetdevPCI, when set, says which PCI device a netdev is (its PCI
	// address, or ""); nil reads the kernel's IFLA_PARENT_DEV_NAME. Tests
	// set it for the veth links that stand in for VFs.
	NetdevPCI func(l netlink.Link) string
	// VFDriver, when set, plays the VF netdev's driver for links that
	// have none; nil leaves it to the kernel. Tests set it for the veth
	// links that stand in for VFs, which take any MAC, to answer as igbvf
	// does (fakes_test.go).
	VFDriver VFDriver
	// Stdout receives the result (the CNI protocol); Stderr the log and
	// the IPAM plugin's stderr.
	Stdout, Stderr io.Writer

	// failpoint is called at each step boundary of ADD and teardown; only
	// test builds set it (SetFailpoint).
	failpoint func(name string)
	// attachWait bounds the wait for an attachment's lock; 0 is
	// AttachLockTimeout (tests shorten it).
	attachWait time.Duration
	// nodeFile is the node config's file, for errors that tell the node's
	// admin where to change a path ("" is DefaultNodeConfigPath); nodeErr
	// is why it could not be loaded, which every command returns.
	nodeFile string
	nodeErr  error
}

// New returns the plugin with the real kernel and kubelet behind it and
// the node's configuration (LoadNodeConfig). A node config that cannot be
// loaded is not fatal here: every command returns why (ready), so that
// the runtime shows it.
func New() *Plugin {
	root := os.Getenv(HostRootEnv)
	if root == "" {
		root = "/"
	}
	node, file, err := LoadNodeConfig(os.Getenv)
	p := &Plugin{
		HostRoot: root, Node: node, NewPFLink: sriov.NewNetlinkPFLink, RDMA: NewNetlinkRDMA(), NewPodResources: NewKubeletPodResources,
		Stdout: os.Stdout, Stderr: os.Stderr, nodeFile: file, nodeErr: err,
	}
	return p
}

// Funcs are the plugin's commands for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	wrap := func(f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			if err := f(a); err != nil {
				return CNIError(err)
			}
			return nil
		}
	}
	return skel.CNIFuncs{Add: wrap(p.Add), Del: wrap(p.Del), Check: wrap(p.Check), Status: wrap(p.Status), GC: wrap(p.GC)}
}

// ready returns why the plugin cannot serve a command on this node: its
// node config could not be loaded, or is not valid. Every command asks
// first, before it reads its conf. A DEL fails too: it cannot know the
// state dir, and the runtime retries a failed DEL until it succeeds, so
// the VF is released once the node's admin fixes the file instead of
// leaking with its state.
func (p *Plugin) ready() error {
	if p.nodeErr != nil {
		return p.nodeErr
	}
	if err := p.Node.validate(); err != nil {
		return nodeConfigError(p.nodeConfigFile(), err)
	}
	return nil
}

// nodeConfigFile is where the node's admin changes the node config.
func (p *Plugin) nodeConfigFile() string {
	if p.nodeFile != "" {
		return p.nodeFile
	}
	return DefaultNodeConfigPath
}

func (p *Plugin) point(name string) {
	if p.failpoint != nil {
		p.failpoint(name)
	}
}

// logger logs to Stderr, or to the conf's logFile, at the conf's level.
// A logFile is used only where the node's admin allows logs: a file in
// Node.LogDir or below it, reached without following a symlink and
// without creating a directory (openLogFile). Any other logFile, or one
// that cannot be opened, is ignored with a warning on Stderr, which then
// takes the log, and is cleared from c (the log is not in a file).
func (p *Plugin) logger(c *NetConf, args *skel.CmdArgs) (*slog.Logger, func()) {
	var level slog.Level
	if c != nil {
		level = c.logLevel
	}
	w, closeFn := p.Stderr, func() {}
	if w == nil {
		w = io.Discard
	}
	var fileErr error
	var logFile string
	if c != nil && c.LogFile != "" {
		logFile = c.LogFile
		f, err := openLogFile(p.Node.LogDir, c.LogFile)
		if err == nil {
			w, closeFn = f, func() { f.Close() }
		} else {
			fileErr = err
			c.LogFile = ""
		}
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("plugin", "sriov")
	if args != nil {
		log = log.With("container", shortID(args.ContainerID), "ifname", args.IfName)
	}
	if fileErr != nil {
		log.Warn("logFile ignored; logging to stderr", "logFile", logFile, "err", fileErr)
	}
	return log, closeFn
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// k8sArgs are the CNI_ARGS a Kubernetes runtime passes.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

// invalidEnv is a CNI "invalid environment variables" error (code 4).
func invalidEnv(format string, args ...any) error {
	return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf(format, args...), "")
}
