package dra

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// DevInfoPath is the device-info file of a VF prepared for a claim:
// <dir>/<claimName>-<bdf>-device.json. For a claim, Multus (v4.3.0) uses
// the claim's name as the resource name, and looks for the device plugin's
// device-info file of "<resourceName>-<deviceID>".
func DevInfoPath(dir, claimName, pciAddress string) string {
	return filepath.Join(dir, claimName+"-"+pciAddress+"-device.json")
}

// PrepareResourceClaims implements kubeletplugin.DRAPlugin: for each claim,
// a CDI spec with its VFs and a device-info file per VF, recorded in the
// checkpoint first so that a crash in between still cleans up. Results of
// other drivers in the claim (a GPU) are not ours and are skipped.
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, c := range claims {
		devs, err := d.prepareLocked(c)
		if err != nil {
			d.log.Error("dra: prepare failed", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "err", err)
		} else {
			d.log.Info("dra: claim prepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "devices", len(devs))
		}
		out[c.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devs}
	}
	return out, nil
}

func (d *Driver) prepareLocked(c *resourceapi.ResourceClaim) ([]kubeletplugin.Device, error) {
	if c.Status.Allocation == nil {
		return nil, fmt.Errorf("claim %s/%s is not allocated", c.Namespace, c.Name)
	}
	for _, cfg := range c.Status.Allocation.Devices.Config {
		if cfg.Opaque != nil && cfg.Opaque.Driver == DriverName {
			return nil, fmt.Errorf("claim %s/%s: %s takes no opaque parameters (remove the config for driver %s)", c.Namespace, c.Name, DriverName, DriverName)
		}
	}
	admin := false
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName && r.AdminAccess != nil && *r.AdminAccess {
			admin = true
		}
	}
	class, err := cdiClass(c.UID, admin)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	rec := &preparedClaim{Namespace: c.Namespace, Name: c.Name, CDISpec: CDISpecName(c.UID)}
	var devs []claimDevice
	var result []kubeletplugin.Device
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != d.opts.NodeName {
			return nil, fmt.Errorf("claim %s/%s: device %s is in pool %q, this node publishes pool %q", c.Namespace, c.Name, r.Device, r.Pool, d.opts.NodeName)
		}
		e, ok := d.byName[r.Device]
		if !ok {
			if prev := d.cp.Claims[c.UID]; prev != nil && sameDevices(prev, c) && d.specExists(prev.CDISpec) {
				// Prepared before and now out of this scan's pools (its
				// netdev and RDMA device are in the pod): what was written
				// still stands.
				return resultOf(prev), nil
			}
			return nil, fmt.Errorf("claim %s/%s: device %s is not (or no longer) a VF served by DRA on node %s", c.Namespace, c.Name, r.Device, d.opts.NodeName)
		}
		isAdmin := r.AdminAccess != nil && *r.AdminAccess
		if !isAdmin {
			if uid, other := d.cp.owner(e.dev.PCIAddress, c.UID); other != nil {
				return nil, fmt.Errorf("claim %s/%s: VF %s is already prepared for claim %s/%s (%s); refusing to hand it out twice",
					c.Namespace, c.Name, e.dev.PCIAddress, other.Namespace, other.Name, uid)
			}
		}
		if !e.dev.IsVFIO() && !e.dev.HasUverbs() {
			return nil, fmt.Errorf("claim %s/%s: VF %s (%s) has no RDMA char devices under %s (is ib_uverbs loaded?)", c.Namespace, c.Name, e.dev.PCIAddress, e.dev.RDMADevice, rdma.DevDir)
		}
		id := parser.QualifiedName(CDIVendor, class, e.dev.PCIAddress)
		rec.Devices = append(rec.Devices, preparedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device,
			PCIAddress: e.dev.PCIAddress, Resource: e.res.ResourceName(), CDIDeviceID: id, AdminAccess: isAdmin})
		if !slices.ContainsFunc(devs, func(cd claimDevice) bool { return cd.dev == e.dev }) {
			devs = append(devs, claimDevice{res: e.res, dev: e.dev})
		}
		result = append(result, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id}})
	}
	if len(devs) == 0 {
		return nil, nil // nothing of ours in the claim
	}
	spec, err := claimSpec(class, devs, d.rdmaCM, d.opts.NodeRoot)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if d.opts.DevInfoDir != "" {
		for _, cd := range devs {
			rec.DevInfo = append(rec.DevInfo, DevInfoPath(d.opts.DevInfoDir, c.Name, cd.dev.PCIAddress))
		}
	}
	// Journal first: whatever happens below, Unprepare knows what to remove.
	prev := d.cp.Claims[c.UID]
	d.cp.Claims[c.UID] = rec
	if err := d.cp.save(d.cpPath); err != nil {
		d.restoreLocked(c.UID, prev)
		return nil, err
	}
	if err := d.writeClaimFiles(rec, spec, devs); err != nil {
		if prev == nil {
			d.removeClaimFiles(rec)
		}
		d.restoreLocked(c.UID, prev)
		if serr := d.cp.save(d.cpPath); serr != nil {
			err = errors.Join(err, serr)
		}
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	if prev != nil {
		// A re-prepare that changed files (not the spec: same UID, same
		// name): drop device-info files no longer listed.
		for _, p := range prev.DevInfo {
			if !slices.Contains(rec.DevInfo, p) {
				_ = removeFile(p)
			}
		}
	}
	d.inUse = d.cp.inUse()
	if d.netdevGoneLocked(rec) {
		d.republish("prepare") // its netdev's absence is no fault now
	}
	return result, nil
}

