package plugin

import (
	"runtime"
	"runtime/debug"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// afterFirstRegistration does what a start puts off until the kubelet
// knows the pools, so that it does not delay them: giving the first scan's
// garbage back to the OS, each pool's CDI spec (until it is written
// Allocate returns DeviceSpecs and no CDI names), the leftovers of a
// killed run. The scan's garbage is collected before the specs are
// built, so that they reuse its pages instead of adding to the peak, and
// all of it goes back to the OS after. Only once: returning the pages
// before the specs only had the specs fault them in again, and each
// forced release in this round is a stall for the Allocates the kubelet
// sends right after registration, longer the larger the host (the
// 1024-VF host's p99 against the DGX's, BenchmarkDaemonAllocate).
func (m *Manager) afterFirstRegistration() {
	m.registeredOnce = true
	if m.opts.ReleaseMemory {
		runtime.GC()
	}
	for r, s := range m.servers {
		v := s.served()
		if v.cdi = m.writeCDISpec(r, &v.pool); v.cdi {
			s.setServed(v)
		}
	}
	m.removeLeftovers()
	m.releaseMemory()
	m.settle()
	close(m.firstRound)
}

// writeCDISpec writes a pool's CDI spec and reports whether Allocate may
// hand out CDI names for it: without its spec they would fail the
// container.
func (m *Manager) writeCDISpec(r string, p *pool.Pool) bool {
	if m.cdi == nil {
		return false
	}
	ok, err := m.cdi.write(p, m.rdmaCM, m.opts.NodeRoot)
	if err != nil {
		m.log.Error("write CDI spec; Allocate returns no CDI device names for the pool", "resource", r, "err", err)
	}
	return ok
}

// releaseMemory gives the garbage of a scan back to the OS.
func (m *Manager) releaseMemory() {
	if m.opts.ReleaseMemory {
		debug.FreeOSMemory()
	}
}

// removeLeftovers deletes the device-info files, CDI specs and the
// temporary files of both that an earlier run killed before its shutdown
// left behind.
func (m *Manager) removeLeftovers() {
	for _, p := range m.pools {
		if err := m.devInfo.removeLeftovers(p.Prefix, p.Name); err != nil {
			m.log.Warn("remove an earlier run's device-info files", "err", err)
		}
	}
	if m.cdi != nil {
		if err := m.cdi.removeLeftovers(m.pools); err != nil {
			m.log.Warn("remove an earlier run's CDI specs", "err", err)
		}
	}
}

// shutdown stops every server and removes its socket and the device-info
// files. The CDI specs stay: the kubelet hands a restarting container the
// CDI names its Allocate got, and the runtime resolves them from the specs
// on disk, also while no plugin runs (a rollout, a config that does not
// load). The next start removes the specs of pools it no longer serves.
func (m *Manager) shutdown() {
	for _, s := range m.servers {
		s.stop()
	}
	if m.cdi != nil {
		if err := m.cdi.removeStaging(); err != nil {
			m.log.Warn("remove CDI staging directory", "err", err)
		}
	}
	if err := m.devInfo.removeAll(); err != nil {
		m.log.Warn("remove device-info files", "err", err)
	}
	m.log.Info("stopped; sockets and device-info files removed, CDI specs kept for restarting containers")
}
