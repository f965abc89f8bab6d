package plugin

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// linkState is what netlink last told about an interface.
type linkState struct {
	up      bool
	deleted bool
}

// linkEvent records a link change and refreshes health. It reports
// whether the host should be scanned again: the netdev of a VF that the
// last scan found without one appeared (its pod ended, and this run never
// saw it in the host netns).
func (m *Manager) linkEvent(ev LinkEvent) (rescan bool) {
	old, known := m.links[ev.Name]
	st := linkState{up: ev.Up && !ev.Deleted, deleted: ev.Deleted}
	if !m.watched[ev.Name] {
		// Not a netdev of any pool (a pod's veth, another NIC): no
		// health depends on it. Its state is kept while it exists, for a
		// rescan that adds it to a pool. Pod churn on the node would
		// otherwise grow the map by a name per pod and rebuild every
		// pool's device list on each of their events.
		if ev.Deleted {
			delete(m.links, ev.Name)
			return false
		}
		m.links[ev.Name] = st
		return !known && len(m.noNetdev) > 0 && m.noNetdev[m.pciOfNetdev(ev.Name)]
	}
	m.links[ev.Name] = st
	if known && old == st {
		return
	}
	if !ev.Deleted {
		// A VF's netdev back in the host netns: whatever held it let go.
		if addr, ok := m.vfOfNetdev[ev.Name]; ok {
			m.forgetAllocated(addr)
		}
	}
	m.refreshHeld()
	for r, s := range m.servers {
		p := m.pools[r]
		m.updateServer(r, s, s.served(), buildSlots(&p, m.healthy), "link "+ev.Name)
	}
	return false
}

// pciOfNetdev is the PCI address of the function behind netdev name ("":
// none, as for a veth), from its device link in the host's sysfs.
func (m *Manager) pciOfNetdev(name string) string {
	target, err := os.Readlink(filepath.Join(m.opts.HostRoot, "sys", "class", "net", name, "device"))
	if err != nil {
		return ""
	}
	return filepath.Base(target)
}

// healthy decides a function's health from the last scan and link events:
// a function whose RDMA device has no uverbs under /dev is unhealthy; a PF
// that is oper-down or gone takes its VFs down with it; a VF whose netdev
// left the host netns is unhealthy unless a live pod holds it (a CNI moved
// the netdev into the pod: see refreshHeld) and its PCI function still
// exists. Interfaces netlink never mentioned are taken as healthy.
func (m *Manager) healthy(d *nic.Device) bool {
	// A function with an RDMA device whose uverbs is not under /dev (the
	// driver is reloading, or /dev is not the node's) hands out nothing
	// NCCL can open.
	if d.UsesRDMA() && !d.HasUverbs() {
		return false
	}
	if d.PFNetdev != "" {
		if st, ok := m.links[d.PFNetdev]; ok && (!st.up || st.deleted) {
			return false
		}
	}
	if d.IsVF() && d.Netdev != "" {
		if st, ok := m.links[d.Netdev]; ok && st.deleted {
			if !m.isHeld(d.PCIAddress) || !m.pciExists(d.PCIAddress) {
				return false
			}
		}
	}
	return true
}

func (m *Manager) pciExists(addr string) bool {
	_, err := os.Lstat(filepath.Join(m.opts.HostRoot, "sys", "bus", "pci", "devices", addr))
	return err == nil
}

// refreshHeld asks the kubelet which devices live pods hold, when a VF's
// netdev is out of the host netns (the only case health asks). Without an
// answer (no PodResources socket, an error) it falls back to the devices
// this process has seen allocated and not since seen come back: a pod
// that ended returns its VF's netdev to the host netns.
func (m *Manager) refreshHeld() {
	m.held = nil
	if m.opts.PodResources == nil || !m.anyVFOut() {
		return
	}
	resources := make(map[string]bool, len(m.pools))
	for r, p := range m.pools {
		if p.Kind == pool.Exclusive {
			resources[r] = true
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), podResourcesTimeout)
	defer cancel()
	held, err := m.opts.PodResources.Held(ctx, resources)
	if err != nil {
		if !m.heldFailed {
			m.log.Warn("cannot ask the kubelet which VFs live pods hold; health goes by the Allocate calls seen since start", "err", err)
		}
		m.heldFailed = true
		return
	}
	if m.heldFailed {
		m.log.Info("the kubelet's PodResources API answers again")
	}
	m.heldFailed = false
	m.held = held
}

// podResourcesTimeout bounds one PodResources List.
const podResourcesTimeout = time.Second

// anyVFOut reports whether a watched VF netdev is out of the host netns.
func (m *Manager) anyVFOut() bool {
	for n := range m.vfOfNetdev {
		if m.links[n].deleted {
			return true
		}
	}
	return false
}

// isHeld reports whether a live pod holds the VF at addr: the kubelet's
// answer when refreshHeld got one, else the Allocate calls seen.
func (m *Manager) isHeld(addr string) bool {
	if m.held != nil {
		return m.held[addr]
	}
	return m.isAllocated(addr)
}

func (m *Manager) markAllocated(ids []string) {
	m.lastAlloc.Store(time.Now().UnixNano())
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	for _, id := range ids {
		m.allocated[id] = true
	}
}

func (m *Manager) forgetAllocated(id string) {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	delete(m.allocated, id)
}

func (m *Manager) isAllocated(id string) bool {
	m.allocMu.Lock()
	defer m.allocMu.Unlock()
	return m.allocated[id]
}

// indexNetdevs rebuilds watched and vfOfNetdev from the pools, and drops
// the deleted links no pool has any more. Only link events read them
// (and refreshHeld, through anyVFOut), and a start subscribes to links
// after its first registration round: the first apply leaves them to
// afterFirstRegistration, so that the kubelet is not kept waiting for
// maps of every netdev of a large host (a thousand VFs, and their PFs).
func (m *Manager) indexNetdevs() {
	clear(m.watched)
	clear(m.vfOfNetdev)
	for _, p := range m.pools {
		for i := range p.Devices {
			d := &p.Devices[i]
			for _, n := range []string{d.Netdev, d.PFNetdev} {
				if n != "" {
					m.watched[n] = true
				}
			}
			if p.Kind == pool.Exclusive && d.IsVF() && d.Netdev != "" {
				m.vfOfNetdev[d.Netdev] = d.PCIAddress
			}
		}
	}
	for n, st := range m.links {
		if st.deleted && !m.watched[n] {
			delete(m.links, n)
		}
	}
}
