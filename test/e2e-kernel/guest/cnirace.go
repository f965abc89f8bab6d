package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// The check cni/del-overtakes-add (issue 46): a runtime whose ADD timed
// out kills the plugin it called (Multus), not sriov, and sends the DEL
// while the orphaned ADD goes on. Each try starts an ADD, and 0-40 ms
// later the DEL of the same attachment, two processes; once both have
// returned, before the pod's netns goes, the VF must be home under its
// name with its settings on the PF as found and no state left; DEL must
// succeed, and ADD either succeed (the DEL then undid it) or fail with
// code 3 (its DEL came first). Before the attachment lock, 1 or 2 of 20
// such tries went wrong on each kernel.
func (g *guest) delOvertakesAdd(n int) error {
	v, err := g.cniVF(g.wireA, 0)
	if err != nil {
		return err
	}
	c := conf(v, "10.98.0.1/24", map[string]any{"vlan": 200})
	tAdd, tDel, addErr, err := calibrate(v, c)
	if err != nil {
		return err
	}
	if addErr != nil {
		return fmt.Errorf("a whole ADD with vlan 200 fails with no DEL beside it: %v", addErr)
	}
	logf("a whole ADD %v, DEL %v; %d tries of DEL 0-40 ms after ADD", tAdd.Round(time.Millisecond), tDel.Round(time.Millisecond), n)
	var added, refused, wrong int
	var examples []string
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("race-%d", i)
		p, err := newPod("pod-r")
		if err != nil {
			return err
		}
		add := cniCall{"ADD", id, p.path, "net1", c}
		var out bytes.Buffer
		cmd := exec.Command(cniBin)
		cmd.Env = append(os.Environ(), add.env()...)
		cmd.Stdin = strings.NewReader(add.stdin())
		cmd.Stdout = &out
		offset := time.Duration(rand.IntN(41)) * time.Millisecond
		if err := cmd.Start(); err != nil {
			return err
		}
		time.Sleep(offset)
		dr := cniCall{"DEL", id, p.path, "net1", c}.do()
		aerr := cmd.Wait()
		appendLog("cni-calls.log", fmt.Sprintf("ADD %s %s (DEL %v after it): %s %v\n", id, p.path, offset, oneLine(out.String()), aerr))

		var why []string
		if dr.err != nil {
			why = append(why, "DEL failed: "+oneLine(dr.String()))
		}
		switch code := cniCode(out.Bytes()); {
		case aerr == nil:
			added++
		case code == 3:
			refused++
		default:
			why = append(why, fmt.Sprintf("ADD failed with code %d, not 3: %s", code, oneLine(out.String())))
		}
		var home string
		_ = waitFor(2*time.Second, func() error {
			if home = v.home(); home != "" {
				return errNotYet
			}
			return nil
		})
		if home != "" {
			why = append(why, "VF not home: "+home)
		}
		if _, err := os.Stat(filepath.Join(cniStateDir, v.addr+".json")); err == nil {
			why = append(why, "state left")
		}
		if len(why) > 0 {
			wrong++
			if len(examples) < 5 {
				examples = append(examples, fmt.Sprintf("DEL %v after ADD: %s", offset, strings.Join(why, "; ")))
			}
			if err := g.rescue(v); err != nil {
				return fmt.Errorf("try %d: the VF could not be brought back for the next try: %w", i, err)
			}
		}
		_ = p.del()
	}
	// GC with no valid attachment removes the tombstones of the DELs that
	// came first.
	gc := conf(v, "", nil)
	delete(gc, "deviceID")
	gc["ipam"] = map[string]any{"type": "static"}
	gc["cni.dev/valid-attachments"] = []map[string]string{}
	if r := (cniCall{command: "GC", conf: gc}).do(); r.err != nil {
		return fmt.Errorf("GC: %s", r)
	}
	left, _ := filepath.Glob(filepath.Join(cniStateDir, "deleted-*.json"))
	logf("%d tries: ADD finished first %d (DEL undid it), ADD refused with code 3 %d, wrong outcomes %d; tombstones after GC %d",
		n, added, refused, wrong, len(left))
	for _, e := range examples {
		logf("  %s", e)
	}
	if wrong > 0 || len(left) > 0 {
		return fmt.Errorf("%d tries of DEL 0-40 ms after ADD: %d wrong outcomes, %d tombstones left after GC (first: %s)",
			n, wrong, len(left), strings.Join(examples, " | "))
	}
	return nil
}

// cniCode is the code of the CNI error a plugin printed, 0 when none.
func cniCode(stdout []byte) int {
	var e struct {
		Code int `json:"code"`
	}
	if json.Unmarshal(stdout, &e) != nil {
		return 0
	}
	return e.Code
}
