// Package soak is the fault-injection suite (issue 10, "the proof"): the
// sriov CNI plugin, built with failpoints, through thousands of ADD/DEL
// cycles with SIGKILL at every step boundary and at random moments,
// concurrent pods racing for VFs, pod netns deleted before DEL (or with no
// DEL at all, the next ADD reclaiming the VF), state files destroyed, a
// state dir full or read-only — and a leak check after every cycle.
// `make soak` runs it long; `make test` runs it short.
package soak

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

func syscallUnmount(path string) error { return syscall.Unmount(path, syscall.MNT_DETACH) }

// The step boundaries of the plugin (its failpoints): ADD's in order, and
// teardown's (DEL's, and ADD's rollback's).
var (
	addPoints = []string{"add:locked", "add:journal", "add:vf:vlan", "add:vf:mac", "add:vf:spoofchk", "add:vf:trust",
		"add:vf:link_state", "add:vf:tx_rate", "add:vf:guid", "add:link", "add:rdma", "add:ipam", "add:devinfo", "add:added"}
	delPoints      = []string{"del:locked", "teardown:ipam", "teardown:devinfo", "teardown:rdma", "teardown:link", "teardown:vf", "del:removed"}
	rollbackPoints = []string{"teardown:ipam", "teardown:devinfo", "teardown:rdma", "teardown:link", "teardown:vf"}
)

// kind is one kind of cycle; it returns the VFs whose netdev may come back
// down.
type kind struct {
	name string
	run  func(w *world, n int) map[*vf]bool
}

func TestSoakCNI(t *testing.T) {
	budget := testnet.Soak(t, 90*time.Second, 30*time.Minute)
	testnet.RequireRoot(t, "creates network namespaces and veth links standing in for VFs")
	maxCycles := 400
	if testnet.Long() {
		maxCycles = 100000
	}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	w := newWorld(t, seed)
	deadline := time.Now().Add(budget)
	w.leakCheckerSeesLeaks()

	kinds := []kind{
		{"clean", cycleClean},
		{"kill at an ADD step", cycleKillAdd},
		{"kill at a DEL step", cycleKillDel},
		{"kill at a rollback step", cycleKillRollback},
		{"kill ADD at random", cycleRandomAdd},
		{"kill DEL at random", cycleRandomDel},
		{"pods racing", cycleRace},
		{"netns gone before DEL", cycleNetnsGone},
		{"netns gone, no DEL, next ADD reclaims", cycleReclaim},
		{"garbage state", cycleGarbage},
		{"state dir full", cycleFull},
		{"state dir read-only", cycleReadOnly},
	}
	counts := map[string]int{}
	for cycle := 0; cycle < maxCycles && time.Now().Before(deadline); cycle++ {
		k := kinds[cycle%len(kinds)]
		allowDown := k.run(w, counts[k.name])
		counts[k.name]++
		w.fig.Cycles++
		w.fig.ByKind[k.name]++
		if ls := w.leaks(allowDown); len(ls) > 0 {
			w.fig.Leaks += len(ls)
			w.problem("after cycle %d (%s):\n  %s", cycle, k.name, strings.Join(ls, "\n  "))
			w.repair()
		} else {
			w.repair() // sets a VF that may come back down up again
		}
	}
	for k, points := range map[string][]string{"kill at an ADD step": addPoints, "kill at a DEL step": delPoints, "kill at a rollback step": rollbackPoints} {
		for _, p := range points {
			if !w.failpointsSeen[p] && counts[k] >= len(points) {
				w.problem("failpoint %s never killed the plugin", p)
			}
		}
	}
	testnet.SoakReport(t, "sriov-cni", "cycles", w.fig.Cycles, "calls", w.fig.Calls, "kills", w.fig.Kills,
		"failpoint-kills", w.fig.FailpointKills, "random-kills", w.fig.RandomKills, "leaks", w.fig.Leaks,
		"panics", w.fig.Panics, "wire-violations", w.fig.Violations, "reclaims", w.fig.Reclaims, "seconds", int(budget.Seconds()))
	t.Logf("cycles by kind: %v", w.fig.ByKind)
	for i, p := range w.problems {
		if i == 20 {
			t.Errorf("… and %d more", len(w.problems)-20)
			break
		}
		t.Error(p)
	}
}

