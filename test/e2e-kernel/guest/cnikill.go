package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// The CNI kill checks (cni/sigkill-add, cni/sigkill-del): ADD or DEL
// SIGKILLed at points over their span, then DEL as a runtime sends it;
// the VF must come back and no pin stay.

// killTally is what a series of kills found.
type killTally struct {
	kills, killed, delFailed, retryFailed, stranded, pinned int
	examples                                                []string
}

func (k *killTally) note(limit int, format string, args ...any) {
	if len(k.examples) < limit {
		k.examples = append(k.examples, fmt.Sprintf(format, args...))
	}
}

// calibrate runs one whole ADD and DEL of c (a DEL that fails is retried,
// as a runtime does) and says how long each took and whether ADD succeeded.
func calibrate(v *vf, c map[string]any) (tAdd, tDel time.Duration, addErr error, err error) {
	p, err := newPod("pod-k")
	if err != nil {
		return 0, 0, nil, err
	}
	defer p.del()
	t := time.Now()
	if r := (cniCall{"ADD", "kill-cal", p.path, "net1", c}).do(); r.err != nil {
		addErr = fmt.Errorf("%s", oneLine(r.String()))
	}
	tAdd = time.Since(t)
	del := cniCall{"DEL", "kill-cal", p.path, "net1", c}
	t = time.Now()
	r := del.do()
	tDel = time.Since(t)
	if r.err != nil {
		// a DEL that fails without a kill (bug 2 of issue 37, where the
		// restore meets igbvf's EADDRNOTAVAIL): the runtime retries it
		logf("a whole DEL without a kill failed: %s", oneLine(r.String()))
		if r := del.do(); r.err != nil {
			return 0, 0, addErr, fmt.Errorf("a whole DEL without a kill failed twice: %s", r)
		}
	}
	_ = p.del()
	if err := homeAndClean(v); err != nil {
		return 0, 0, addErr, fmt.Errorf("after a whole ADD and DEL: %w", err)
	}
	return tAdd, tDel, addErr, nil
}

// killSeries SIGKILLs what (ADD, or DEL after a complete ADD) n times at
// points spread over span, each followed by DEL as a runtime sends it
// (and once more when it fails), and counts the VFs not back as they
// were and the pins left.
func (g *guest) killSeries(v *vf, c map[string]any, what string, span time.Duration, n int, k *killTally) error {
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("kill-%s-%d", strings.ToLower(what), k.kills)
		k.kills++
		p, err := newPod("pod-k")
		if err != nil {
			return err
		}
		call := cniCall{"ADD", id, p.path, "net1", c}
		if what == "DEL" {
			if r := call.do(); r.err != nil {
				return fmt.Errorf("kill %d: ADD before the killed DEL: %s", i, r)
			}
			call.command = "DEL"
		}
		delay := span * time.Duration(i) / time.Duration(n)
		cmd, err := call.start()
		if err != nil {
			return err
		}
		time.Sleep(delay)
		_ = cmd.Process.Signal(syscall.SIGKILL) // fails harmlessly when it has exited
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			k.killed++
		}
		del := cniCall{"DEL", id, p.path, "net1", c}
		if r := del.do(); r.err != nil {
			k.delFailed++
			k.note(3, "kill at %v: DEL: %s", delay.Round(time.Millisecond), oneLine(r.String()))
			if r := del.do(); r.err != nil {
				k.retryFailed++
				k.note(5, "kill at %v: retried DEL: %s", delay.Round(time.Millisecond), oneLine(r.String()))
			}
		}
		_ = p.del()
		var why string
		_ = waitFor(3*time.Second, func() error {
			if why = v.home(); why != "" {
				return errNotYet
			}
			return nil
		})
		if why != "" {
			k.stranded++
			k.note(6, "kill at %v: stranded: %s", delay.Round(time.Millisecond), why)
			if err := g.rescue(v); err != nil {
				return fmt.Errorf("kill %d: the VF could not be brought back for the next kill: %w", i, err)
			}
		}
		if pl := pinsOf(v.addr); len(pl) > 0 {
			k.pinned++
			k.note(6, "kill at %v: pins left %v", delay.Round(time.Millisecond), pl)
			for _, x := range pl {
				_ = syscall.Unmount(strings.TrimPrefix(x, "mount "), syscall.MNT_DETACH)
				_ = os.Remove(x)
			}
		}
	}
	return nil
}

