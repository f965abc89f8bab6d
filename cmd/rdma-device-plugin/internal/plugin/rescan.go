package plugin

import (
	"context"
	"sort"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// A scan applied to the running servers: what a rescan (periodic, on a
// config change, after a burst of device events) does to the pools, their
// servers and their device lists.

// rescan scans the host again and applies the result.
func (m *Manager) rescan(ctx context.Context, reload bool, t *ticker) {
	start := time.Now()
	scan, err := m.opts.Scan(reload)
	m.opts.Metrics.rescanned(time.Since(start))
	if err != nil {
		m.log.Error("rescan failed; keeping the last device lists", "err", err)
		return
	}
	m.apply(scan)
	m.releaseMemory()
	if scan.Interval != m.interval {
		m.log.Info("periodic rescan interval changed", "from", m.interval, "to", scan.Interval)
		m.interval = scan.Interval
		t.reset(scan.Interval)
	}
	m.reconcile(ctx)
}

// apply diffs a scan against the running servers: removed resources stop,
// new ones are created (and started by reconcile), changed ones push a new
// device list.
//
// The pools come from pkg/pool, which has checked their names (unique,
// a DNS-subdomain prefix: what SocketName relies on), kinds and policies.
func (m *Manager) apply(scan Scan) {
	next := map[string]pool.Pool{}
	for _, p := range scan.Pools {
		if m.opts.Serves == nil || m.opts.Serves(&p) {
			next[p.ResourceName()] = p
		}
	}
	m.rdmaCM = scan.RDMACM
	m.noNetdev = scan.NoNetdev
	for r, s := range m.servers {
		if _, ok := next[r]; ok {
			continue
		}
		s.stop()
		old := m.pools[r]
		if m.cdi != nil {
			if err := m.cdi.remove(old.Prefix, old.Name); err != nil {
				m.log.Warn("remove CDI spec", "resource", r, "err", err)
			}
		}
		m.opts.Metrics.forget(r)
		delete(m.servers, r)
		delete(m.pools, r)
		delete(m.registered, r)
		m.log.Info("pool removed", "resource", r)
	}
	for r, p := range next {
		m.pools[r] = p
	}
	if m.registeredOnce {
		m.indexNetdevs()
		m.refreshHeld()
	}
	names := make([]string, 0, len(next))
	for r := range next {
		names = append(names, r)
	}
	sort.Strings(names)
	for _, r := range names {
		p := next[r]
		slots := buildSlots(&p, m.healthy)
		v := served{pool: p, rdmaCM: m.rdmaCM}
		if m.registeredOnce {
			v.cdi = m.writeCDISpec(r, &p)
		}
		m.pools[r] = p
		s, ok := m.servers[r]
		if !ok {
			m.servers[r] = newServer(v, slots, m.log, m.opts.NodeRoot, m.devInfo, m.opts.Metrics, m.markAllocated)
			m.log.Info("pool added", "resource", r, "kind", p.Kind, "devices", len(slots), "healthy", countHealthy(slots))
			continue
		}
		m.updateServer(r, s, v, slots, "rescan")
	}
	m.publish()
}

// updateServer pushes new slots and logs each device whose state changed.
func (m *Manager) updateServer(r string, s *server, v served, slots []slot, why string) {
	s.mu.Lock()
	old := s.slots
	s.mu.Unlock()
	if !s.update(v, slots) {
		return
	}
	was := make(map[string]bool, len(old))
	for _, sl := range old {
		was[sl.ID] = sl.Healthy
	}
	now := make(map[string]bool, len(slots))
	for _, sl := range slots {
		now[sl.ID] = true
		h, existed := was[sl.ID]
		switch {
		case !existed:
			m.log.Info("device added", "resource", r, "device", sl.ID, "healthy", sl.Healthy, "cause", why)
		case h != sl.Healthy:
			m.log.Info("device health changed", "resource", r, "device", sl.ID, "healthy", sl.Healthy, "cause", why)
		}
	}
	for _, sl := range old {
		if !now[sl.ID] {
			m.log.Info("device removed", "resource", r, "device", sl.ID, "cause", why)
		}
	}
}

func countHealthy(slots []slot) int {
	n := 0
	for i := range slots {
		if slots[i].Healthy {
			n++
		}
	}
	return n
}
