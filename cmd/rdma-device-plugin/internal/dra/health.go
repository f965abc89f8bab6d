package dra

import (
	"context"
	"maps"
	"os"
	"path/filepath"
	"time"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/links"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
)

// LinkSource delivers link events of the host netns (links.Netlink in
// production, linkstest.Chan in tests): the device plugin's, shared.
type LinkSource = links.Source

// Reasons for an unhealthy VF, the value of its TaintUnhealthy taint.
const (
	ReasonPFLinkDown = "pf-link-down"
	ReasonNetdevGone = "netdev-gone"
	ReasonNoUverbs   = "no-uverbs"
)

// healthResend is how often the kubelet is told the devices' health when
// nothing changed, well within its 30 s staleness window.
const healthResend = 10 * time.Second

// linkState is what netlink last told about an interface.
type linkState struct{ up, deleted bool }

// healthView is what a VF's health is decided from: the last link events
// and the VFs prepared for claims. The publisher takes a copy, so as to
// decide outside d.mu.
type healthView struct {
	links    map[string]linkState
	inUse    map[string]bool
	hostRoot string
}

// healthViewLocked copies what health is decided from. d.mu must be held.
func (d *Driver) healthViewLocked() healthView {
	return healthView{links: maps.Clone(d.links), inUse: maps.Clone(d.inUse), hostRoot: d.opts.HostRoot}
}

// healthLocked is e's health now. d.mu must be held.
func (d *Driver) healthLocked(e *entry) health {
	return healthView{links: d.links, inUse: d.inUse, hostRoot: d.opts.HostRoot}.health(e)
}

// health decides a VF's health by the device plugin's rule: a VF whose
// RDMA device has no uverbs under /dev hands out nothing NCCL can open
// (Prepare refuses it); a PF that is oper-down or gone takes its VFs down
// with it; a VF whose netdev left the host netns is unusable unless it is
// prepared for a claim (the CNI moved it into the pod) and its PCI
// function still exists. Interfaces netlink never mentioned count as up.
func (v healthView) health(e *entry) health {
	if e.dev.UsesRDMA() && !e.dev.HasUverbs() {
		return health{reason: ReasonNoUverbs}
	}
	if n := e.dev.PFNetdev; n != "" {
		if st, ok := v.links[n]; ok && (!st.up || st.deleted) {
			return health{reason: ReasonPFLinkDown}
		}
	}
	if v.netdevGone(e) && (!v.inUse[e.dev.PCIAddress] || !pciExists(v.hostRoot, e.dev.PCIAddress)) {
		return health{reason: ReasonNetdevGone}
	}
	return health{ok: true}
}

// netdevGone reports whether netlink saw the VF's netdev leave the host
// netns: the one case where being prepared for a claim decides its health.
func (v healthView) netdevGone(e *entry) bool {
	if n := e.dev.Netdev; e.dev.IsVF() && n != "" {
		st, ok := v.links[n]
		return ok && st.deleted
	}
	return false
}

func pciExists(hostRoot, addr string) bool {
	_, err := os.Lstat(filepath.Join(hostRoot, "sys", "bus", "pci", "devices", addr))
	return err == nil
}

// watchLinks applies link events until ctx ends or the source closes.
func (d *Driver) watchLinks(ctx context.Context, events <-chan plugin.LinkEvent) {
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-events:
			if !ok {
				if ctx.Err() == nil {
					d.log.Warn("dra: netlink subscription ended; VF health follows rescans only")
				}
				return
			}
			d.linkEvent(ev)
		}
	}
}

func (d *Driver) linkEvent(ev plugin.LinkEvent) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := linkState{up: ev.Up && !ev.Deleted, deleted: ev.Deleted}
	old, known := d.links[ev.Name]
	if !d.watched[ev.Name] {
		// Not a netdev of a served VF or its PF (a pod's veth): kept
		// while it exists, for a rescan that adds it, and no republish.
		if ev.Deleted {
			delete(d.links, ev.Name)
		} else {
			d.links[ev.Name] = st
		}
		return
	}
	d.links[ev.Name] = st
	if known && old == st {
		return
	}
	d.republish("link " + ev.Name)
}

// WatchHealthStatus implements kubeletplugin.DRAPlugin: every device's
// health now, again on each change and every healthResend.
func (d *Driver) WatchHealthStatus(ctx context.Context, reports chan<- kubeletplugin.DeviceHealthReport) error {
	for {
		report, changed := d.healthReport()
		select {
		case <-ctx.Done():
			return nil
		case reports <- report:
		}
		t := time.NewTimer(healthResend)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-changed:
		case <-t.C:
		}
		t.Stop()
	}
}

func (d *Driver) healthReport() (kubeletplugin.DeviceHealthReport, <-chan struct{}) {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	report := kubeletplugin.DeviceHealthReport{Devices: make([]kubeletplugin.DeviceHealth, 0, len(d.entries))}
	for i := range d.entries {
		e := &d.entries[i]
		h := d.healthLocked(e)
		dh := kubeletplugin.DeviceHealth{PoolName: d.opts.NodeName, DeviceName: e.name, Health: kubeletplugin.HealthStatusHealthy,
			LastUpdated: now, HealthCheckTimeout: 3 * healthResend}
		if !h.ok {
			dh.Health = kubeletplugin.HealthStatusUnhealthy
			dh.Message = h.reason
		}
		report.Devices = append(report.Devices, dh)
	}
	return report, d.healthChanged
}
