package soak

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// TestMain runs the soak in namespaces of its own (testnet.Main).
func TestMain(m *testing.M) {
	code := testnet.Main(m)
	testbin.Cleanup()
	os.Exit(code)
}

// world is one node as the soak sees it: two fixture hosts (an Ethernet
// RoCE one and an InfiniBand DGX one) whose VF netdevs are veth stand-ins
// in this test's netns, the sriov plugin built with failpoints (and with
// VF settings on the PF and RDMA placement kept in files, which outlive a
// killed plugin as a real PF and RDMA subsystem do), the reference IPAM
// plugins, and a state dir on a small tmpfs of its own that cycles fill
// up and turn read-only.
type world struct {
	t                               *testing.T
	bin                             string
	dir, stateDir, ipamDir, devinfo string
	pfDir, rdmaFile                 string
	nodeConf                        string // the CNI's node config
	vfs                             []*vf
	rng                             *rand.Rand
	mu                              sync.Mutex // guards the fields below
	fig                             figures
	problems                        []string
	addTimes, delTimes              []time.Duration
	failpointsSeen                  map[string]bool
	pods                            map[string]*pod
}

// figures are what make soak reports.
type figures struct {
	Cycles, Calls, Kills, FailpointKills, RandomKills, Leaks, Panics, Violations int
	// Reclaims are ADDs that took a VF from a pod lost without a DEL.
	Reclaims int
	ByKind   map[string]int
}

// vf is one VF stand-in.
type vf struct {
	root, addr, netdev, peer string
	pf                       string
	index                    int
	ib                       bool
	rdma                     string
	guid                     string // the VF's GUID in sysfs, "" for Ethernet
	mac                      string
	mtu                      int
	busy                     bool // held by a cycle
}

func fixture(name string) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "testdata", "sysfs", name))
	if err != nil {
		panic(err)
	}
	return p
}

func newWorld(t *testing.T, seed uint64) *world {
	t.Helper()
	dir := t.TempDir()
	w := &world{t: t, dir: dir, stateDir: filepath.Join(dir, "state"), ipamDir: filepath.Join(dir, "ipam"),
		devinfo: filepath.Join(dir, "devinfo"), pfDir: filepath.Join(dir, "pf"), rdmaFile: filepath.Join(dir, "rdma.json"),
		rng: rand.New(rand.NewPCG(seed, seed^0x5eed)), failpointsSeen: map[string]bool{}, pods: map[string]*pod{},
		fig: figures{ByKind: map[string]int{}}}
	for _, d := range []string{w.stateDir, w.pfDir} {
		require.NoError(t, os.MkdirAll(d, 0o700))
	}
	// The state dir is a tmpfs of its own, so that cycles can fill it and
	// make it read-only (the test runs in a private mount namespace).
	require.NoError(t, syscall.Mount("soak-state", w.stateDir, "tmpfs", 0, "size=256k,mode=0700"))
	t.Cleanup(func() { _ = syscall.Unmount(w.stateDir, syscall.MNT_DETACH) })

	// The node's paths are the node config's (FASTPATH_CNI_NODE_CONFIG,
	// root's, 0644), not the confs'; no kubelet answers PodResources.
	w.nodeConf = filepath.Join(dir, "node.json")
	require.NoError(t, os.WriteFile(w.nodeConf, []byte(fmt.Sprintf(
		`{"stateDir":%q,"deviceInfoDir":%q,"draSocket":"","deviceIDCheck":"off"}`, w.stateDir, w.devinfo)), 0o644))

	w.bin = testbin.Build(t, testbin.HostLocal, testbin.Static)
	out, err := exec.Command("go", "build", "-buildvcs=false", "-tags", "failpoints", "-o", filepath.Join(w.bin, "sriov"),
		"github.com/fastpath-k8s/fastpath/cmd/sriov-cni").CombinedOutput()
	require.NoError(t, err, "go build -tags failpoints: %s", out)

	for _, f := range []struct {
		host  string
		addrs []string
	}{
		{"roce-cx6dx", []string{"0000:3b:00.2", "0000:3b:00.3", "0000:3b:00.4", "0000:3b:00.5", "0000:3b:01.2", "0000:3b:01.3", "0000:3b:01.4", "0000:3b:01.5"}},
		{"dgx-h100", []string{"0000:18:00.1", "0000:18:00.2", "0000:18:00.3", "0000:18:00.4", "0000:40:00.1", "0000:40:00.2", "0000:40:00.3", "0000:40:00.4"}},
	} {
		root := fixture(f.host)
		for _, a := range f.addrs {
			d, err := nic.NewScanner(root).Device(a)
			require.NoError(t, err)
			v := &vf{root: root, addr: a, netdev: d.Netdev, peer: fmt.Sprintf("sp%d", len(w.vfs)), pf: d.PFNetdev, index: d.VFIndex,
				ib: d.LinkType == rdma.LinkLayerInfiniBand, rdma: d.RDMADevice}
			if v.ib {
				v.guid = sysfsGUID(t, root, a, d.RDMADevice)
			}
			w.standIn(v)
			w.vfs = append(w.vfs, v)
		}
	}
	return w
}

