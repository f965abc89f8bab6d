// Package uninstall puts a node back as it was before fastpath's
// DaemonSet ran there: `rdma-device-plugin uninstall`, which the
// short-lived DaemonSet of deployments/uninstall/ runs on every node once
// the workload pods and the device plugin's DaemonSet are gone. In order:
//
//  1. each PF whose VFs provisioning made (a Found record in the
//     provisioning state directory) goes back to the sriov_numvfs it had
//     before, planned and applied as provisioning plans and applies, so
//     that a PF whose VFs a pod, a CNI attachment or a DRA claim still
//     holds is left as it is and named;
//  2. then, only when nothing holds a VF of fastpath's (the CNI needs its
//     binary, its state and the device-info files for the DEL of a pod
//     still attached): the sriov CNI binary that install-cni replaced is
//     put back (or fastpath's removed, and the log says none is left), the
//     device plugin's device-info files and CDI specs are removed, and so
//     are the CNI's leftovers (locks, tombstones, pinned netns files) and
//     provisioning's records, each directory fastpath made removed when it
//     is empty.
//
// What it did is a Report: a line per thing, which the subcommand logs and
// writes where the pod's status shows it (its termination message).
package uninstall

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/installcni"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// ErrHeld: VFs of fastpath's are still held; the node is not done.
var ErrHeld = errors.New("pods still hold fastpath's VFs")

// Config says where fastpath's things are. Every path is the one this
// process sees (the node's under a host root).
type Config struct {
	HostRoot string // the node's sysfs at HostRoot/sys
	// CNIBinDir is the node's CNI bin_dir; "" leaves the binary alone.
	CNIBinDir string
	// DevInfoDir and Pools: the device plugin's device-info files of
	// these pools are removed.
	DevInfoDir string
	Pools      []pool.Resource
	CDIDir     string // the device plugin's CDI specs there are removed
	// StateDir is provisioning's; CNIStateDir the CNI's.
	StateDir, CNIStateDir string
	// PodResources is the kubelet's socket ("": not asked), DRA the
	// prepared claims' VFs (nil: none): who holds a VF.
	PodResources string
	DRA          func() (map[string]string, error)
	Timeout      time.Duration // per PF whose VFs are made again
	// Kernel makes the sysfs writes; nil: the node's.
	Kernel provision.Kernel
	Log    *slog.Logger
}

// PF is what happened to one PF provisioning had changed.
type PF struct {
	Address, Netdev string
	// Found is sriov_numvfs before fastpath; From what it was now.
	Found, From int
	// Back: the PF has Found VFs again. Otherwise Left says why not.
	Back bool
	Left string
}

// Report is what Run did.
type Report struct {
	PFs []PF
	// CNI is what happened to the sriov binary (installcni.Restored.What),
	// "" when it was not looked at.
	CNI string
	// Removed are the files and directories removed.
	Removed []string
	// Held says what still holds a VF (nothing else was removed then).
	Held []string
	// Kept are fastpath's files left on purpose, and why.
	Kept []string
}

// Done says whether the node is as before fastpath.
func (r *Report) Done() bool {
	if len(r.Held) > 0 {
		return false
	}
	for _, pf := range r.PFs {
		if !pf.Back {
			return false
		}
	}
	return true
}

