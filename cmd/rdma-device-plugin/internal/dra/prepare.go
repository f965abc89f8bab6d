package dra

import (
	"cmp"
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
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
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
//
// The claims are one batch: the kubelet prepares all of a pod's claims of
// one driver that are not prepared yet in one call, and marks none of them
// prepared unless all succeed (a retry is the whole batch again). Every
// claim of the batch is checked first, and the environment of each spec is
// then the one of the claim's pod (envPeers); the files are written last.
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	d.mu.Lock()
	defer d.mu.Unlock()
	plans := make([]*claimPlan, 0, len(claims))
	for _, c := range claims {
		p, err := d.planLocked(c, plans)
		if err != nil {
			p = &claimPlan{claim: c, err: err}
		}
		plans = append(plans, p)
	}
	envPeers(plans)
	for _, p := range plans {
		c := p.claim
		devs, err := p.result, p.err
		if err == nil && p.write {
			devs, err = d.writeLocked(p)
		}
		if err != nil {
			d.log.Error("dra: prepare failed", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "err", err)
			devs = nil
		} else {
			d.log.Info("dra: claim prepared", "claim", c.Namespace+"/"+c.Name, "uid", c.UID, "devices", len(devs))
		}
		out[c.UID] = kubeletplugin.PrepareResult{Err: err, Devices: devs}
	}
	d.point("prepare:answer")
	return out, nil
}

// claimPlan is one claim of a Prepare batch, checked and resolved to its
// VFs before anything is written.
type claimPlan struct {
	claim *resourceapi.ResourceClaim
	err   error
	// result is the answer to the kubelet when err is nil.
	result []kubeletplugin.Device
	// write is set when the claim's files are to be written (it has VFs
	// of ours, and is not one prepared before whose VFs left the scan).
	write bool
	rec   *preparedClaim
	class string // the CDI class of its devices
	// devs are the claim's VFs: the devices of its spec. env are the VFs
	// its spec's environment names (envPeers): devs, or the VFs of every
	// claim of its pod in the batch.
	devs, env []claimDevice
	// pod is the one pod the claim is reserved for, "" when it is shared
	// (or reserved for no pod, or for something else).
	pod types.UID
}

// planLocked checks a claim and resolves its VFs; earlier are the claims
// before it in the batch, whose VFs it must not take either.
func (d *Driver) planLocked(c *resourceapi.ResourceClaim, earlier []*claimPlan) (*claimPlan, error) {
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
	p := &claimPlan{claim: c, class: class, pod: reservedForOnePod(c),
		rec: &preparedClaim{Namespace: c.Namespace, Name: c.Name, CDISpec: CDISpecName(c.UID), Pods: reservedPods(c)}}
	prev := d.cp.Claims[c.UID]
	for _, r := range c.Status.Allocation.Devices.Results {
		if r.Driver != DriverName {
			continue
		}
		if r.Pool != d.opts.NodeName {
			return nil, fmt.Errorf("claim %s/%s: device %s is in pool %q, this node publishes pool %q", c.Namespace, c.Name, r.Device, r.Pool, d.opts.NodeName)
		}
		e, ok := d.byName[r.Device]
		if !ok {
			if prev != nil && sameDevices(prev, c) && d.specExists(prev.CDISpec) {
				// Prepared before and now out of this scan's pools (its
				// netdev and RDMA device are in the pod): what was written
				// still stands.
				return &claimPlan{claim: c, result: resultOf(prev)}, nil
			}
			return nil, fmt.Errorf("claim %s/%s: device %s is not (or no longer) a VF served by DRA on node %s", c.Namespace, c.Name, r.Device, d.opts.NodeName)
		}
		isAdmin := r.AdminAccess != nil && *r.AdminAccess
		if !isAdmin {
			if uid, other := d.cp.owner(e.dev.PCIAddress, c.UID); other != nil {
				return nil, fmt.Errorf("claim %s/%s: VF %s is already prepared for claim %s/%s (%s); refusing to hand it out twice",
					c.Namespace, c.Name, e.dev.PCIAddress, other.Namespace, other.Name, uid)
			}
			if other := takenIn(earlier, e.dev.PCIAddress); other != nil {
				return nil, fmt.Errorf("claim %s/%s: VF %s is also allocated to claim %s/%s (%s), prepared in the same call; refusing to hand it out twice",
					c.Namespace, c.Name, e.dev.PCIAddress, other.Namespace, other.Name, other.UID)
			}
		}
		if !e.dev.IsVFIO() && !e.dev.HasUverbs() {
			return nil, fmt.Errorf("claim %s/%s: VF %s (%s) has no RDMA char devices under %s (is ib_uverbs loaded?)", c.Namespace, c.Name, e.dev.PCIAddress, e.dev.RDMADevice, rdma.DevDir)
		}
		id := CDIDeviceID(class, e.dev.PCIAddress)
		meta := deviceMetadata(e, d.rdmaCM)
		// Prepared again (a kubelet restarted): the network data its CNI
		// gave stays until the next ADD replaces it.
		net := prev.networkData(r.Request, e.dev.PCIAddress)
		p.rec.Devices = append(p.rec.Devices, preparedDevice{Request: r.Request, Pool: r.Pool, Device: r.Device,
			PCIAddress: e.dev.PCIAddress, Resource: e.res.ResourceName(), CDIDeviceID: id, AdminAccess: isAdmin, Metadata: meta, NetworkData: net})
		if !slices.ContainsFunc(p.devs, func(cd claimDevice) bool { return cd.dev == e.dev }) {
			p.devs = append(p.devs, claimDevice{res: e.res, dev: e.dev})
		}
		p.result = append(p.result, withMetadata(kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device, CDIDeviceIDs: []string{id}}, meta, net))
	}
	if len(p.devs) == 0 {
		return &claimPlan{claim: c}, nil // nothing of ours in the claim
	}
	p.write, p.env = true, p.devs
	if d.opts.DevInfoDir != "" {
		for _, cd := range p.devs {
			p.rec.DevInfo = append(p.rec.DevInfo, DevInfoPath(d.opts.DevInfoDir, c.Name, cd.dev.PCIAddress))
		}
	}
	return p, nil
}

