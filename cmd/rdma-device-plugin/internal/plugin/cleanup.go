package plugin

import (
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// afterFirstRegistration does what a start puts off until the kubelet
// knows the pools, so that it does not delay them: the netdev maps link
// events are checked against (indexNetdevs), each pool's CDI spec
// (until it is written Allocate returns DeviceSpecs and no CDI names) and
// the leftovers of a killed run. Giving the first scan's garbage back to
// the OS waits longer, for a pause in the Allocates (releaseWait): a
// restarted plugin is sent the Allocates of every pod that waited for it
// right after it registers, and a forced collection and release among
// them is a stall that grows with the host (the 1024-VF host's p99
// against the DGX's, BenchmarkDaemonAllocate).
func (m *Manager) afterFirstRegistration() {
	m.registeredOnce = true
	m.registeredAt = time.Now()
	// What the first apply left: no link event has been read yet.
	m.indexNetdevs()
	for r, s := range m.servers {
		v := s.served()
		if v.cdi = m.writeCDISpec(r, &v.pool); v.cdi {
			s.setServed(v)
		}
	}
	m.removeLeftovers()
	m.settle()
	close(m.firstRound)
}

// The first memory release after registration waits until no Allocate
// has come for releaseQuiet, and no longer than releaseMaxWait after the
// registration round: on a node whose pods keep coming it is not put off
// for good. Variables for the tests.
var (
	releaseQuiet   = 200 * time.Millisecond
	releaseMaxWait = 2 * time.Second
)

// releaseWait is how much longer the first release waits at now: 0 when
// it is due.
func (m *Manager) releaseWait(now time.Time) time.Duration {
	left := releaseMaxWait - now.Sub(m.registeredAt)
	if left <= 0 {
		return 0
	}
	last := m.lastAlloc.Load()
	if last == 0 {
		return 0
	}
	quiet := releaseQuiet - now.Sub(time.Unix(0, last))
	if quiet <= 0 {
		return 0
	}
	return min(quiet, left)
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
	if m.opts.ReleaseMemory != nil {
		m.opts.ReleaseMemory()
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
