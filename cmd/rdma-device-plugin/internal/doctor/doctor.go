// Package doctor says why NCCL on a node would use NET/Socket instead of
// NET/IB, and how to fix it: kernel modules, char devices, VFs, ports, GIDs,
// the RDMA netns mode, the kubelet registration, the CNI, GPU affinity, a
// pod's own view and its NCCL log. Every check reads the node under an
// injected root (and, where the kernel is asked directly, through an
// injected Kernel) and returns plain results; nothing here prints, and
// nothing writes to the node.
package doctor

import (
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Status is a check's verdict.
type Status string

// Verdicts, worst first.
const (
	Fail Status = "fail" // NCCL will not use RDMA (or pods cannot get it) until fixed
	Warn Status = "warn" // works, but worse than it should, or about to break
	Skip Status = "skip" // could not be checked here; Message says why
	OK   Status = "ok"
)

func (s Status) rank() int {
	return map[Status]int{Fail: 0, Warn: 1, Skip: 2, OK: 3}[s]
}

// Check is one finding.
type Check struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Subject is what the finding is about: a PCI address, an RDMA device
	// and port, a netdev, a file, a pool.
	Subject string `json:"subject"`
	Message string `json:"message"`
	// Fix is the command or change that resolves it ("" when ok).
	Fix string `json:"fix"`
}

// Report is every check of one run.
type Report struct {
	Checks []Check `json:"checks"`
}

// Sorted returns the checks failures first, then warnings, skips and
// passes, each group in the order the checks ran.
func (r *Report) Sorted() []Check {
	out := slices.Clone(r.Checks)
	slices.SortStableFunc(out, func(a, b Check) int { return cmp.Compare(a.Status.rank(), b.Status.rank()) })
	return out
}

// ExitCode is 2 when any check failed, 1 when there are only warnings, 0
// otherwise (skips are not findings).
func (r *Report) ExitCode() int {
	code := 0
	for _, c := range r.Checks {
		switch c.Status {
		case Fail:
			return 2
		case Warn:
			code = 1
		}
	}
	return code
}

// Count is how many checks have status s.
func (r *Report) Count(s Status) int {
	n := 0
	for _, c := range r.Checks {
		if c.Status == s {
			n++
		}
	}
	return n
}

// Options say what to check and where.
type Options struct {
	// HostRoot stands for the node's / (sysfs at HostRoot/sys, devices at
	// HostRoot/dev).
	HostRoot string
	// ConfigPath is the pool config; Config is it parsed, nil when it did
	// not load (ConfigErr says why) or when ConfigPath is "".
	ConfigPath string
	Config     *pool.Config
	ConfigErr  error
	// KubeletDir is the kubelet's device-plugins directory; "" skips the
	// kubelet checks.
	KubeletDir string
	// CNIBinDir and CNIConfDir: "" skips the CNI checks.
	CNIBinDir  string
	CNIConfDir string
	// PodPID, when not 0, is a process of the pod's container to inspect
	// through ProcRoot (default "/proc").
	PodPID   int
	ProcRoot string
	// NCCLLog is an NCCL_DEBUG=INFO log to read; "" for none.
	NCCLLog string
	// Kernel asks the running kernel (RDMA netlink, addresses). nil when
	// HostRoot is not this machine's root: those checks then read sysfs
	// only, or say they could not.
	Kernel Kernel
	// Build is this binary's identity, to compare the installed CNI with.
	Build Build
	// Plan is what the SriovNetworkNodePolicies at PolicyPath would do to
	// the node; nil skips the provisioning checks.
	PolicyPath string
	Plan       *provision.Plan
	// Fixture says HostRoot is a fixture host (IsFixture): regular files
	// under /dev/infiniband stand in for the char devices there, and the
	// report says so once instead of failing each.
	Fixture bool
}

// FixtureMarker is the file at the top of a fixture host that
// internal/testsupport/fixture (make fixtures) and the captured hosts carry; its
// fixture.Marker is the same name. Git cannot hold device nodes, so a
// fixture's /dev/infiniband has empty files where a node has char devices.
const FixtureMarker = "fastpath-fixture"

// IsFixture says root is a fixture host: it has FixtureMarker and is not
// this machine's running kernel (a node's / never counts, marker or not,
// so a real node's missing or fake char devices are still failures).
func IsFixture(root string) bool {
	if SameKernel(root) {
		return false
	}
	fi, err := os.Stat(filepath.Join(root, FixtureMarker))
	return err == nil && fi.Mode().IsRegular()
}

// Build identifies a fastpath build.
type Build struct {
	Version  string
	Revision string
}

// Kernel is what doctor asks the running kernel directly.
type Kernel interface {
	// RDMANetnsMode is "exclusive" or "shared", from RDMA netlink;
	// ErrNoRDMANetlink when the kernel has none.
	RDMANetnsMode() (string, error)
	// IPv4Addrs are the IPv4 addresses of netdev in doctor's own network
	// namespace; ErrNoLink when netdev is not in it.
	IPv4Addrs(netdev string) ([]string, error)
}

