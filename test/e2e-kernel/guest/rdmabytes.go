package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// RDMA bytes between two pods (issue 47): each pod gets a VF of one of
// the two wire PFs (one QEMU hub: one wire) through the sriov CNI with a
// NAD's settings (VLAN, MTU, MAC); inside each pod's netns a soft-RoCE
// (rdma_rxe) device is made over net1, and rdma-core's ibv_rc_pingpong
// and perftest's ib_write_bw -R (rdma_cm) run between them, Debian's own
// binaries (run.sh copies them into the initramfs). Where rdma_rxe is
// not netns-aware (its UDP socket, port 4791, stays in the initial
// netns: 6.12 and older) RC traffic between pods flushes, and the checks
// SKIP saying so. A server left waiting with its QP open in pod B holds
// one while the CNI kill loops run; then DEL with the soft device and
// the live QP still there must bring each VF home whole.

// rdmaPod is one of the two pods: its VF, netns, address and rxe device.
type rdmaPod struct {
	v    *vf
	p    *pod
	ip   string // without the prefix length
	rxe  string
	conf map[string]any
}

// rdmaBytes is what the RDMA-bytes checks share.
type rdmaBytes struct {
	a, b      *rdmaPod
	holder    *exec.Cmd // pod B's ibv_rc_pingpong server, waiting with its QP
	holderOut *lockedBuffer
}

const (
	rocePort   = 4791 // RoCEv2's UDP port, rdma_rxe's socket
	rdmaVLAN   = 300
	rdmaMTU    = 1400
	rdmaSubnet = "10.96.0."
)

// rdmaBytesChecks are the checks before the kill loops; rdmaBytesAfter
// the one after them.
func rdmaBytesChecks(rb *rdmaBytes) []check {
	return []check{
		{"cni/rdma-pods", func(g *guest) error { return g.rdmaPods(rb) }},
		{"cni/rdma-rc-pingpong", func(g *guest) error {
			if err := g.needs("cni/rdma-pods"); err != nil {
				return err
			}
			mbit, err := rb.rcPingpong()
			g.passNote = mbit + " Mbit/s"
			return err
		}},
		{"cni/rdma-write-bw", func(g *guest) error {
			if err := g.needs("cni/rdma-pods"); err != nil {
				return err
			}
			mbs, err := rb.writeBW()
			g.passNote = mbs + " MB/s"
			return err
		}},
		{"cni/rdma-qp-held", func(g *guest) error {
			// a QP open in pod B while the kill loops run
			if err := g.needs("cni/rdma-pods"); err != nil {
				return err
			}
			return rb.holdQP()
		}},
	}
}

func rdmaBytesAfter(rb *rdmaBytes) []check {
	return []check{
		{"cni/rdma-del-with-live-qp", func(g *guest) error {
			if err := g.needs("cni/rdma-pods"); err != nil {
				return err
			}
			return rb.delWithLiveQP()
		}},
	}
}

// withRDMABytes puts the RDMA-bytes checks around the CNI kill loops
// (cni/sigkill-add, cni/sigkill-del).
func withRDMABytes(cs []check) []check {
	rb := &rdmaBytes{}
	var out []check
	for _, c := range cs {
		if c.name == "cni/sigkill-add" {
			out = append(out, rdmaBytesChecks(rb)...)
		}
		out = append(out, c)
		// after the kill loops and before cni/del-overtakes-add, whose GC
		// (no valid attachment) would collect these pods' attachments
		if c.name == "cni/sigkill-del" {
			out = append(out, rdmaBytesAfter(rb)...)
		}
	}
	return out
}

// loadRxe loads rdma_rxe and what the verbs tools need (rdma/rxe-on-vf
// does the same later; loading twice is nothing).
func loadRxe() error {
	if !kernelModuleListed("/etc/e2e-modules-absent", "crc32_generic") {
		if err := modprobe("crc32_generic"); err != nil {
			return err
		}
	}
	return modprobe("rdma_rxe", "ib_uverbs", "rdma_ucm")
}