// takenIn returns the claim of plans that takes the VF at a PCI address
// (not for admin access), or nil.
func takenIn(plans []*claimPlan, pciAddress string) *resourceapi.ResourceClaim {
	for _, p := range plans {
		if p.err != nil || p.rec == nil {
			continue
		}
		for _, d := range p.rec.Devices {
			if d.PCIAddress == pciAddress && !d.AdminAccess {
				return p.claim
			}
		}
	}
	return nil
}

// reservedForOnePod is the pod a claim is reserved for when it is reserved
// for exactly one consumer and that consumer is a pod, else "".
func reservedForOnePod(c *resourceapi.ResourceClaim) types.UID {
	if pods := reservedPods(c); len(c.Status.ReservedFor) == 1 && len(pods) == 1 {
		return pods[0]
	}
	return ""
}

// envPeers sets the environment of the claims of a batch to be written.
//
// CDI env edits are last-wins: a container with several claims (the
// Multus pattern of one VF per claim: a pod with 8 rails has 8 claims)
// gets every claim's device nodes but the NCCL_IB_HCA, UCX_NET_DEVICES and
// PCIDEVICE_<POOL>(_INFO) of whichever spec the runtime applies last. So a
// claim reserved for exactly one pod names in its environment the VFs of
// every claim of the batch reserved for that same pod alone, in one order
// (the claims by name, each claim's VFs in its results' order, a VF
// once), the same in all of their specs: whichever is applied last, the
// container is told of all of its pod's VFs. Device nodes stay per claim.
// A shared claim (several consumers) names its own VFs only: the other
// pods using it do not have its peers' devices.
//
// The pod's claims are in one batch because the kubelet prepares all of a
// pod's unprepared claims of a driver at once. A claim prepared alone (a
// batch of one) names its own VFs. A claim reserved for one pod that
// another pod reserves later keeps the environment written for the first
// pod: the kubelet does not prepare a prepared claim again. A claim
// prepared before whose VFs have left the scan (into its pod) is not
// written again, and the specs of its peers written in the same batch do
// not name its VFs: the scan no longer has them.
func envPeers(plans []*claimPlan) {
	byPod := map[types.UID][]*claimPlan{}
	for _, p := range plans {
		if p.err == nil && p.write && p.pod != "" {
			byPod[p.pod] = append(byPod[p.pod], p)
		}
	}
	for _, group := range byPod {
		if len(group) < 2 {
			continue
		}
		group = slices.Clone(group)
		slices.SortFunc(group, func(a, b *claimPlan) int {
			return cmp.Or(cmp.Compare(a.claim.Namespace, b.claim.Namespace), cmp.Compare(a.claim.Name, b.claim.Name), cmp.Compare(a.claim.UID, b.claim.UID))
		})
		var env []claimDevice
		for _, p := range group {
			for _, cd := range p.devs {
				if !slices.ContainsFunc(env, func(e claimDevice) bool { return e.dev.PCIAddress == cd.dev.PCIAddress }) {
					env = append(env, cd)
				}
			}
		}
		for _, p := range group {
			p.env = env
		}
	}
}

// writeLocked writes a planned claim's files, journalled in the checkpoint
// first: whatever happens, Unprepare knows what to remove.
func (d *Driver) writeLocked(p *claimPlan) ([]kubeletplugin.Device, error) {
	c, rec := p.claim, p.rec
	spec, err := claimSpec(p.class, p.devs, p.env, d.rdmaCM, d.opts.NodeRoot)
	if err != nil {
		return nil, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err)
	}
	rec.Env = envAddrs(p.devs, p.env)
	prev := d.cp.Claims[c.UID]
	d.cp.Claims[c.UID] = rec
	if err := d.cp.save(d.cpPath); err != nil {
		d.restoreLocked(c.UID, prev)
		return nil, err
	}
	d.point("prepare:journal")
	if err := d.writeClaimFiles(rec, spec, p.devs); err != nil {
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
		for _, f := range prev.DevInfo {
			if !slices.Contains(rec.DevInfo, f) {
				_ = removeFile(f)
			}
		}
	}
	d.inUse = d.cp.inUse()
	if d.netdevGoneLocked(rec) {
		d.republish("prepare") // its netdev's absence is no fault now
	}
	return p.result, nil
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
	d.point("prepare:cdi")
	if len(rec.DevInfo) > 0 {
		if err := os.MkdirAll(d.opts.DevInfoDir, 0o755); err != nil {
			return fmt.Errorf("devinfo %s: %w", d.opts.DevInfoDir, err)
		}
	}
	for i, path := range rec.DevInfo {
		if err := writeDevInfo(path, devs[i].dev); err != nil {
			return err
		}
		d.point("prepare:devinfo")
	}
	return nil
}

func writeDevInfo(path string, dv *nic.Device) error {
	return devinfo.Write(path, devinfo.NewPCI(dv.PCIAddress, dv.RDMADevice, dv.PFAddress), 0o444)
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
		out = append(out, metadataDevice(d))
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