// leakCheckerSeesLeaks proves the leak check can fail: an attachment left
// in place is found by each of its parts.
func (w *world) leakCheckerSeesLeaks() {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, full)
	if !w.mustAdd(p) {
		return
	}
	w.mu.Lock()
	delete(w.pods, p.ns) // as if the runtime had forgotten the pod
	w.mu.Unlock()
	found := strings.Join(w.leaks(nil), "\n")
	for _, want := range []string{v.netdev + " is not on the host", "VF settings on PF " + v.pf, "RDMA devices not back",
		"netns " + p.ns + " left", v.addr + ".json left", v.addr + ".lock left", "IPAM lease", p.cid + "-net1.json left"} {
		if !strings.Contains(found, want) {
			w.problem("the leak check misses %q in an attachment left in place; it found:\n%s", want, found)
		}
	}
	w.mu.Lock()
	w.pods[p.ns] = p
	w.mu.Unlock()
	w.del(p)
	w.gone(p)
	if ls := w.leaks(nil); len(ls) > 0 {
		w.problem("after the leak check's own attachment: %v", ls)
	}
}

func (w *world) mustAdd(p *pod) bool {
	o := w.exec(call{cmd: "ADD", p: p})
	if !o.ok {
		w.problem("ADD %s failed: code %d: %s\n%s", p.vf.addr, o.code, o.msg, o.stderr)
		return false
	}
	w.mu.Lock()
	w.addTimes = append(w.addTimes, o.took)
	w.mu.Unlock()
	return true
}

func (w *world) randomOpts() confOpts {
	ipam := []string{"host-local", "static", ""}[w.rng.IntN(3)]
	return confOpts{settings: w.rng.IntN(2) == 0, ipam: ipam, devinfo: w.rng.IntN(2) == 0}
}

var full = confOpts{settings: true, ipam: "host-local", devinfo: true}

func cycleClean(w *world, _ int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, w.randomOpts())
	w.mustAdd(p)
	w.del(p)
	w.gone(p)
	return nil
}

// pick is a VF whose link type reaches the failpoint.
func (w *world) pickFor(point string) *vf {
	for {
		v := w.take(1)[0]
		ok := true
		switch point {
		case "add:vf:vlan", "add:vf:mac":
			ok = !v.ib
		case "add:vf:guid":
			ok = v.ib
		}
		if ok {
			return v
		}
		w.release(v)
	}
}

func cycleKillAdd(w *world, n int) map[*vf]bool {
	point := addPoints[n%len(addPoints)]
	v := w.pickFor(point)
	defer w.release(v)
	p := w.newPod(v, full)
	if o := w.exec(call{cmd: "ADD", p: p, failpoint: point}); !o.killed {
		w.problem("ADD %s not killed at %s: ok=%v code %d %s", v.addr, point, o.ok, o.code, o.msg)
	}
	w.del(p)
	w.gone(p)
	return nil
}

func cycleKillDel(w *world, n int) map[*vf]bool {
	point := delPoints[n%len(delPoints)]
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, full)
	if w.mustAdd(p) {
		if o := w.exec(call{cmd: "DEL", p: p, failpoint: point}); !o.killed {
			w.problem("DEL %s not killed at %s: ok=%v code %d %s", v.addr, point, o.ok, o.code, o.msg)
		}
	}
	w.del(p)
	w.gone(p)
	return nil
}

// An ADD that fails at its very end (routes through a gateway off the
// subnet) rolls back; the kill lands in that rollback.
func cycleKillRollback(w *world, n int) map[*vf]bool {
	point := rollbackPoints[n%len(rollbackPoints)]
	v := w.take(1)[0]
	defer w.release(v)
	o := full
	o.ipam = "broken-routes"
	p := w.newPod(v, o)
	if out := w.exec(call{cmd: "ADD", p: p, failpoint: point}); !out.killed {
		w.problem("ADD %s rollback not killed at %s: ok=%v code %d %s", v.addr, point, out.ok, out.code, out.msg)
	}
	w.del(p)
	w.gone(p)
	return nil
}

