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
// The flow is split by lifecycle: plan.go decides (pure, no I/O), add.go
// reads the node and applies, teardown.go undoes (netdev.go brings the
// netdev home), reclaim.go frees for ADD a VF whose pod is gone without a
// DEL, ipam.go runs the IPAM plugin, check.go serves CHECK, STATUS and GC,
// upstream.go translates an attachment upstream sriov-cni made before the
// swap into a State, for teardown on DEL and GC.
package plugin

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/netdata"
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
	// DRASocket is fastpath's DRA driver's socket for the network data of
	// the VFs it prepared (dranotify.go) when the conf names none; ""
	// tells it nothing.
	DRASocket string
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
}

// New returns the plugin with the real kernel and kubelet behind it.
func New() *Plugin {
	root := os.Getenv(HostRootEnv)
	if root == "" {
		root = "/"
	}
	p := &Plugin{
		HostRoot: root, Node: DefaultNodeConfig(), NewPFLink: sriov.NewNetlinkPFLink, RDMA: NewNetlinkRDMA(), NewPodResources: NewKubeletPodResources,
		DRASocket: netdata.DefaultSocket, Stdout: os.Stdout, Stderr: os.Stderr,
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

func (p *Plugin) point(name string) {
	if p.failpoint != nil {
		p.failpoint(name)
	}
}

// logger logs to Stderr, or to the conf's logFile, at the conf's level. A
// logFile that cannot be opened (or is a symlink: it is never followed) is
// reported on Stderr, which then takes the log.
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
	if c != nil && c.LogFile != "" {
		f, err := os.OpenFile(c.LogFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY|unix.O_NOFOLLOW, 0o600)
		if err == nil {
			w, closeFn = f, func() { f.Close() }
		} else {
			fileErr = err
		}
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("plugin", "sriov")
	if args != nil {
		log = log.With("container", shortID(args.ContainerID), "ifname", args.IfName)
	}
	if fileErr != nil {
		log.Warn("logFile unusable; logging to stderr", "logFile", c.LogFile, "err", fileErr)
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
