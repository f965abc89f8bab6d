package plugin

// SetFailpoint makes the plugin call f at each step boundary of ADD and
// teardown (add:locked, add:journal, …). Only a test build sets one: the
// soak suite's (cmd/sriov-cni with -tags failpoints, package
// failpointtest), which kills the plugin there; release builds link no
// caller.
func (p *Plugin) SetFailpoint(f func(name string)) { p.failpoint = f }