func (w *world) randomKill(times []time.Duration, fallback time.Duration) time.Duration {
	w.mu.Lock()
	m := median(times, fallback)
	w.mu.Unlock()
	return time.Duration(1 + w.rng.Int64N(int64(m)*3/2))
}

func cycleRandomAdd(w *world, _ int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, w.randomOpts())
	w.exec(call{cmd: "ADD", p: p, killAfter: w.randomKill(w.addTimes, 60*time.Millisecond)})
	w.del(p)
	w.gone(p)
	return nil
}

func cycleRandomDel(w *world, _ int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, w.randomOpts())
	if w.mustAdd(p) {
		w.exec(call{cmd: "DEL", p: p, killAfter: w.randomKill(w.delTimes, 40*time.Millisecond)})
	}
	w.del(p)
	w.gone(p)
	return nil
}

// Pods race: three get a VF each, two more ask for the first one's VF at
// the same time; some of the ADDs are killed at random. At most one
// attachment per VF, the losers told to try again later.
func cycleRace(w *world, _ int) map[*vf]bool {
	vs := w.take(3)
	defer w.release(vs...)
	var pods []*pod
	for _, v := range append(vs, vs[0], vs[0]) {
		pods = append(pods, w.newPod(v, w.randomOpts()))
	}
	outs := make([]outcome, len(pods))
	var wg sync.WaitGroup
	for i, p := range pods {
		kill := time.Duration(0)
		if w.rng.IntN(4) == 0 {
			kill = w.randomKill(w.addTimes, 60*time.Millisecond)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			outs[i] = w.exec(call{cmd: "ADD", p: p, killAfter: kill})
		}()
	}
	wg.Wait()
	won := 0
	for _, i := range []int{0, 3, 4} {
		switch {
		case outs[i].ok:
			won++
		case !outs[i].killed && outs[i].code != 11 && !strings.Contains(outs[i].msg, "VF is in use"):
			w.problem("racing ADD for %s: code %d %s", pods[i].vf.addr, outs[i].code, outs[i].msg)
		}
	}
	if won > 1 {
		w.problem("%d pods attached %s at once", won, vs[0].addr)
	}
	for _, p := range pods {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.del(p)
		}()
	}
	wg.Wait()
	for _, p := range pods {
		w.gone(p)
	}
	return nil
}

// The pod's netns is deleted before DEL, as a runtime may. The kernel
// would return a physical VF to the host under its pod name (a veth dies
// with its netns instead), and its RDMA device with it: the test does what
// the kernel would, then deletes the netns.
func cycleNetnsGone(w *world, _ int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, w.randomOpts())
	if w.rng.IntN(2) == 0 {
		w.exec(call{cmd: "ADD", p: p, killAfter: w.randomKill(w.addTimes, 60*time.Millisecond)})
	} else {
		w.mustAdd(p)
	}
	w.kernelReturns(p)
	w.gone(p)
	w.del(p)
	return nil
}