// Lines is the report, a line per thing, for a person.
func (r *Report) Lines() []string {
	var out []string
	for _, pf := range r.PFs {
		switch {
		case pf.Back && pf.From == pf.Found:
			out = append(out, fmt.Sprintf("PF %s (%s): %d VFs, as before fastpath", pf.Address, orDash(pf.Netdev), pf.Found))
		case pf.Back:
			out = append(out, fmt.Sprintf("PF %s (%s): VFs %d -> %d, as before fastpath", pf.Address, orDash(pf.Netdev), pf.From, pf.Found))
		default:
			out = append(out, fmt.Sprintf("PF %s (%s): left with %d VFs (%d before fastpath): %s", pf.Address, orDash(pf.Netdev), pf.From, pf.Found, pf.Left))
		}
	}
	switch r.CNI {
	case "upstream":
		out = append(out, "sriov CNI: the binary fastpath replaced is back")
	case "removed":
		out = append(out, "sriov CNI: fastpath's removed; there was none before it, so none is left: install upstream sriov-cni if a NetworkAttachmentDefinition still names type sriov")
	case "left":
		out = append(out, "sriov CNI: the binary there is not fastpath's (replaced since the install): left as it is")
	case "none":
		out = append(out, "sriov CNI: none installed")
	}
	for _, h := range r.Held {
		out = append(out, "held: "+h)
	}
	for _, k := range r.Kept {
		out = append(out, "kept: "+k)
	}
	out = append(out, fmt.Sprintf("%d files and directories of fastpath's removed", len(r.Removed)))
	if r.Done() {
		out = append(out, "this node is as before fastpath")
	} else {
		out = append(out, "not done: delete the pods named above; this is retried until they are gone")
	}
	return out
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Run uninstalls fastpath from the node. The error wraps ErrHeld when
// something still holds a VF of fastpath's, after doing what it could.
func Run(ctx context.Context, c Config) (*Report, error) {
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	r := &Report{}
	held, err := restoreVFs(ctx, c, r)
	if err != nil {
		return r, err
	}
	// The CNI's attachments and the DRA claims hold VFs whatever their PF:
	// a pod still attached needs the CNI, its state and its device-info
	// file for its DEL.
	attached, err := cnistate.Attached(c.CNIStateDir)
	if err != nil {
		return r, fmt.Errorf("uninstall: read the CNI's state %s: %w", c.CNIStateDir, err)
	}
	for _, vf := range slices.Sorted(maps.Keys(attached)) {
		held = append(held, vf+": "+attached[vf])
	}
	if c.DRA != nil {
		claims, err := c.DRA()
		if err != nil {
			return r, fmt.Errorf("uninstall: read the DRA plugin's checkpoint: %w", err)
		}
		for _, vf := range slices.Sorted(maps.Keys(claims)) {
			held = append(held, vf+": "+claims[vf])
		}
	}
	if len(held) > 0 {
		r.Held = slices.Compact(held)
		c.Log.Error("uninstall: VFs are still held: the CNI binary, its state, the device-info files and the CDI specs are left until they are free", "held", r.Held)
		return r, fmt.Errorf("%w: %s: delete those pods (and their claims), and run the uninstall again", ErrHeld, strings.Join(r.Held, "; "))
	}
	if c.CNIBinDir != "" {
		res, err := installcni.Restore(ctx, c.CNIBinDir, c.Log)
		if err != nil {
			return r, err
		}
		r.CNI = res.What
	}
	var errs []error
	for _, p := range c.Pools {
		files, err := plugin.DevInfoFiles(c.DevInfoDir, p.Prefix, p.Name)
		errs = append(errs, err)
		for _, f := range files {
			errs = append(errs, r.remove(c.Log, f, "device-info file"))
		}
	}
	if c.CDIDir != "" {
		files, err := plugin.CDISpecFiles(c.CDIDir)
		errs = append(errs, err)
		for _, f := range files {
			errs = append(errs, r.remove(c.Log, f, "CDI spec"))
		}
	}
	errs = append(errs, r.cniState(c), r.provisionState(c))
	return r, errors.Join(errs...)
}

// restoreVFs returns each PF with a Found record to its count, and says
// what holds the VFs of those it left.
func restoreVFs(ctx context.Context, c Config, r *Report) (held []string, err error) {
	found, err := provision.LoadFound(c.StateDir)
	if err != nil || len(found) == 0 {
		return nil, err
	}
	p := &provisioner.Provisioner{
		Config:   provisioner.Config{StateDir: c.StateDir, CNIStateDir: c.CNIStateDir, Timeout: c.Timeout},
		HostRoot: c.HostRoot, PodResources: c.PodResources, DRA: c.DRA, Log: c.Log, Kernel: c.Kernel,
		Labels: func(context.Context) (provisioner.NodeLabels, error) {
			return provisioner.NodeLabels{Source: "uninstall (every PF fastpath changed)"}, nil
		},
	}
	for _, addr := range slices.Sorted(maps.Keys(found)) {
		// A policy of the uninstall's own per PF: the count found, on
		// exactly that PF, netdevice VFs bound to the driver their IDs
		// match.
		p.Policies = append(p.Policies, provision.Policy{Name: "uninstall-" + addr, Source: "uninstall", ResourceName: "uninstall",
			Priority: provision.DefaultPriority, NumVFs: found[addr].NumVFs, RootDevices: []pool.VFSet{{PF: addr}},
			DeviceType: provision.DeviceTypeNetdevice})
	}
	plan, _, err := p.Plan(ctx)
	if err != nil {
		return nil, err
	}
	res, applyErr := p.Apply(ctx, plan)
	for _, addr := range slices.Sorted(maps.Keys(found)) {
		f := found[addr]
		out := PF{Address: addr, Netdev: f.Netdev, Found: f.NumVFs, From: -1}
		pf, ok := plan.PF(addr)
		switch {
		case !ok:
			out.Left = "not on this node's PCI bus as a PF with SR-IOV: record kept"
		case pf.Refused != nil:
			out.From, out.Left = pf.NumVFs, pf.Refused.Error()
			held = append(held, fmt.Sprintf("PF %s: %v", addr, pf.Refused))
		case res.Errors[addr] != nil:
			out.From, out.Left = pf.NumVFs, res.Errors[addr].Error()
		default:
			out.From, out.Back = pf.NumVFs, true
			if pf.Netdev != "" {
				out.Netdev = pf.Netdev
			}
		}
		if out.Back {
			if err := provision.RemoveFound(c.StateDir, addr); err != nil {
				return held, err
			}
			c.Log.Info("uninstall: PF back to the VFs it had before fastpath", "pf", addr, "netdev", out.Netdev, "from", out.From, "numVfs", out.Found)
		} else {
			c.Log.Error("uninstall: PF left as it is", "pf", addr, "numVfs", out.From, "before", out.Found, "why", out.Left)
		}
		r.PFs = append(r.PFs, out)
	}
	if applyErr != nil && len(res.Errors) == 0 {
		return held, applyErr
	}
	return held, nil
}

// remove removes path (a directory with what is in it) and records it.
func (r *Report) remove(log *slog.Logger, path, what string) error {
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("uninstall: remove %s %s: %w", what, path, err)
	}
	r.Removed = append(r.Removed, path)
	log.Info("uninstall: removed", "what", what, "path", path)
	return nil
}

