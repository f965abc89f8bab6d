package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
)

// What the CNI checks (and the RDMA ones) use to call the plugin as a
// runtime does and to see whether a VF is back as it was.

// vfState is what a VF must be back to after DEL: its netdev in the init
// netns under its own name and MAC, its settings on the PF as before.
type vfState struct {
	name, mac string
	pf        netlink.VfInfo
}

func (s vfState) String() string {
	return fmt.Sprintf("%s %s; on the PF: mac %s vlan %d qos %d spoofchk %v trust %d max_tx_rate %d link_state %d",
		s.name, s.mac, s.pf.Mac, s.pf.Vlan, s.pf.Qos, s.pf.Spoofchk, s.pf.Trust, s.pf.MaxTxRate, s.pf.LinkState)
}

// vf is one VF the CNI phase attaches.
type vf struct {
	pf   *pf
	idx  int
	addr string
	orig vfState
}

func (v *vf) String() string { return fmt.Sprintf("%s (VF %d of %s)", v.addr, v.idx, v.pf.netdev) }

// now reads the VF's state as the host sees it; the netdev is the one
// sysfs lists for the VF in the init netns ("" when none is there).
func (v *vf) now() (vfState, error) {
	var s vfState
	if n := netdevsOf(v.addr); len(n) == 1 {
		s.name = n[0]
		s.mac, _ = readAttr(filepath.Join("/sys/class/net", n[0], "address"))
	}
	info, err := vfSettings(v.pf.netdev, v.idx)
	s.pf = info
	return s, err
}

// home says why the VF is not back as it was, "" when it is.
func (v *vf) home() string {
	s, err := v.now()
	if err != nil {
		return err.Error()
	}
	o := v.orig
	var why []string
	if s.name != o.name {
		why = append(why, fmt.Sprintf("netdev %q in the init netns, want %q", s.name, o.name))
	}
	if s.name != "" && s.mac != o.mac {
		why = append(why, fmt.Sprintf("netdev MAC %s, want %s", s.mac, o.mac))
	}
	if s.pf.Mac.String() != o.pf.Mac.String() || s.pf.Vlan != o.pf.Vlan || s.pf.Qos != o.pf.Qos || s.pf.Spoofchk != o.pf.Spoofchk ||
		s.pf.Trust != o.pf.Trust || s.pf.MaxTxRate != o.pf.MaxTxRate || s.pf.LinkState != o.pf.LinkState {
		why = append(why, fmt.Sprintf("on the PF now %s, was %s", s, o))
	}
	return strings.Join(why, "; ")
}

// cniVF readies the node for a CNI check (cniState) and returns VF idx of
// p as it is then; it fails when setup/pfs did.
func (g *guest) cniVF(p *pf, idx int) (*vf, error) {
	if err := g.needs("setup/pfs"); err != nil {
		return nil, err
	}
	if err := g.cniState(); err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	return g.newVF(p, idx)
}

func (g *guest) newVF(p *pf, idx int) (*vf, error) {
	vfs := vfsOf(p.addr)
	if idx >= len(vfs) {
		return nil, fmt.Errorf("%s has %d VFs", p, len(vfs))
	}
	v := &vf{pf: p, idx: idx, addr: vfs[idx]}
	s, err := v.now()
	if err != nil {
		return nil, err
	}
	if s.name == "" {
		return nil, fmt.Errorf("VF %s has no netdev in the init netns", v)
	}
	if s.pf.Mac == nil || s.pf.Mac.String() == "00:00:00:00:00:00" {
		// A VF as a node has it once its netdev has been up: 5.10's igbvf
		// tells the PF its own (random) MAC when the netdev opens, and the
		// PF reports it as the VF's MAC from then on (6.12's keeps 00:…);
		// a VF never up would show the CNI's first ADD as a PF-side change
		// the CNI did not make. Seen in the 5.10 guest: every ADD/DEL, and
		// rdma/rxe-on-vf's own "ip link set up", left the PF reporting it.
		if err := ipCmd("link", "set", s.name, "up"); err != nil {
			return nil, err
		}
		if err := ipCmd("link", "set", s.name, "down"); err != nil {
			return nil, err
		}
		if s, err = v.now(); err != nil {
			return nil, err
		}
	}
	v.orig = s
	return v, nil
}

// cniCall is one call of the plugin as a runtime makes it.
type cniCall struct {
	command, containerID, netns, ifname string
	conf                                map[string]any
}