// The pod's netns is deleted and its runtime, having lost the pod, never
// sends DEL: the next pod's ADD for the VF finds the netns gone and the VF
// back on the host, tears the lost attachment down and takes the VF. Every
// other time that ADD is killed inside the reclaim, at a teardown step;
// the runtime DELs the failed ADD and tries again in a new sandbox. A late DEL of the lost
// pod succeeds and leaves the new attachment alone.
func cycleReclaim(w *world, n int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	lost := w.newPod(v, w.randomOpts())
	if w.rng.IntN(2) == 0 {
		w.exec(call{cmd: "ADD", p: lost, killAfter: w.randomKill(w.addTimes, 60*time.Millisecond)})
	} else {
		w.mustAdd(lost)
	}
	w.kernelReturns(lost)
	w.gone(lost)
	_, err := os.Lstat(filepath.Join(w.stateDir, v.addr+".json"))
	held := err == nil
	next := w.newPod(v, w.randomOpts())
	if held && n%2 == 1 {
		point := rollbackPoints[(n/2)%len(rollbackPoints)]
		if o := w.exec(call{cmd: "ADD", p: next, failpoint: point}); !o.killed {
			w.problem("ADD %s reclaiming from a lost pod not killed at %s: ok=%v code %d %s", v.addr, point, o.ok, o.code, o.msg)
		}
		w.del(next)
		// The kubelet's retry is a new sandbox, with a new container
		// ID: an ADD of the one just deleted is refused (a DEL that
		// overtakes its ADD, docs/cni.md).
		next.cid = "c-" + testnet.RandHex(6)
	}
	o := w.exec(call{cmd: "ADD", p: next})
	switch {
	case !o.ok:
		w.problem("ADD %s after its pod was lost without a DEL: code %d %s\n%s", v.addr, o.code, o.msg, o.stderr)
	case held && strings.Contains(o.stderr, "reclaiming its VF"):
		w.mu.Lock()
		w.fig.Reclaims++
		w.mu.Unlock()
	}
	w.del(lost)
	if o.ok {
		if why := holds(next); why != "" {
			w.problem("after the lost pod's late DEL, %s: %s", v.addr, why)
		}
	}
	w.del(next)
	w.gone(next)
	return nil
}

// holds says what is wrong when p's netns does not hold its VF's netdev
// as ADD left it ("" when it does).
func holds(p *pod) string {
	n, err := netns.Open(p.nsPath)
	if err != nil {
		return err.Error()
	}
	defer n.Close()
	l, err := n.Handle().LinkByName(p.ifName)
	switch {
	case err != nil:
		return fmt.Sprintf("%s not in the pod: %v", p.ifName, err)
	case l.Attrs().Alias != p.vf.netdev:
		return fmt.Sprintf("%s in the pod has alias %q, want %q", p.ifName, l.Attrs().Alias, p.vf.netdev)
	}
	return ""
}

// kernelReturns does what the kernel does to a physical VF when its netns
// dies: every link but loopback goes to the initial netns (here, the
// test's), renamed dev<ifindex> when its name is taken there.
func (w *world) kernelReturns(p *pod) {
	n, err := netns.Open(p.nsPath)
	if err != nil {
		return
	}
	defer n.Close()
	host, err := netns.Current()
	if err != nil {
		w.problem("open own netns: %v", err)
		return
	}
	defer host.Close()
	ls, _ := n.Handle().LinkList()
	taken := links()
	for _, l := range ls {
		if l.Attrs().Name == "lo" {
			continue
		}
		if _, clash := taken[l.Attrs().Name]; clash {
			_ = n.Handle().LinkSetName(l, fmt.Sprintf("dev%d", l.Attrs().Index))
		}
		if err := n.Handle().LinkSetNsFd(l, host.Fd()); err != nil {
			w.problem("return %s to the host: %v", l.Attrs().Name, err)
		}
	}
	var st unix.Stat_t
	if unix.Fstat(n.Fd(), &st) == nil {
		w.rdmaForget(st.Ino)
	}
}

// rdmaForget sends every RDMA device in netns ino back to the host.
func (w *world) rdmaForget(ino uint64) {
	b, err := os.ReadFile(w.rdmaFile)
	if err != nil {
		return
	}
	out := strings.Builder{}
	out.WriteString("{")
	first := true
	for _, kv := range strings.Split(strings.Trim(strings.TrimSpace(string(b)), "{}"), ",") {
		if kv == "" || strings.HasSuffix(kv, fmt.Sprintf(":%d", ino)) {
			continue
		}
		if !first {
			out.WriteString(",")
		}
		out.WriteString(kv)
		first = false
	}
	out.WriteString("}")
	_ = os.WriteFile(w.rdmaFile, []byte(out.String()), 0o600)
}

