package plugin

// removeLeftovers deletes the device-info files and CDI specs that an
// earlier run killed before its shutdown left behind.
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

// shutdown stops every server and removes what the plugin wrote.
func (m *Manager) shutdown() {
	for r, s := range m.servers {
		s.stop()
		if m.cdi != nil {
			p := m.pools[r]
			if err := m.cdi.remove(p.Prefix, p.Name); err != nil {
				m.log.Warn("remove CDI spec", "resource", r, "err", err)
			}
		}
	}
	if err := m.devInfo.removeAll(); err != nil {
		m.log.Warn("remove device-info files", "err", err)
	}
	m.log.Info("stopped; sockets, device-info files and CDI specs removed")
}