// killLoop kills what n times with mac and vlan set, as most NADs have
// them. Where igb refuses the MAC (cni/add-mac-and-vlan) every ADD with
// one fails at that step and rolls back, so those kills reach only the
// steps up to there: then extra more kills run over a complete ADD (or
// its DEL) with vlan alone, and the check fails saying that the mac part
// could not be covered.
func (g *guest) killLoop(what string, n, extra int) error {
	v, err := g.cniVF(g.wireA, 0)
	if err != nil {
		return err
	}
	k := &killTally{}
	var gaps []string
	settings := []map[string]any{{"mac": "02:00:00:e2:0d:01", "vlan": 200}, {"vlan": 200}}
	for i, set := range settings {
		c := conf(v, "10.98.0.1/24", set)
		tAdd, tDel, addErr, err := calibrate(v, c)
		if err != nil {
			return err
		}
		if addErr != nil {
			logf("a whole ADD with %v fails without a kill: %v", set, addErr)
		}
		span, runs := tAdd, n
		if i > 0 {
			runs = extra
		}
		if what == "DEL" {
			span = tDel
			if addErr != nil {
				gaps = append(gaps, fmt.Sprintf("no complete ADD with %v to kill the DEL of", set))
				continue
			}
		}
		logf("%v: a whole ADD %v, DEL %v; %d kills of %s over 0-%v", set, tAdd.Round(time.Millisecond), tDel.Round(time.Millisecond), runs, what, span.Round(time.Millisecond))
		if err := g.killSeries(v, c, what, span, runs, k); err != nil {
			return err
		}
		if addErr == nil {
			break // mac and vlan covered every step: no second series
		}
		gaps = append(gaps, fmt.Sprintf("ADD with %v fails as a whole, so those kills reach only the steps before its failure and the rollback", set))
	}
	logf("%s kills: %d (%d killed mid-call), DEL failed %d (retried DEL failed %d), VFs stranded %d, pins left %d",
		what, k.kills, k.killed, k.delFailed, k.retryFailed, k.stranded, k.pinned)
	for _, e := range k.examples {
		logf("  %s", e)
	}
	if k.stranded > 0 || k.pinned > 0 || k.retryFailed > 0 {
		return fmt.Errorf("%d kills of %s: %d VFs stranded, %d pins left, %d DELs failed twice (first: %s)",
			k.kills, what, k.stranded, k.pinned, k.retryFailed, strings.Join(k.examples, " | "))
	}
	if len(gaps) > 0 {
		return fmt.Errorf("%d kills of %s (%d mid-call): 0 VFs stranded, 0 pins left; but %s", k.kills, what, k.killed, strings.Join(gaps, "; "))
	}
	return nil
}

// rescue puts a stranded VF back for the next kill, with the harness's
// own hands: every pod netns deleted (the kernel returns the VF), the
// state dropped, the VF's settings on the PF reset, its name restored.
func (g *guest) rescue(v *vf) error {
	ents, _ := os.ReadDir("/run/netns")
	for _, e := range ents {
		_ = ipCmd("netns", "del", e.Name())
	}
	for _, pl := range pins() {
		_ = syscall.Unmount(strings.TrimPrefix(pl, "mount "), syscall.MNT_DETACH)
		_ = os.Remove(pl)
	}
	_ = os.Remove(filepath.Join(cniStateDir, v.addr+".json"))
	if err := setNumVFs(v.pf.addr, 0); err != nil {
		return err
	}
	if err := setNumVFs(v.pf.addr, 3); err != nil {
		return err
	}
	s, err := v.now()
	if err != nil {
		return err
	}
	v.orig = s
	return nil
}