// netdevGoneLocked reports whether a VF of the claim has its netdev out of
// the host netns, the one case where being prepared decides its health.
func (d *Driver) netdevGoneLocked(rec *preparedClaim) bool {
	v := healthView{links: d.links}
	for _, pd := range rec.Devices {
		if e, ok := d.byName[pd.Device]; ok && v.netdevGone(e) {
			return true
		}
	}
	return false
}

// restoreLocked puts a claim's checkpoint entry back as it was.
func (d *Driver) restoreLocked(uid types.UID, prev *preparedClaim) {
	if prev == nil {
		delete(d.cp.Claims, uid)
	} else {
		d.cp.Claims[uid] = prev
	}
}

func (d *Driver) writeClaimFiles(rec *preparedClaim, spec *cdispec.Spec, devs []claimDevice) error {
	if err := d.cdi.Write(spec, rec.CDISpec); err != nil {
		return err
	}
	if len(rec.DevInfo) > 0 {
		if err := os.MkdirAll(d.opts.DevInfoDir, 0o755); err != nil {
			return fmt.Errorf("devinfo %s: %w", d.opts.DevInfoDir, err)
		}
	}
	for i, path := range rec.DevInfo {
		dv := devs[i].dev
		if err := devinfo.Write(path, devinfo.NewPCI(dv.PCIAddress, dv.RDMADevice, dv.PFAddress), 0o444); err != nil {
			return err
		}
	}
	return nil
}

// removeClaimFiles removes what was written for a claim; files already
// gone are fine.
func (d *Driver) removeClaimFiles(rec *preparedClaim) error {
	var errs []error
	if err := d.cdi.Remove(rec.CDISpec); err != nil {
		errs = append(errs, err)
	}
	for _, p := range rec.DevInfo {
		if err := removeFile(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func removeFile(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

func (d *Driver) specExists(name string) bool {
	_, err := os.Stat(filepath.Join(d.opts.CDIDir, name))
	return err == nil
}

// sameDevices reports whether a checkpoint entry holds exactly the
// claim's allocation results of this driver.
func sameDevices(rec *preparedClaim, c *resourceapi.ResourceClaim) bool {
	var want []string
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver == DriverName {
			want = append(want, r.Request+"/"+r.Pool+"/"+r.Device)
		}
	}
	var have []string
	for _, d := range rec.Devices {
		have = append(have, d.Request+"/"+d.Pool+"/"+d.Device)
	}
	slices.Sort(want)
	slices.Sort(have)
	return slices.Equal(want, have)
}

func resultOf(rec *preparedClaim) []kubeletplugin.Device {
	out := make([]kubeletplugin.Device, 0, len(rec.Devices))
	for _, d := range rec.Devices {
		out = append(out, kubeletplugin.Device{Requests: []string{d.Request}, PoolName: d.Pool, DeviceName: d.Device, CDIDeviceIDs: []string{d.CDIDeviceID}})
	}
	return out
}

// UnprepareResourceClaims implements kubeletplugin.DRAPlugin: removes each
// claim's CDI spec and device-info files, then its checkpoint entry. A
// claim this node does not know (never prepared, or unprepared before) is
// already done.
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	d.mu.Lock()
	defer d.mu.Unlock()
	changed := false
	for _, c := range claims {
		rec, ok := d.cp.Claims[c.UID]
		if !ok {
			out[c.UID] = nil
			continue
		}
		if err := d.removeClaimFiles(rec); err != nil {
			out[c.UID] = fmt.Errorf("claim %s: %w", c, err)
			continue
		}
		// A VF whose netdev is still away (the CNI's DEL is not through)
		// is unusable again once no claim holds it; for any other VF,
		// being prepared or not changes nothing published.
		changed = changed || d.netdevGoneLocked(rec)
		delete(d.cp.Claims, c.UID)
		if err := d.cp.save(d.cpPath); err != nil {
			d.cp.Claims[c.UID] = rec
			out[c.UID] = err
			continue
		}
		d.log.Info("dra: claim unprepared", "claim", c.String(), "devices", len(rec.Devices))
		out[c.UID] = nil
	}
	d.inUse = d.cp.inUse()
	if changed {
		d.republish("unprepare")
	}
	return out, nil
}