// removeDirIfEmpty removes dir when nothing is left in it (another's file,
// or a mount point this process cannot remove, keeps it).
func (r *Report) removeDirIfEmpty(log *slog.Logger, dir string) {
	if err := unix.Rmdir(dir); err == nil {
		r.Removed = append(r.Removed, dir)
		log.Info("uninstall: removed the empty directory", "path", dir)
	}
}

// cniState removes the CNI's leftovers (no state file is there: Run
// checked) and the directory when that empties it. A pending address
// release is kept and said: its address stays taken in the IPAM.
func (r *Report) cniState(c Config) error {
	if c.CNIStateDir == "" {
		return nil
	}
	ents, err := os.ReadDir(c.CNIStateDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("uninstall: read the CNI's state %s: %w", c.CNIStateDir, err)
	}
	var errs []error
	for _, e := range ents {
		path := filepath.Join(c.CNIStateDir, e.Name())
		switch {
		case !cnistate.Leftover(e.Name()):
			continue
		case strings.HasSuffix(e.Name(), ".pending"):
			r.Kept = append(r.Kept, path+": an address the CNI has not released yet (its IPAM still holds it; release it there, then remove this file)")
			continue
		case strings.HasSuffix(e.Name(), ".netns"):
			// A pinned netns of a call that was killed is a bind mount.
			if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("uninstall: unmount %s: %w", path, err))
				continue
			}
		}
		errs = append(errs, r.remove(c.Log, path, "CNI leftover"))
	}
	r.removeDirIfEmpty(c.Log, c.CNIStateDir)
	return errors.Join(errs...)
}

// provisionState removes provisioning's write-ahead records, then its
// directories when empty (a Found record kept for a PF left keeps them),
// and their parent when it is fastpath's own (…/fastpath).
func (r *Report) provisionState(c Config) error {
	if c.StateDir == "" {
		return nil
	}
	recs, err := provision.LoadRecords(c.StateDir)
	if err != nil {
		return err
	}
	var errs []error
	for _, addr := range slices.Sorted(maps.Keys(recs)) {
		errs = append(errs, r.remove(c.Log, filepath.Join(c.StateDir, addr+".json"), "provisioning record"))
	}
	r.removeDirIfEmpty(c.Log, provision.FoundDir(c.StateDir))
	r.removeDirIfEmpty(c.Log, c.StateDir)
	// /var/lib/fastpath, which the provisioning hostPath's
	// DirectoryOrCreate made with the state directory in it.
	if parent := filepath.Dir(c.StateDir); filepath.Base(parent) == "fastpath" {
		r.removeDirIfEmpty(c.Log, parent)
	}
	return errors.Join(errs...)
}
