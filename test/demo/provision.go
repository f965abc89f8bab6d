package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

// provision is the demo's first step: the seed's SriovNetworkNodePolicy on
// a copy of the DGX host that starts with no VF (as after a reboot). The
// plan is the real binary's (`provision --dry-run`); it is carried out
// through provisiontest's kernel stand-in, which lays the VFs out in the
// copy's sysfs as the kernel and mlx5 would (this machine has no SR-IOV
// PF); discover then shows them in the policy's pool.
func (d *demo) provision(ctx context.Context, bin, policy string) error {
	d.step("VFs from the seed's SriovNetworkNodePolicy (%s) on a DGX host that has none", policy)
	fmt.Fprintln(d.out, "  (the host: a copy of testdata/sysfs/dgx-h100-novfs, the DGX after a reboot, before anything made VFs)")
	host := filepath.Join(d.work, "node-novfs")
	if err := fixture.Write(host, "dgx-h100-novfs"); err != nil {
		return err
	}
	state := filepath.Join(d.work, "provision-state")
	dp := filepath.Join(bin, "rdma-device-plugin")
	show := func(title string, keep func(string) bool, args ...string) error {
		out, err := exec.CommandContext(ctx, dp, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v\n%s", dp, strings.Join(args, " "), err, out)
		}
		fmt.Fprintf(d.out, "  $ rdma-device-plugin %s\n", title)
		sc := bufio.NewScanner(bytes.NewReader(out))
		for sc.Scan() {
			if keep(sc.Text()) {
				fmt.Fprintf(d.out, "    %s\n", sc.Text())
			}
		}
		return nil
	}
	pfRows := func(l string) bool {
		return strings.HasPrefix(l, "PCI ") || (strings.HasPrefix(l, "0000:") && strings.Contains(l, "policy")) || strings.HasPrefix(l, "pool ")
	}
	discoverArgs := []string{"discover", "--host-root", host, "--policy", policy}
	if err := show("discover --policy "+policy+"   (PFs the policy owns)", pfRows, discoverArgs...); err != nil {
		return err
	}
	provArgs := []string{"provision", "--policy", policy, "--host-root", host, "--provision-state-dir", state,
		"--pod-resources-socket", "", "--cni-state-dir", ""}
	if err := show("provision --dry-run   (the PFs, then the first PF's first steps)", firstSteps(), append(provArgs, "--dry-run")...); err != nil {
		return err
	}

	ps, err := provision.Load(policy)
	if err != nil {
		return err
	}
	snap, err := nic.NewScanner(host).Scan()
	if err != nil {
		return err
	}
	k := provisiontest.New(host)
	k.ProbeDelay = 5 * time.Millisecond // mlx5 takes ~100 ms per VF on a real node
	a := &provision.Applier{Kernel: k, Root: host, StateDir: state}
	start := time.Now()
	res, err := a.Apply(ctx, provision.NewPlan(ps, provision.Node{Root: host, Snapshot: snap}))
	if err != nil {
		return err
	}
	k.Wait()
	fmt.Fprintf(d.out, "  applied through the kernel stand-in (VF probe %s): %d PFs in %s, %d kernel writes\n",
		k.ProbeDelay, len(res.Changed), time.Since(start).Round(time.Millisecond), len(k.Calls()))
	for _, c := range k.Calls()[:4] {
		fmt.Fprintf(d.out, "    %s\n", c)
	}
	fmt.Fprintln(d.out, "    …")
	if err := show("discover --policy "+policy+"   (after)", pfRows, discoverArgs...); err != nil {
		return err
	}
	vfRow := func(l string) bool {
		return strings.Contains(l, "vf0 0000:18:00.1") || strings.Contains(l, "vf7 0000:18:01.0")
	}
	if err := show("discover   (two VFs of rail 0)", vfRow, discoverArgs...); err != nil {
		return err
	}
	return show("provision   (again: idempotent)", func(l string) bool { return strings.Contains(l, "nothing") || strings.HasPrefix(l, "0000:18:00.0") }, provArgs...)
}

// firstSteps keeps the plan's table and the first steps of its first PF.
func firstSteps() func(string) bool {
	section, steps := 0, 0
	return func(l string) bool {
		switch {
		case strings.HasSuffix(l, " would:"):
			section++
			return section == 1
		case section == 0:
			return strings.HasPrefix(l, "PF ") || strings.HasPrefix(l, "0000:")
		case section == 1 && strings.HasPrefix(l, "  "):
			steps++
			return steps <= 6
		}
		return false
	}
}
