// Package sriovtest is a fake sriov.PFLink for tests of code that changes
// VF settings on a PF: this machine's kernel has no SR-IOV PF to change.
package sriovtest

import (
	"fmt"
	"maps"
	"net"
	"sync"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// PFLink keeps VF settings in memory and records every call. A VF it has
// not seen starts as an unconfigured mlx5 VF: zero MAC, spoof checking on,
// 802.1Q.
type PFLink struct {
	mu       sync.Mutex // guards the fields below
	vfs      map[string]sriov.VFConfig
	portGUID map[string]string
	calls    []string
	failNext map[string]error
	failCall map[string]int
	count    map[string]int
}

var _ sriov.PFLink = (*PFLink)(nil)

// NewPFLink returns an empty fake.
func NewPFLink() *PFLink {
	return &PFLink{vfs: map[string]sriov.VFConfig{}, portGUID: map[string]string{}, failNext: map[string]error{}, failCall: map[string]int{}, count: map[string]int{}}
}

// Unconfigured is the settings of a VF nobody changed.
var Unconfigured = sriov.VFConfig{MAC: "00:00:00:00:00:00", SpoofChk: true, Proto: sriov.VlanProto8021Q}

func key(pf string, vf int) string { return fmt.Sprintf("%s/%d", pf, vf) }

func (f *PFLink) get(pf string, vf int) sriov.VFConfig {
	if c, ok := f.vfs[key(pf, vf)]; ok {
		return c
	}
	return Unconfigured
}

func (f *PFLink) update(pf string, vf int, change func(*sriov.VFConfig)) {
	c := f.get(pf, vf)
	change(&c)
	f.vfs[key(pf, vf)] = c
}

// FailNext makes the next call of method (e.g. "SetVFTrust") fail with err.
func (f *PFLink) FailNext(method string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failNext[method] = err
}

// FailCall makes the n-th call (from 1, counted from now on) of method fail.
func (f *PFLink) FailCall(method string, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failCall[method] = f.count[method] + n
}

// Calls returns the calls so far, e.g. "SetVFVlan ens1f0 3 100 0 0x8100".
func (f *PFLink) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// ResetCalls forgets the calls so far.
func (f *PFLink) ResetCalls() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = nil
}

// Get returns the settings of a VF.
func (f *PFLink) Get(pf string, vf int) sriov.VFConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.get(pf, vf)
}

// Set sets the settings of a VF, as if done out of band.
func (f *PFLink) Set(pf string, vf int, c sriov.VFConfig) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.vfs[key(pf, vf)] = c
}

// Clone returns a fake with the same VF settings and no calls.
func (f *PFLink) Clone() *PFLink {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := NewPFLink()
	c.vfs = maps.Clone(f.vfs)
	c.portGUID = maps.Clone(f.portGUID)
	return c
}

func (f *PFLink) call(name, format string, args ...any) error {
	f.calls = append(f.calls, name+" "+fmt.Sprintf(format, args...))
	return f.inject(name)
}

// inject counts a call of name and returns the failure FailNext or
// FailCall set for it.
func (f *PFLink) inject(name string) error {
	f.count[name]++
	if n, ok := f.failCall[name]; ok && n == f.count[name] {
		delete(f.failCall, name)
		return fmt.Errorf("%s: injected failure of call %d", name, n)
	}
	if err, ok := f.failNext[name]; ok {
		delete(f.failNext, name)
		return err
	}
	return nil
}

func (f *PFLink) VF(pf string, vf int) (sriov.VFConfig, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VF", "%s %d", pf, vf); err != nil {
		return sriov.VFConfig{}, err
	}
	return f.get(pf, vf), nil
}

func (f *PFLink) SetVFVlan(pf string, vf, vlan, qos, proto int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFVlan", "%s %d %d %d %#x", pf, vf, vlan, qos, proto); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.Vlan, c.QoS, c.Proto = vlan, qos, proto })
	return nil
}

func (f *PFLink) SetVFMAC(pf string, vf int, mac net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFMAC", "%s %d %s", pf, vf, mac); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.MAC = mac.String() })
	return nil
}

func (f *PFLink) SetVFSpoofChk(pf string, vf int, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFSpoofChk", "%s %d %v", pf, vf, on); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.SpoofChk = on })
	return nil
}

func (f *PFLink) SetVFTrust(pf string, vf int, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFTrust", "%s %d %v", pf, vf, on); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.Trust = on })
	return nil
}

func (f *PFLink) SetVFLinkState(pf string, vf int, state uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFLinkState", "%s %d %d", pf, vf, state); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.LinkState = state })
	return nil
}

func (f *PFLink) SetVFRate(pf string, vf, lo, hi int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFRate", "%s %d %d %d", pf, vf, lo, hi); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.MinTxRate, c.MaxTxRate = lo, hi })
	return nil
}

// SetVFGUID sets the node GUID (VFConfig.GUID), then the port GUID
// (PortGUID), as the netlink implementation does in two calls: FailNext or
// FailCall of "SetVFGUID" fails the first, changing nothing; of
// "SetVFPortGUID" the second, after the node GUID is set, with
// sriov.ErrPartlyApplied. Only "SetVFGUID" is recorded in Calls.
func (f *PFLink) SetVFGUID(pf string, vf int, guid net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFGUID", "%s %d %s", pf, vf, guid); err != nil {
		return err
	}
	f.update(pf, vf, func(c *sriov.VFConfig) { c.GUID = guid.String() })
	if err := f.inject("SetVFPortGUID"); err != nil {
		return fmt.Errorf("port GUID (node GUID set already): %w: %w", sriov.ErrPartlyApplied, err)
	}
	f.portGUID[key(pf, vf)] = guid.String()
	return nil
}

// PortGUID returns the port GUID of a VF ("" when never set).
func (f *PFLink) PortGUID(pf string, vf int) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.portGUID[key(pf, vf)]
}