// rdmaPods attaches the two pods and makes their rxe devices; it skips
// where rdma_rxe is not netns-aware, after DEL has brought both VFs home.
func (g *guest) rdmaPods(rb *rdmaBytes) error {
	if err := g.needs("setup/pfs"); err != nil {
		return err
	}
	if err := loadRxe(); err != nil {
		return err
	}
	if err := g.cniState(); err != nil {
		return fmt.Errorf("harness: %w", err)
	}
	// VF 2 of each wire PF: cniState and the checks between here and
	// cni/rdma-del-with-live-qp use VFs 0 and 1. Both PFs' VFs are made
	// before either pod's ADD: VFs made after a netdev left for a pod
	// would take its free name (eth5), and DEL would find it taken.
	for _, p := range []*pf{g.wireA, g.wireB} {
		if vfs := vfsOf(p.addr); len(vfs) < 3 || driverOf(vfs[2]) != "igbvf" || len(netdevsOf(vfs[2])) != 1 {
			if err := setNumVFs(p.addr, 0); err != nil {
				return err
			}
			if err := setNumVFs(p.addr, 3); err != nil {
				return err
			}
		}
	}
	for i, p := range []*pf{g.wireA, g.wireB} {
		v, err := g.newVF(p, 2)
		if err != nil {
			return err
		}
		name := string(rune('a' + i))
		rp := &rdmaPod{v: v, ip: fmt.Sprintf("%s%d", rdmaSubnet, i+1), rxe: "rxe" + name}
		rp.conf = conf(v, rp.ip+"/24", map[string]any{
			"vlan": rdmaVLAN, "mtu": rdmaMTU, "mac": fmt.Sprintf("02:00:00:e2:0f:0%d", i+1), "spoofchk": "off",
		})
		if rp.p, err = newPod("pod-r" + name); err != nil {
			return err
		}
		if i == 0 {
			rb.a = rp
		} else {
			rb.b = rp
		}
		if r := rp.add(); r.err != nil {
			return errors.Join(fmt.Errorf("ADD %s with vlan %d, mtu %d, mac: %s", v, rdmaVLAN, rdmaMTU, r), rb.teardown())
		}
	}
	// the NAD's settings, as the kernel shows them
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		s, err := rp.v.now()
		if err != nil {
			return errors.Join(err, rb.teardown())
		}
		wantMAC := rp.conf["mac"].(string)
		if s.pf.Vlan != rdmaVLAN || s.pf.Mac.String() != wantMAC {
			return errors.Join(fmt.Errorf("%s on the PF after ADD: %s; want vlan %d mac %s", rp.v, s, rdmaVLAN, wantMAC), rb.teardown())
		}
		r := rp.p.exec(10*time.Second, "/bin/cat", "/sys/class/net/net1/mtu", "/sys/class/net/net1/address")
		if f := strings.Fields(r.stdout); len(f) != 2 || f[0] != strconv.Itoa(rdmaMTU) || f[1] != wantMAC {
			return errors.Join(fmt.Errorf("net1 in %s: mtu and MAC %q, want %d %s (%s)", rp.p.name, r.stdout, rdmaMTU, wantMAC, r), rb.teardown())
		}
	}
	// soft-RoCE over net1, made inside each pod
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		if err := addRxe(rp.p.name, rp.rxe, "net1"); err != nil {
			return errors.Join(fmt.Errorf("in %s: %w", rp.p.name, err), rb.teardown())
		}
	}
	// netns-aware rdma_rxe opens its UDP socket in the netdev's netns
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		r := rp.p.exec(10*time.Second, "/bin/cat", "/proc/net/udp", "/proc/net/udp6")
		if r.err != nil {
			return errors.Join(fmt.Errorf("/proc/net/udp in %s: %s", rp.p.name, r), rb.teardown())
		}
		if !strings.Contains(strings.ToUpper(r.stdout), fmt.Sprintf(":%04X ", rocePort)) {
			err := rb.teardown()
			if err != nil {
				return fmt.Errorf("DEL of the pods, their rxe devices still there: %w", err)
			}
			return skipf("kernel %s: rdma_rxe is not netns-aware (%s over %s's net1 is ACTIVE, but no UDP socket on port %d is in that netns: rxe's socket lives in the initial one, and RC traffic between pods flushes); DEL with the soft devices there brought both VFs home",
				kernelRelease(), rp.rxe, rp.p.name, rocePort)
		}
	}
	// both pods reach each other over the wire (VLAN, MTU) before verbs
	if err := waitFor(30*time.Second, func() error {
		return rb.a.p.exec(20*time.Second, "/bin/busybox", "ping", "-c", "1", "-W", "2", "-s", strconv.Itoa(rdmaMTU-28), rb.b.ip).err
	}); err != nil {
		return fmt.Errorf("ping -s %d from %s to %s (vlan %d): %w", rdmaMTU-28, rb.a.p.name, rb.b.ip, rdmaVLAN, err)
	}
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		logf("%s: %s over net1 (%s, %s/24, vlan %d, mtu %d), its UDP socket on %d in the pod's netns", rp.p.name, rp.rxe, rp.v, rp.ip, rdmaVLAN, rdmaMTU, rocePort)
	}
	return nil
}