func (c cniCall) env() []string {
	return []string{
		"CNI_COMMAND=" + c.command, "CNI_CONTAINERID=" + c.containerID, "CNI_NETNS=" + c.netns,
		"CNI_IFNAME=" + c.ifname, "CNI_PATH=" + cniPath, "FASTPATH_CNI_NODE_CONFIG=" + cniNodeConfig,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=team;K8S_POD_NAME=" + c.containerID + ";K8S_POD_INFRA_CONTAINER_ID=" + c.containerID,
	}
}

func (c cniCall) stdin() string {
	b, _ := json.Marshal(c.conf)
	return string(b)
}

// do runs the call to its end.
func (c cniCall) do() cmdResult {
	r := run(2*time.Minute, c.env(), c.stdin(), cniBin)
	appendLog("cni-calls.log", fmt.Sprintf("%s %s %s: %s\n", c.command, c.containerID, c.netns, oneLine(r.stdout+" "+r.stderr+" "+fmt.Sprint(r.err))))
	return r
}

// start runs the call in the background, for a kill.
func (c cniCall) start() (*exec.Cmd, error) {
	cmd := exec.Command(cniBin)
	cmd.Env = append(os.Environ(), c.env()...)
	cmd.Stdin = strings.NewReader(c.stdin())
	return cmd, cmd.Start()
}

// writeCNINodeConfig writes the sriov CNI's node config at path (root's,
// 0644, as the CNI requires): its state dir, the harness's log dir (the
// confs' logFile is in it), no DRA driver, and deviceID trusted: no
// kubelet answers PodResources while the CNI checks run.
func writeCNINodeConfig(path, stateDir string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	data := fmt.Sprintf(`{"stateDir":%q,"logDir":"/tmp/e2e-logs","draSocket":"","deviceIDCheck":"off"}`, stateDir)
	return os.WriteFile(path, []byte(data), 0o644)
}

// conf is the network's conf for a VF; extra adds or overrides keys.
func conf(v *vf, ip string, extra map[string]any) map[string]any {
	c := map[string]any{
		"cniVersion": "1.1.0", "name": cniNet, "type": "sriov",
		"deviceID": v.addr, "stateDir": cniStateDir,
		"logLevel": "debug", "logFile": "/tmp/e2e-logs/cni.log",
	}
	if ip != "" {
		c["ipam"] = map[string]any{"type": "static", "addresses": []map[string]string{{"address": ip}}}
	}
	for k, val := range extra {
		c[k] = val
	}
	return c
}

// pod is a pod's network namespace, made as a runtime makes it.
type pod struct{ name, path string }

func newPod(name string) (*pod, error) {
	_ = ipCmd("netns", "del", name)
	if err := ipCmd("netns", "add", name); err != nil {
		return nil, err
	}
	return &pod{name: name, path: "/run/netns/" + name}, nil
}

func (p *pod) del() error { return ipCmd("netns", "del", p.name) }

// inPod runs a command in the pod's netns.
func (p *pod) exec(timeout time.Duration, args ...string) cmdResult {
	return run(timeout, nil, "", "/sbin/ip", append([]string{"netns", "exec", p.name}, args...)...)
}

// pins lists what the CNI left pinned: <pci>.netns files in its state dir
// and nsfs mounts under it.
func pins() []string {
	var out []string
	m, _ := filepath.Glob(filepath.Join(cniStateDir, "*.netns"))
	out = append(out, m...)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return append(out, err.Error())
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) > 4 && strings.HasPrefix(fs[4], cniStateDir) {
			out = append(out, "mount "+fs[4])
		}
	}
	return out
}

// pinsOf is what pins lists for one VF.
func pinsOf(addr string) []string {
	var out []string
	for _, p := range pins() {
		if strings.Contains(p, addr) {
			out = append(out, p)
		}
	}
	return out
}

// homeAndClean fails when the VF is not home, or state or pins are left.
func homeAndClean(v *vf) error {
	var why string
	_ = waitFor(5*time.Second, func() error {
		if why = v.home(); why != "" {
			return errNotYet
		}
		return nil
	})
	var errs []error
	if why != "" {
		errs = append(errs, fmt.Errorf("%s not back as it was: %s", v, why))
	}
	if p := pinsOf(v.addr); len(p) > 0 {
		errs = append(errs, fmt.Errorf("pins left: %v", p))
	}
	if _, err := os.Stat(filepath.Join(cniStateDir, v.addr+".json")); err == nil {
		errs = append(errs, fmt.Errorf("state left: %s.json", v.addr))
	}
	return errors.Join(errs...)
}

func lastLine(s string) string {
	l := strings.Split(strings.TrimSpace(s), "\n")
	return l[len(l)-1]
}