// standIn (re)creates v's veth stand-in, up, and remembers its MAC and MTU.
func (w *world) standIn(v *vf) {
	if l, err := netlink.LinkByName(v.peer); err == nil {
		_ = netlink.LinkDel(l) // the stand-in goes with it, wherever it is
	}
	l := testnet.Veth(w.t, nil, v.netdev, v.peer)
	// The plugin (failpoints build, FASTPATH_STANDINS) tells the stand-in
	// for v's VF by this name (failpointtest.StandInAltName), as the
	// kernel tells a VF netdev by its parent device, under whatever name
	// and in whatever netns.
	require.NoError(w.t, netlink.LinkAddAltName(l, "fpvf_"+strings.ReplaceAll(v.addr, ":", "_")))
	v.mac, v.mtu = l.Attrs().HardwareAddr.String(), l.Attrs().MTU
}

func sysfsGUID(t *testing.T, root, addr, dev string) string {
	b, err := os.ReadFile(filepath.Join(root, "sys/bus/pci/devices", addr, "infiniband", dev, "node_guid"))
	require.NoError(t, err)
	h := strings.ReplaceAll(strings.TrimSpace(string(b)), ":", "")
	var parts []string
	for i := 0; i+2 <= len(h); i += 2 {
		parts = append(parts, h[i:i+2])
	}
	return strings.Join(parts, ":")
}

// take picks n VFs not held by a cycle.
func (w *world) take(n int) []*vf {
	w.mu.Lock()
	defer w.mu.Unlock()
	var free []*vf
	for _, v := range w.vfs {
		if !v.busy {
			free = append(free, v)
		}
	}
	w.rng.Shuffle(len(free), func(i, j int) { free[i], free[j] = free[j], free[i] })
	if n > len(free) {
		n = len(free)
	}
	for _, v := range free[:n] {
		v.busy = true
	}
	return free[:n]
}

func (w *world) release(vfs ...*vf) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, v := range vfs {
		v.busy = false
	}
}

// pod is one attachment's runtime side: its netns and its conf.
type pod struct {
	cid, ifName, ns, nsPath string
	vf                      *vf
	conf                    string
}

// confOpts says what a conf asks for.
type confOpts struct {
	settings bool   // every VF setting the link type takes, and an MTU (and a MAC on Ethernet)
	ipam     string // "host-local", "static", "broken-routes" or ""
	devinfo  bool
}

