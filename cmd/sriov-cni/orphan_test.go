package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// A runtime whose call timed out kills the delegating plugin (Multus thin),
// not this one: the plugin goes on, orphaned, and the pipes Multus read
// its stdout and stderr through have no reader any more. Found in make
// e2e-cluster's scale phase (the faults step, round 5): Multus gave up
// waiting for a slow API server, its DEL of the sriov delegate waited a
// minute for whereabouts, and the plugin, writing whereabouts' stderr to
// its own, died of SIGPIPE (Go's default for a write to a broken pipe on
// fd 1 or 2) with the VF's and the attachment's locks still on disk. The
// binary's DEL here loses its parent's pipes while its IPAM plugin runs;
// it must finish as if nothing happened: not killed by a signal, no lock
// left behind.
func TestBinaryOrphanedDelFinishes(t *testing.T) {
	h := newHost(t)
	v := dgxVFs()[2]
	h.standIn(v.netdev)
	ipam := newSlowIPAM(t)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	errR, errW, err := os.Pipe()
	require.NoError(t, err)
	cmd := h.startDel(t, v.addr, "orphaned-del", ipam, outW, errW)
	outW.Close()
	errW.Close()
	ipam.waitStarted(t)
	// The parent is killed: nobody reads the plugin's output any more.
	outR.Close()
	errR.Close()
	ipam.release(t)
	err = cmd.Wait()
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	require.False(t, ws.Signaled(), "the orphaned DEL was killed by %v", ws.Signal())
	require.NoError(t, err, "the orphaned DEL")
	require.Empty(t, h.locks(t, ""), "locks the orphaned DEL left")
}

// A DEL truly killed (SIGKILL: no handler runs) while it holds its VF's
// lock leaves the lock file; once nobody holds it, the next DEL on the
// node, of any attachment, removes it (Store.Sweep), not only an ADD
// that takes that VF again.
func TestBinaryDelSweepsWhatAKilledDelLeft(t *testing.T) {
	h := newHost(t)
	killed, next := dgxVFs()[3], dgxVFs()[4]
	h.standIn(killed.netdev)
	h.standIn(next.netdev)
	ipam := newSlowIPAM(t)
	cmd := h.startDel(t, killed.addr, "killed-del", ipam, nil, nil)
	ipam.waitStarted(t)
	require.NoError(t, cmd.Process.Kill())
	_ = cmd.Wait()
	require.Equal(t, []string{killed.addr + ".lock"}, h.locks(t, killed.addr), "the killed DEL's VF lock")
	// Its IPAM child holds the lock it inherited until it ends.
	ipam.release(t)
	require.Eventually(t, func() bool { return ipam.done() }, 30*time.Second, 10*time.Millisecond, "the IPAM plugin ended")

	cmd = h.startDel(t, next.addr, "next-del", ipam, nil, nil)
	require.NoError(t, cmd.Wait(), "the next DEL")
	require.Empty(t, h.locks(t, ""), "VF locks left after the next DEL")
}

// slowIPAM is an IPAM plugin (a shell script) whose every call says it
// started, waits to be released, writes a line to its stderr (which the
// plugin copies to its own) and succeeds.
type slowIPAM struct{ dir, started, released, ended string }

func newSlowIPAM(t *testing.T) *slowIPAM {
	d := t.TempDir()
	s := &slowIPAM{dir: d, started: filepath.Join(d, "started"), released: filepath.Join(d, "release"), ended: filepath.Join(d, "ended")}
	script := fmt.Sprintf("#!/bin/sh\ncat >/dev/null\ntouch %s\nwhile [ ! -e %s ]; do sleep 0.01; done\n"+
		"echo 'slow-ipam: released after a slow API server' >&2\ntouch %s\n", s.started, s.released, s.ended)
	require.NoError(t, os.WriteFile(filepath.Join(d, "slow-ipam"), []byte(script), 0o755))
	return s
}

func (s *slowIPAM) waitStarted(t *testing.T) {
	require.Eventually(t, func() bool { _, err := os.Stat(s.started); return err == nil }, 30*time.Second, 10*time.Millisecond,
		"the IPAM plugin's DEL started")
}

func (s *slowIPAM) release(t *testing.T) { require.NoError(t, os.WriteFile(s.released, nil, 0o644)) }

func (s *slowIPAM) done() bool { _, err := os.Stat(s.ended); return err == nil }

// startDel starts the binary's DEL of (rdma, cid, net1) on vf, as Multus
// runs it: deviceID in the conf, IPAM the slow plugin; stdout and stderr
// go to out and errw (nil: discarded).
func (h *host) startDel(t *testing.T, vf, cid string, ipam *slowIPAM, out, errw *os.File) *exec.Cmd {
	bin := h.cni.Path[0]
	conf := fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rdma","type":"sriov","deviceID":%q,"stateDir":%q,"ipam":{"type":"slow-ipam"}}`,
		vf, filepath.Join(h.dir, "state"))
	cmd := exec.Command(filepath.Join(bin, "sriov"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND=DEL", "CNI_CONTAINERID="+cid, "CNI_NETNS="+h.pod(),
		"CNI_IFNAME=net1", "CNI_PATH="+bin+string(filepath.ListSeparator)+ipam.dir)
	cmd.Stdin = strings.NewReader(conf)
	if out != nil {
		cmd.Stdout = out
	}
	if errw != nil {
		cmd.Stderr = errw
	}
	require.NoError(t, cmd.Start())
	return cmd
}

// locks lists the VF lock files (<pci>.lock) in the state dir, of vf
// only when vf is not "".
func (h *host) locks(t *testing.T, vf string) []string {
	ents, err := os.ReadDir(filepath.Join(h.dir, "state"))
	require.NoError(t, err)
	var l []string
	for _, e := range ents {
		n := e.Name()
		if strings.HasSuffix(n, ".lock") && !strings.HasPrefix(n, "attach-") && (vf == "" || n == vf+".lock") {
			l = append(l, n)
		}
	}
	return l
}
