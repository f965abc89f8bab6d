package dra

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/types"
	"tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
)

// What a prepared claim needs from outside the checkpoint outlives a
// restart of the driver, of the kubelet, and of the node:
//
//   - the driver killed in the middle of a Prepare: its checkpoint names
//     the claim before any file is written (writeLocked), so the retry of
//     the kubelet, which has not marked the claim prepared, writes the
//     same files again, and an Unprepare instead removes whatever was
//     written; each file is written whole or not at all (cdiwrite,
//     atomicfile);
//   - the kubelet restarted: it reloads its claims from its own
//     checkpoint, not as prepared, and prepares them again only when it
//     creates a pod sandbox; running pods keep their containers, and this
//     driver's files and checkpoint are untouched;
//   - the node rebooted: the CDI directory (/var/run/cdi) and the
//     device-info directory are tmpfs and come back empty, while the
//     checkpoint, under /var/lib/kubelet, is kept. The kubelet prepares the
//     claims again as it creates the pods' sandboxes anew (which rewrites
//     the files), but not when a container of a running pod restarts: the
//     runtime then resolves the container's CDI names from the CDI
//     directory, whatever emptied it. So the driver, when it starts, writes
//     again the missing files of every claim of its checkpoint
//     (restoreFiles), before the kubelet can call it, and the helper's
//     device metadata specs it kept (metaSpecs).
//
// Those files are made from this scan, found by the VF's PCI address, not
// from what the checkpoint was given: across a reboot a VF keeps its PCI
// address but its netdev, RDMA device and uverbs numbers are whatever the
// kernel gave them this boot, and a spec naming the old ones would hand a
// container another VF's char devices. A file still present is kept: it is
// what the running container was given.