func (rp *rdmaPod) add() cmdResult {
	return cniCall{"ADD", rp.p.name, rp.p.path, "net1", rp.conf}.do()
}

func (rp *rdmaPod) del() cmdResult {
	return cniCall{"DEL", rp.p.name, rp.p.path, "net1", rp.conf}.do()
}

// teardown DELs both pods' attachments (rxe devices and all), deletes
// their netns and says whether each VF came home whole.
func (rb *rdmaBytes) teardown() error {
	rb.stopHolder()
	var errs []error
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		if rp == nil || rp.p == nil {
			continue
		}
		if r := rp.del(); r.err != nil {
			errs = append(errs, fmt.Errorf("DEL %s: %s", rp.p.name, r))
		}
		errs = append(errs, rp.p.del(), homeAndClean(rp.v))
	}
	return errors.Join(errs...)
}

// roceV2GID is the index of the RoCE v2 GID of ip in device rxe's table,
// and whether one is there: the pod's own IPv4 GID (::ffff:a.b.c.d).
func roceV2GID(rxe, ip string) (int, error) {
	base := filepath.Join("/sys/class/infiniband", rxe, "ports/1")
	want := net.ParseIP(ip).To16()
	var seen []string
	for i := 0; i < 16; i++ {
		gid, err := readAttr(filepath.Join(base, "gids", strconv.Itoa(i)))
		if err != nil {
			break
		}
		typ, _ := readAttr(filepath.Join(base, "gid_attrs/types", strconv.Itoa(i)))
		if g := net.ParseIP(gid); g != nil && g.Equal(want) {
			if typ == "RoCE v2" {
				return i, nil
			}
		}
		if !strings.HasPrefix(gid, "0000:0000:0000:0000:0000:0000") {
			seen = append(seen, fmt.Sprintf("%d %s %s", i, gid, typ))
		}
	}
	return 0, fmt.Errorf("%s has no RoCE v2 GID for %s: %v", rxe, ip, seen)
}

// onPTY is args as util-linux's script runs them, on a pty: the verbs
// tools' stdout comes line by line (a pipe would hold what a tool that
// hangs printed).
func onPTY(args ...string) []string {
	return []string{"/usr/bin/script", "-q", "-e", "-f", "-c", strings.Join(args, " "), "/dev/null"}
}

// start runs a command in a pod's netns in the background, on a pty.
func (rp *rdmaPod) start(args ...string) (*exec.Cmd, *lockedBuffer, error) {
	cmd := exec.Command("/sbin/ip", append([]string{"netns", "exec", rp.p.name}, onPTY(args...)...)...)
	out := &lockedBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	return cmd, out, cmd.Start()
}