func (w *world) newPod(v *vf, o confOpts) *pod {
	w.t.Helper()
	name := "soak-" + testnet.RandHex(4)
	out, err := exec.Command("ip", "netns", "add", name).CombinedOutput()
	require.NoError(w.t, err, "%s", out)
	p := &pod{cid: "c-" + testnet.RandHex(6), ifName: "net1", ns: name, nsPath: testnet.NetnsDir + "/" + name, vf: v}
	c := map[string]any{"cniVersion": "1.1.0", "name": "soak", "type": "sriov", "deviceID": v.addr, "logLevel": "debug"}
	if o.settings {
		c["spoofchk"], c["trust"], c["link_state"], c["min_tx_rate"], c["max_tx_rate"] = "off", "on", "enable", 10, 1000
		c["mtu"] = 4000
		if v.ib {
			c["guid"] = fmt.Sprintf("02:00:00:00:00:00:%02x:%02x", w.rng.IntN(256), 1+w.rng.IntN(255))
			c["mtu"] = 2044
		} else {
			c["vlan"], c["vlanQoS"], c["mac"] = 100+w.rng.IntN(100), 3, fmt.Sprintf("02:fa:57:00:%02x:%02x", w.rng.IntN(256), w.rng.IntN(256))
		}
	}
	switch o.ipam {
	case "host-local":
		c["ipam"] = map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": "10.99.0.0/16"}}}, "dataDir": w.ipamDir}
	case "static":
		c["ipam"] = map[string]any{"type": "static", "addresses": []map[string]string{{"address": fmt.Sprintf("10.98.%d.%d/16", w.rng.IntN(250), 1+w.rng.IntN(250))}}}
	case "broken-routes":
		// The gateway is off the subnet: configuring the routes fails
		// after everything else is done, and ADD rolls back.
		c["ipam"] = map[string]any{"type": "host-local", "ranges": [][]map[string]string{{{"subnet": "10.99.0.0/16"}}}, "dataDir": w.ipamDir,
			"routes": []map[string]string{{"dst": "10.200.0.0/16", "gw": "10.97.0.1"}}}
	}
	if o.devinfo {
		c["runtimeConfig"] = map[string]any{"CNIDeviceInfoFile": filepath.Join(w.devinfo, p.cid+"-net1.json")}
	}
	b, err := json.Marshal(c)
	require.NoError(w.t, err)
	p.conf = string(b)
	w.mu.Lock()
	w.pods[p.ns] = p
	w.mu.Unlock()
	return p
}

// gone deletes the pod's netns (the runtime's last step).
func (w *world) gone(p *pod) {
	_ = exec.Command("ip", "netns", "del", p.ns).Run()
	w.mu.Lock()
	delete(w.pods, p.ns)
	w.mu.Unlock()
}

// call is one plugin invocation.
type call struct {
	cmd       string
	p         *pod
	failpoint string
	killAfter time.Duration // > 0: SIGKILL after this long
}

// outcome is what the runtime saw.
type outcome struct {
	ok, killed bool
	code       uint
	msg        string
	stderr     string
	took       time.Duration
}