// restoreFiles writes again the CDI spec and device-info files of the
// prepared claims that are missing, from the VFs of the current scan. A
// claim whose VFs this scan does not serve whole (out of the pools, or
// without their char devices) cannot be restored: it is logged, and the
// kubelet's Prepare of it fails with why.
func (d *Driver) restoreFiles() {
	d.mu.Lock()
	defer d.mu.Unlock()
	uids := make([]types.UID, 0, len(d.cp.Claims))
	for uid := range d.cp.Claims {
		uids = append(uids, uid)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	restored := 0
	for _, uid := range uids {
		rec := d.cp.Claims[uid]
		spec, info := !d.specExists(rec.CDISpec), missingFiles(rec.DevInfo)
		if !spec && len(info) == 0 {
			continue
		}
		if err := d.restoreClaimLocked(rec, spec, info); err != nil {
			d.log.Error("dra: files of a prepared claim missing and not restored: its containers cannot start until it is prepared again",
				"claim", rec.Namespace+"/"+rec.Name, "uid", uid, "err", err)
			continue
		}
		restored++
		d.log.Info("dra: files of a prepared claim restored", "claim", rec.Namespace+"/"+rec.Name, "uid", uid, "cdiSpec", spec, "devInfo", len(info))
	}
	if restored > 0 {
		d.log.Info("dra: prepared claims' files restored from the checkpoint", "claims", restored)
	}
	n, err := d.meta.restore()
	if err != nil {
		d.log.Error("dra: device metadata CDI specs not restored: containers that name them cannot start until their claims are prepared again", "err", err)
	}
	if n > 0 {
		d.log.Info("dra: device metadata CDI specs restored", "specs", n)
	}
}

// restoreClaimLocked writes a prepared claim's spec (when spec is set)
// and the device-info files of info.
func (d *Driver) restoreClaimLocked(rec *preparedClaim, spec bool, info []string) error {
	class := CDIClass
	var devs []claimDevice
	for _, pd := range rec.Devices {
		_, c, _, err := parser.ParseQualifiedName(pd.CDIDeviceID)
		if err != nil {
			return fmt.Errorf("checkpoint: device %s: %w", pd.Device, err)
		}
		class = c
		cd, err := d.servedVFLocked(pd.PCIAddress)
		if err != nil {
			return err
		}
		if !slices.ContainsFunc(devs, func(x claimDevice) bool { return x.dev == cd.dev }) {
			devs = append(devs, cd)
		}
	}
	env := devs
	if len(rec.Env) > 0 {
		env = nil
		for _, addr := range rec.Env {
			cd, err := d.servedVFLocked(addr)
			if err != nil {
				return fmt.Errorf("a VF of its pod's environment: %w", err)
			}
			env = append(env, cd)
		}
	}
	if spec {
		s, err := claimSpec(class, devs, env, d.rdmaCM, d.opts.NodeRoot)
		if err != nil {
			return err
		}
		if err := d.cdi.Write(s, rec.CDISpec); err != nil {
			return err
		}
	}
	if len(info) == 0 {
		return nil
	}
	if len(rec.DevInfo) != len(devs) {
		return fmt.Errorf("checkpoint: %d device-info files for %d VFs", len(rec.DevInfo), len(devs))
	}
	if err := os.MkdirAll(d.opts.DevInfoDir, 0o755); err != nil {
		return fmt.Errorf("devinfo %s: %w", d.opts.DevInfoDir, err)
	}
	for i, path := range rec.DevInfo {
		if slices.Contains(info, path) {
			if err := writeDevInfo(path, devs[i].dev); err != nil {
				return err
			}
		}
	}
	return nil
}

// servedVFLocked is the VF at a PCI address in this scan, with the char
// devices (or vfio group) a spec gives the container.
func (d *Driver) servedVFLocked(pciAddress string) (claimDevice, error) {
	e, ok := d.byName[DeviceName(pciAddress)]
	if !ok || e.dev.PCIAddress != pciAddress {
		return claimDevice{}, fmt.Errorf("VF %s is not (or no longer) served by DRA on node %s", pciAddress, d.opts.NodeName)
	}
	if !e.dev.IsVFIO() && !e.dev.HasUverbs() {
		return claimDevice{}, fmt.Errorf("VF %s (%s) has no RDMA char devices", pciAddress, e.dev.RDMADevice)
	}
	return claimDevice{res: e.res, dev: e.dev}, nil
}

// missingFiles are the paths that do not exist.
func missingFiles(paths []string) []string {
	var out []string
	for _, p := range paths {
		if _, err := os.Stat(p); errors.Is(err, fs.ErrNotExist) {
			out = append(out, p)
		}
	}
	return out
}

// envAddrs are the PCI addresses of a claim's environment when they are
// not its own VFs (envPeers gave it its pod's), else nil: what a restored
// spec needs to name the same VFs.
func envAddrs(devs, env []claimDevice) []string {
	same := len(devs) == len(env)
	for i := 0; same && i < len(devs); i++ {
		same = devs[i].dev.PCIAddress == env[i].dev.PCIAddress
	}
	if same {
		return nil
	}
	out := make([]string, len(env))
	for i, cd := range env {
		out[i] = cd.dev.PCIAddress
	}
	return out
}

// point is a step boundary of Prepare: a test build's failpoint kills
// the process there (export_test.go); nil in the daemon.
func (d *Driver) point(name string) {
	if d.failpoint != nil {
		d.failpoint(name)
	}
}

// removeTemporaries deletes what an atomic write (internal/atomicfile)
// that a kill cut short left: its ".<name>.tmp-*" beside the checkpoint,
// and beside the device-info files of the checkpoint's claims (Prepare
// names a claim's files in the checkpoint before it writes them). Other
// files of those directories, the device plugin's among them, are not
// the driver's. Nothing writes before Start.
func removeTemporaries(cpPath string, cp *checkpoint) error {
	paths := []string{cpPath}
	for _, c := range cp.Claims {
		paths = append(paths, c.DevInfo...)
	}
	var errs []error
	for _, p := range paths {
		left, err := atomicfile.Temporaries(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("temporaries of %s: %w", p, err))
		}
		for _, l := range left {
			if err := removeFile(l); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}