// lockedBuffer is an output buffer a running command writes to while the
// check reads it.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.ReplaceAll(l.b.String(), "\r", "")
}

// counters is what the two rxe devices and their QPs show: the part of a
// failure that says where the packets went.
func (rb *rdmaBytes) counters() string {
	var out []string
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		r := rp.p.exec(10*time.Second, "/usr/bin/rdma", "resource", "show", "qp", "link", rp.rxe+"/1")
		out = append(out, fmt.Sprintf("%s QPs: %s", rp.rxe, oneLine(r.stdout)))
		dir := filepath.Join("/sys/class/infiniband", rp.rxe, "ports/1/hw_counters")
		ents, _ := os.ReadDir(dir)
		var cs []string
		for _, e := range ents {
			if v, _ := readAttr(filepath.Join(dir, e.Name())); v != "" && v != "0" {
				cs = append(cs, e.Name()+"="+v)
			}
		}
		out = append(out, fmt.Sprintf("%s counters: %s", rp.rxe, strings.Join(cs, " ")))
	}
	return strings.Join(out, "; ")
}

// serverAndClient runs server in pod A and then client in pod B (again
// while it cannot connect yet: the server needs a moment to listen) and
// returns both outputs.
func (rb *rdmaBytes) serverAndClient(timeout time.Duration, server, client []string) (string, string, error) {
	srv, sout, err := rb.a.start(server...)
	if err != nil {
		return "", "", err
	}
	done := make(chan error, 1)
	go func() { done <- srv.Wait() }()
	var cr cmdResult
	deadline := time.Now().Add(timeout)
	for {
		cr = run(timeout, nil, "", "/sbin/ip", append([]string{"netns", "exec", rb.b.p.name}, onPTY(client...)...)...)
		if cr.err == nil || time.Now().After(deadline) {
			break
		}
		select {
		case err := <-done:
			return sout.String(), cr.stdout + cr.stderr, fmt.Errorf("the server in %s exited (%v) while the client failed: %s", rb.a.p.name, err, oneLine(cr.String()))
		case <-time.After(time.Second):
		}
	}
	var serr error
	select {
	case serr = <-done:
	case <-time.After(timeout):
		_ = srv.Process.Kill()
		serr = fmt.Errorf("the server did not finish in %v", timeout)
		<-done
	}
	if cr.err != nil {
		_ = srv.Process.Kill()
		return sout.String(), cr.stdout + cr.stderr, fmt.Errorf("client in %s: %s (%s)", rb.b.p.name, oneLine(cr.String()+" "+cr.stdout), rb.counters())
	}
	return sout.String(), cr.stdout + cr.stderr, serr
}

var (
	pingpongGID  = regexp.MustCompile(`(local|remote) address:.*GID ([0-9a-fA-F:.]+)`)
	pingpongRate = regexp.MustCompile(`(\d+) bytes in ([0-9.]+) seconds = ([0-9.]+) Mbit/sec`)
)