// The state file is destroyed while the VF is in the pod. DEL sets it
// aside and brings back what the PCI address finds; the netdev may come
// back down (whether it was up was in the file). No VF settings or MTU in
// the conf: those too were only in the file.
func cycleGarbage(w *world, n int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, confOpts{ipam: []string{"host-local", "static"}[n%2], devinfo: true})
	if !w.mustAdd(p) {
		w.del(p)
		w.gone(p)
		return nil
	}
	path := filepath.Join(w.stateDir, v.addr+".json")
	b, _ := os.ReadFile(path)
	_ = os.Remove(path)
	switch n % 8 {
	case 0:
		_ = os.WriteFile(path, b[:len(b)/2], 0o600)
	case 1:
		junk := make([]byte, 1+w.rng.IntN(2000))
		for i := range junk {
			junk[i] = byte(w.rng.IntN(256))
		}
		_ = os.WriteFile(path, junk, 0o600)
	case 2:
		_ = os.WriteFile(path, []byte(strings.Replace(string(b), `"version": 2`, `"version": 7`, 1)), 0o600)
	case 3:
		_ = os.WriteFile(path, nil, 0o600)
	case 4:
		_ = os.Mkdir(path, 0o700)
	case 5:
		_ = os.Symlink("/etc/hostname", path)
	case 6:
		_ = os.Symlink(filepath.Join(w.dir, "nowhere"), path)
	case 7:
		_ = syscall.Mkfifo(path, 0o600)
	}
	w.del(p)
	if _, err := os.Lstat(path + ".bad"); err != nil {
		w.problem("garbage state of %s not set aside: %v", v.addr, err)
	}
	_ = os.RemoveAll(path + ".bad")
	w.gone(p)
	return map[*vf]bool{v: true}
}

// The state dir (a 256 KiB tmpfs) fills up, leaving 0-8 KiB: ADD stops
// where its journal cannot be written and rolls back; DEL on a full dir
// and after it is freed leaves nothing.
func cycleFull(w *world, n int) map[*vf]bool {
	v := w.take(1)[0]
	defer w.release(v)
	p := w.newPod(v, full)
	filler := filepath.Join(w.stateDir, "filler")
	var fs unix.Statfs_t
	if err := unix.Statfs(w.stateDir, &fs); err != nil {
		w.problem("statfs: %v", err)
		return nil
	}
	leave := []int64{0, 1024, 4096, 6144, 8192}[n%5]
	size := int64(fs.Bavail)*fs.Bsize - leave
	f, err := os.Create(filler)
	if err == nil {
		for size > 0 {
			chunk := min(size, 64<<10)
			if _, err := f.Write(make([]byte, chunk)); err != nil {
				break
			}
			size -= chunk
		}
		f.Close()
	}
	o := w.exec(call{cmd: "ADD", p: p})
	if !o.ok && o.code != 5 && o.code != 11 {
		w.problem("ADD %s on a full state dir: code %d %s", v.addr, o.code, o.msg)
	}
	w.exec(call{cmd: "DEL", p: p})
	_ = os.Remove(filler)
	w.del(p)
	w.gone(p)
	return nil
}

// The state dir turns read-only with an attachment in it: DEL fails with
// an I/O error (the VF is restored, the state cannot be removed) until it
// is writable again; an ADD meanwhile changes nothing.
func cycleReadOnly(w *world, _ int) map[*vf]bool {
	vs := w.take(2)
	defer w.release(vs...)
	p := w.newPod(vs[0], w.randomOpts())
	w.mustAdd(p)
	remount := func(opt string) {
		if out, err := exec.Command("mount", "-o", "remount,"+opt, w.stateDir).CombinedOutput(); err != nil {
			w.problem("remount %s: %v: %s", opt, err, out)
		}
	}
	remount("ro")
	if o := w.exec(call{cmd: "DEL", p: p}); o.ok {
		w.problem("DEL %s on a read-only state dir succeeded, leaving its state", vs[0].addr)
	}
	other := w.newPod(vs[1], w.randomOpts())
	if o := w.exec(call{cmd: "ADD", p: other}); o.ok {
		w.problem("ADD %s on a read-only state dir succeeded", vs[1].addr)
	}
	remount("rw")
	w.del(p)
	w.del(other)
	w.gone(p)
	w.gone(other)
	return nil
}