// host is what one run knows about the node, shared by the checks.
type host struct {
	opts  Options
	root  string
	snap  *nic.Snapshot
	pools []pool.Pool
	// targets are the functions whose RDMA devices the checks look at:
	// the pools' devices, or every function with an RDMA device when
	// there is no config.
	targets []nic.Device
	// rdmaFamilies are the families whose RDMA driver the node needs
	// (planRDMA), ConnectX first; rdmaCore says whether it needs the
	// RDMA core at all (ib_uverbs, /dev/infiniband).
	rdmaFamilies []nic.Family
	rdmaCore     bool
	// pooled are the addresses of the pools' functions (inPool), and
	// families the family of each function familyOf has looked at.
	pooled   map[string]bool
	families map[string]family
	// allocated are device IDs the kubelet's checkpoint says pods hold.
	allocated map[string]string // ID -> resource
	cp        *checkpoint

	checks []Check
}

func (h *host) add(name string, st Status, subject, msg, fix string) {
	h.checks = append(h.checks, Check{Name: name, Status: st, Subject: subject, Message: msg, Fix: fix})
}

func (h *host) addf(name string, st Status, subject, fix, format string, args ...any) {
	h.add(name, st, subject, fmt.Sprintf(format, args...), fix)
}

// sys is a path below the host's /sys.
func (h *host) sys(p ...string) string {
	return filepath.Join(append([]string{h.root, "sys"}, p...)...)
}

// denied adds a skip when err is a permission error, and reports whether
// it was: what doctor cannot read unprivileged is said, not failed.
func (h *host) denied(name, subject string, err error) bool {
	if !errors.Is(err, fs.ErrPermission) {
		return false
	}
	h.addf(name, Skip, subject, "run doctor as root on the node, or in the plugin's pod", "not checked: %v", err)
	return true
}

// read reads a sysfs attribute below the host root, trimmed.
func read(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// Run runs every check Options ask for.
func Run(o Options) *Report {
	if o.HostRoot == "" {
		o.HostRoot = "/"
	}
	if o.ProcRoot == "" {
		o.ProcRoot = "/proc"
	}
	h := &host{opts: o, root: o.HostRoot}
	if o.Fixture {
		h.add("fixture", Skip, filepath.Join(o.HostRoot, FixtureMarker),
			"a fixture host, not a node: empty files under its /dev/infiniband stand in for char devices (git holds no device nodes); the kubelet and CNI checks run only on the directories given",
			"run doctor on a node for the real thing; --kubelet-dir, --cni-bin-dir and --cni-conf-dir check a fixture's own")
	}
	scanOK := h.scan()
	h.readCheckpoint()
	if scanOK {
		h.checkModules()
		h.checkCharDevices()
		h.checkPools()
		h.checkVFs()
		if o.Plan != nil {
			h.checkProvision()
		}
		h.checkPorts()
		h.checkRoCEGIDs()
	}
	h.checkNetnsMode()
	h.checkKubelet()
	h.checkCNI()
	if scanOK {
		h.checkGPUs()
	}
	if o.PodPID != 0 {
		h.checkPod()
	}
	if o.NCCLLog != "" {
		h.checkNCCLLog()
	}
	return &Report{Checks: h.checks}
}

// scan runs discovery and builds the pools; false when the node could not
// be scanned at all.
func (h *host) scan() bool {
	snap, err := nic.NewScanner(h.root).Scan()
	if err != nil {
		h.add("discovery", Fail, h.sys(), fmt.Sprintf("cannot scan the node: %v", err),
			"mount the node's /sys (and /dev/infiniband) into this container, or pass --host-root")
		return false
	}
	h.snap = snap
	switch {
	case h.opts.ConfigErr != nil:
		h.add("config", Fail, h.opts.ConfigPath, h.opts.ConfigErr.Error(),
			"fix the pool config (the plugin keeps its last good config; a restarted plugin has none)")
	case h.opts.Config == nil:
		h.add("config", Skip, "", "no pool config given: checking every function with an RDMA device instead of the pools'",
			"pass --config (in the plugin's pod: /etc/fastpath/config.json)")
	default:
		h.pools, _ = pool.Build(h.opts.Config, snap.Devices)
	}
	if h.opts.Config != nil {
		seen := map[string]bool{}
		for _, p := range h.pools {
			for _, d := range p.Devices {
				if !seen[d.PCIAddress] {
					seen[d.PCIAddress] = true
					h.targets = append(h.targets, d)
				}
			}
		}
		slices.SortFunc(h.targets, func(a, b nic.Device) int { return cmp.Compare(a.PCIAddress, b.PCIAddress) })
	} else {
		for _, d := range snap.Devices {
			if d.RDMADevice != "" {
				h.targets = append(h.targets, d)
			}
		}
	}
	if len(snap.Devices) == 0 {
		h.add("discovery", Fail, h.sys("bus", "pci", "devices"),
			"no SR-IOV NIC function of any vendor (a network PF with sriov_totalvfs, or a VF), no network function with an RDMA device and no ConnectX function on this node: nothing for fastpath to serve",
			"lspci -nn -d ::0200 and -d ::0207 list the node's network functions: enable SR-IOV for them in the NIC's firmware and the server's BIOS, and load their driver; in a container, mount the node's /sys")
		return false
	}
	h.planRDMA()
	return true
}

// plural is "1 thing" or "n things".
func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