// rcPingpong: ibv_rc_pingpong over the pods' RoCE v2 IPv4 GIDs.
func (rb *rdmaBytes) rcPingpong() (string, error) {
	ga, err := roceV2GID(rb.a.rxe, rb.a.ip)
	if err != nil {
		return "", err
	}
	gb, err := roceV2GID(rb.b.rxe, rb.b.ip)
	if err != nil {
		return "", err
	}
	const iters = "200"
	sout, cout, err := rb.serverAndClient(90*time.Second,
		[]string{"/usr/bin/ibv_rc_pingpong", "-d", rb.a.rxe, "-g", strconv.Itoa(ga), "-n", iters},
		[]string{"/usr/bin/ibv_rc_pingpong", "-d", rb.b.rxe, "-g", strconv.Itoa(gb), "-n", iters, rb.a.ip})
	appendLog("rdma-bytes.log", "ibv_rc_pingpong server:\n"+sout+"\nclient:\n"+cout+"\n")
	if err != nil {
		return "", fmt.Errorf("ibv_rc_pingpong: %w (server: %s)", err, oneLine(sout))
	}
	if err := gidsUsed(pingpongGID, cout, rb.b.ip, rb.a.ip, net.ParseIP); err != nil {
		return "", fmt.Errorf("ibv_rc_pingpong's client: %w", err)
	}
	m := pingpongRate.FindStringSubmatch(cout)
	if m == nil {
		return "", fmt.Errorf("ibv_rc_pingpong's client printed no rate: %s", oneLine(cout))
	}
	logf("ibv_rc_pingpong %s (%s, RoCE v2 GID %d) -> %s (%s, RoCE v2 GID %d): %s bytes in %s s, the GIDs used the pods' own", rb.b.rxe, rb.b.ip, gb, rb.a.rxe, rb.a.ip, ga, m[1], m[2])
	return m[3], nil
}

// gidsUsed checks that out's local and remote GIDs are the IPv4-mapped
// addresses of local and remote.
func gidsUsed(re *regexp.Regexp, out, local, remote string, parse func(string) net.IP) error {
	got := map[string]net.IP{}
	for _, m := range re.FindAllStringSubmatch(out, -1) {
		got[m[1]] = parse(m[2])
	}
	for side, ip := range map[string]string{"local": local, "remote": remote} {
		if g := got[side]; g == nil || !g.Equal(net.ParseIP(ip)) || g.To4() == nil {
			return fmt.Errorf("%s GID %v, want ::ffff:%s (the pod's own IPv4 GID)", side, got[side], ip)
		}
	}
	return nil
}

var (
	// perftest prints a GID as 16 decimal bytes: 00:00:…:255:255:10:96:00:01
	perftestGID = regexp.MustCompile(`(?s)(local|remote) address:[^\n]*\n\s*GID: ([0-9:]+)`)
	// #bytes #iterations BW peak[MB/sec] BW average[MB/sec] MsgRate[Mpps]
	perftestBW = regexp.MustCompile(`(?m)^\s*(\d+)\s+(\d+)\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$`)
)

func perftestIP(s string) net.IP {
	parts := strings.Split(s, ":")
	if len(parts) != 16 {
		return nil
	}
	b := make(net.IP, 16)
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n > 255 {
			return nil
		}
		b[i] = byte(n)
	}
	return b
}

// writeBW: ib_write_bw -R, the connection made by rdma_cm, which picks
// the GID by the pods' addresses.
func (rb *rdmaBytes) writeBW() (string, error) {
	if _, err := roceV2GID(rb.b.rxe, rb.b.ip); err != nil {
		return "", err
	}
	// 100 writes of 64 KiB: 7 s at the 0.9 MB/s of a load of 15. At a
	// load of 55 the guest stalls longer than RC's ACK timeout (14: 67 ms)
	// times 7 retries and the QP failed (completer_retry_err): -u 20, 4.3 s
	args := []string{"/usr/bin/ib_write_bw", "-R", "-F", "-s", "65536", "-n", "100", "-u", "20"}
	sout, cout, err := rb.serverAndClient(5*time.Minute,
		append(args, "-d", rb.a.rxe),
		append(args, "-d", rb.b.rxe, rb.a.ip))
	appendLog("rdma-bytes.log", "ib_write_bw -R server:\n"+sout+"\nclient:\n"+cout+"\n")
	if err != nil {
		return "", fmt.Errorf("ib_write_bw -R: %w (server: %s)", err, oneLine(sout))
	}
	if err := gidsUsed(perftestGID, cout, rb.b.ip, rb.a.ip, perftestIP); err != nil {
		return "", fmt.Errorf("ib_write_bw's client: %w", err)
	}
	m := perftestBW.FindStringSubmatch(cout)
	if m == nil {
		return "", fmt.Errorf("ib_write_bw's client printed no bandwidth: %s", oneLine(cout))
	}
	logf("ib_write_bw -R %s -> %s: %s iterations of %s bytes, peak %s MB/s, average %s MB/s; GIDs the pods' own", rb.b.rxe, rb.a.rxe, m[2], m[1], m[3], m[4])
	return m[4], nil
}