func (w *world) exec(c call) outcome {
	cmd := exec.Command(filepath.Join(w.bin, "sriov"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "CNI_COMMAND=" + c.cmd, "CNI_CONTAINERID=" + c.p.cid, "CNI_NETNS=" + c.p.nsPath,
		"CNI_IFNAME=" + c.p.ifName, "CNI_PATH=" + w.bin, "FASTPATH_HOST_ROOT=" + c.p.vf.root,
		"FASTPATH_FAKE_PF=" + w.pfDir, "FASTPATH_FAKE_RDMA=" + w.rdmaFile, "FASTPATH_CNI_NODE_CONFIG=" + w.nodeConf,
		"FASTPATH_STANDINS=1"}
	if c.failpoint != "" {
		cmd.Env = append(cmd.Env, "FASTPATH_FAILPOINT="+c.failpoint)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdin, cmd.Stdout, cmd.Stderr = strings.NewReader(c.p.conf), &stdout, &stderr
	start := time.Now()
	if err := cmd.Start(); err != nil {
		w.problem("start the plugin: %v", err)
		return outcome{}
	}
	if c.killAfter > 0 {
		timer := time.AfterFunc(c.killAfter, func() { _ = cmd.Process.Signal(syscall.SIGKILL) })
		defer timer.Stop()
	}
	err := cmd.Wait()
	o := outcome{took: time.Since(start), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
		o.ok = true
	case errors.As(err, &ee) && ee.Sys().(syscall.WaitStatus).Signaled() && ee.Sys().(syscall.WaitStatus).Signal() == syscall.SIGKILL:
		o.killed = true
	case errors.As(err, &ee):
	default:
		w.problem("wait for the plugin: %v", err)
	}
	w.mu.Lock()
	w.fig.Calls++
	if o.killed {
		w.fig.Kills++
		if c.failpoint != "" {
			w.fig.FailpointKills++
			w.failpointsSeen[c.failpoint] = true
		} else {
			w.fig.RandomKills++
		}
	}
	if strings.Contains(o.stderr, "panic:") || strings.Contains(o.stderr, "goroutine ") {
		w.fig.Panics++
		w.problemLocked("%s %s panicked:\n%s", c.cmd, c.p.vf.addr, o.stderr)
	}
	w.mu.Unlock()
	if o.killed {
		if c.failpoint != "" && !strings.Contains(o.stderr, "failpoint "+c.failpoint) {
			w.problem("%s killed, but not at failpoint %s", c.cmd, c.failpoint)
		}
		return o
	}
	if c.failpoint != "" && o.ok && c.killAfter == 0 {
		// A boundary this conf never reaches is not a kill; the caller
		// knows which ones must be reached.
		o.msg = "failpoint not reached"
	}
	w.checkWire(c, o.ok, stdout.Bytes(), &o)
	return o
}

// checkWire checks what the runtime reads on stdout: a result after a
// successful ADD, nothing after another success, and otherwise one JSON
// error with a code that is not 0 and a message.
func (w *world) checkWire(c call, ok bool, out []byte, o *outcome) {
	if ok {
		if c.cmd == "ADD" {
			if _, err := current.NewResult(out); err != nil {
				w.violation("ADD %s succeeded with stdout %q: %v", c.p.vf.addr, out, err)
			}
		} else if len(bytes.TrimSpace(out)) > 0 {
			w.violation("%s %s succeeded with stdout %q", c.cmd, c.p.vf.addr, out)
		}
		return
	}
	var e types.Error
	dec := json.NewDecoder(bytes.NewReader(out))
	if err := dec.Decode(&e); err != nil || dec.More() {
		w.violation("%s %s failed with stdout %q: not one JSON error", c.cmd, c.p.vf.addr, out)
		return
	}
	if e.Code == 0 || e.Msg == "" {
		w.violation("%s %s failed with code %d, message %q", c.cmd, c.p.vf.addr, e.Code, e.Msg)
	}
	o.code, o.msg = e.Code, e.Msg
}

func (w *world) problem(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.problemLocked(format, args...)
}

func (w *world) problemLocked(format string, args ...any) {
	w.problems = append(w.problems, fmt.Sprintf(format, args...))
}

func (w *world) violation(format string, args ...any) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fig.Violations++
	w.problemLocked("wire: "+format, args...)
}

// del is the runtime's DEL: retried, as runtimes do, until it succeeds.
func (w *world) del(p *pod) {
	var last outcome
	for i := 0; i < 5; i++ {
		if last = w.exec(call{cmd: "DEL", p: p}); last.ok {
			w.mu.Lock()
			w.delTimes = append(w.delTimes, last.took)
			w.mu.Unlock()
			return
		}
	}
	w.problem("DEL %s (container %s) failed 5 times: code %d: %s\n%s", p.vf.addr, p.cid, last.code, last.msg, last.stderr)
}

// median of the recent durations, for random kill times.
func median(ds []time.Duration, fallback time.Duration) time.Duration {
	if len(ds) == 0 {
		return fallback
	}
	s := append([]time.Duration(nil), ds[max(0, len(ds)-51):]...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// links lists the host netns's links by name.
func links() map[string]netlink.Link {
	ls, _ := netlink.LinkList()
	m := map[string]netlink.Link{}
	for _, l := range ls {
		m[l.Attrs().Name] = l
	}
	return m
}

// pfConfig reads the file-backed PF's settings of v (false: never set).
func (w *world) pfConfig(v *vf) (sriov.VFConfig, bool, error) {
	b, err := os.ReadFile(filepath.Join(w.pfDir, v.pf+".json"))
	if errors.Is(err, os.ErrNotExist) {
		return sriov.VFConfig{}, false, nil
	}
	if err != nil {
		return sriov.VFConfig{}, false, err
	}
	vfs := map[int]sriov.VFConfig{}
	if err := json.Unmarshal(b, &vfs); err != nil {
		return sriov.VFConfig{}, false, err
	}
	c, ok := vfs[v.index]
	return c, ok, nil
}