// holdQP starts an ibv_rc_pingpong server in pod B that waits for a
// client that never comes, its QP open, and sees the QP in RDMA netlink.
func (rb *rdmaBytes) holdQP() error {
	cmd, out, err := rb.b.start("/usr/bin/ibv_rc_pingpong", "-d", rb.b.rxe, "-p", "18600")
	if err != nil {
		return err
	}
	rb.holder = cmd
	rb.holderOut = out
	return waitFor(30*time.Second, func() error {
		return rb.qpOpen()
	})
}

// qpOpen says whether pod B's rxe device has an RC QP (rdma resource show).
func (rb *rdmaBytes) qpOpen() error {
	r := rb.b.p.exec(10*time.Second, "/usr/bin/rdma", "resource", "show", "qp", "link", rb.b.rxe+"/1")
	if r.err != nil || !strings.Contains(r.stdout, "type RC") {
		return fmt.Errorf("no RC QP on %s in %s: %s", rb.b.rxe, rb.b.p.name, oneLine(r.String()))
	}
	return nil
}

func (rb *rdmaBytes) stopHolder() {
	if rb.holder != nil {
		_ = rb.holder.Process.Signal(syscall.SIGKILL)
		_ = rb.holder.Wait()
		rb.holder = nil
	}
}

// delWithLiveQP: the QP held through the kill loops is still open; DEL of
// pod B with it and its rxe device there, then pod A's (rxe, no QP):
// each VF home whole, the netns deleted after.
func (rb *rdmaBytes) delWithLiveQP() error {
	var errs []error
	if rb.holder == nil {
		errs = append(errs, errors.New("no QP holder (cni/rdma-qp-held failed)"))
	} else if err := rb.qpOpen(); err != nil {
		errs = append(errs, fmt.Errorf("the QP held through the kill loops: %w (holder: %s)", err, oneLine(rb.holderOut.String())))
	} else {
		logf("%s's QP in %s open through the kill loops", rb.b.rxe, rb.b.p.name)
	}
	for _, rp := range []*rdmaPod{rb.b, rb.a} {
		t := time.Now()
		r := rp.del()
		if r.err != nil {
			errs = append(errs, fmt.Errorf("DEL %s (its %s there%s): %s", rp.p.name, rp.rxe, map[bool]string{true: ", a QP open", false: ""}[rp == rb.b && rb.holder != nil], r))
			continue
		}
		if err := homeAndClean(rp.v); err != nil {
			errs = append(errs, fmt.Errorf("after DEL of %s with %s there: %w", rp.p.name, rp.rxe, err))
			continue
		}
		logf("DEL %s with %s%s there: %v, %s home whole", rp.p.name, rp.rxe, map[bool]string{true: " and a live QP", false: ""}[rp == rb.b && rb.holder != nil], time.Since(t).Round(time.Millisecond), rp.v)
	}
	rb.stopHolder()
	for _, rp := range []*rdmaPod{rb.a, rb.b} {
		errs = append(errs, rp.p.del())
	}
	// the soft devices go with their netdevs (the kernel's answer), once the
	// QP's process is gone
	if err := waitFor(20*time.Second, func() error {
		d, err := rdmaDevices("")
		if err != nil {
			return err
		}
		for _, rp := range []*rdmaPod{rb.a, rb.b} {
			if d[rp.rxe] != "" {
				return fmt.Errorf("%s still listed: %s", rp.rxe, d[rp.rxe])
			}
		}
		return nil
	}); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
