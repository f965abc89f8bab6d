package plugin

import (
	"fmt"
	"net"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// fakePF keeps VF settings in memory and records every call.
type fakePF struct {
	mu    sync.Mutex // guards the fields below
	vfs   map[string]*VFConfig
	calls []string
	// failOn makes the named method fail (once per entry).
	failOn map[string]error
	// failCall makes the n-th call (from 1) of the named method fail.
	failCall map[string]int
	count    map[string]int
}

var _ PF = (*fakePF)(nil)

func newFakePF() *fakePF {
	return &fakePF{vfs: map[string]*VFConfig{}, failOn: map[string]error{}, failCall: map[string]int{}, count: map[string]int{}}
}

func (f *fakePF) vf(pf string, vf int) *VFConfig {
	k := fmt.Sprintf("%s/%d", pf, vf)
	if f.vfs[k] == nil {
		f.vfs[k] = &VFConfig{MAC: "00:00:00:00:00:00", SpoofChk: true, Proto: VlanProto8021Q}
	}
	return f.vfs[k]
}

func (f *fakePF) call(name, format string, args ...any) error {
	f.calls = append(f.calls, name+" "+fmt.Sprintf(format, args...))
	f.count[name]++
	if n, ok := f.failCall[name]; ok && n == f.count[name] {
		return fmt.Errorf("%s: injected failure of call %d", name, n)
	}
	if err, ok := f.failOn[name]; ok {
		delete(f.failOn, name)
		return err
	}
	return nil
}

func (f *fakePF) Calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakePF) Get(pf string, vf int) VFConfig {
	f.mu.Lock()
	defer f.mu.Unlock()
	return *f.vf(pf, vf)
}

func (f *fakePF) VF(pf string, vf int) (VFConfig, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("VF", "%s %d", pf, vf); err != nil {
		return VFConfig{}, err
	}
	return *f.vf(pf, vf), nil
}

func (f *fakePF) SetVFVlan(pf string, vf, vlan, qos, proto int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFVlan", "%s %d %d %d %#x", pf, vf, vlan, qos, proto); err != nil {
		return err
	}
	c := f.vf(pf, vf)
	c.Vlan, c.QoS, c.Proto = vlan, qos, proto
	return nil
}

func (f *fakePF) SetVFMAC(pf string, vf int, mac net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFMAC", "%s %d %s", pf, vf, mac); err != nil {
		return err
	}
	f.vf(pf, vf).MAC = mac.String()
	return nil
}

func (f *fakePF) SetVFSpoofChk(pf string, vf int, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFSpoofChk", "%s %d %v", pf, vf, on); err != nil {
		return err
	}
	f.vf(pf, vf).SpoofChk = on
	return nil
}

func (f *fakePF) SetVFTrust(pf string, vf int, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFTrust", "%s %d %v", pf, vf, on); err != nil {
		return err
	}
	f.vf(pf, vf).Trust = on
	return nil
}

func (f *fakePF) SetVFLinkState(pf string, vf int, state uint32) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFLinkState", "%s %d %d", pf, vf, state); err != nil {
		return err
	}
	f.vf(pf, vf).LinkState = state
	return nil
}

func (f *fakePF) SetVFRate(pf string, vf, lo, hi int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFRate", "%s %d %d %d", pf, vf, lo, hi); err != nil {
		return err
	}
	c := f.vf(pf, vf)
	c.MinTxRate, c.MaxTxRate = lo, hi
	return nil
}

func (f *fakePF) SetVFGUID(pf string, vf int, guid net.HardwareAddr) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.call("SetVFGUID", "%s %d %s", pf, vf, guid); err != nil {
		return err
	}
	f.vf(pf, vf).GUID = guid.String()
	return nil
}

// fakeRDMA keeps which netns (by inode) each RDMA device is in; devices it
// never moved are in the netns of the test process.
type fakeRDMA struct {
	mu       sync.Mutex // guards the fields below
	mode     string
	modeErr  error
	host     string
	where    map[string]string
	moves    []string
	failMove error
}

var _ RDMA = (*fakeRDMA)(nil)

func newFakeRDMA(mode string) *fakeRDMA {
	var st unix.Stat_t
	if err := unix.Stat("/proc/self/ns/net", &st); err != nil {
		panic(err)
	}
	return &fakeRDMA{mode: mode, host: fmt.Sprint(st.Ino), where: map[string]string{}}
}

// nsID names a netns by its inode.
func nsID(n *netns.NS) string {
	var st unix.Stat_t
	if err := unix.Fstat(n.Fd(), &st); err != nil {
		return "?"
	}
	return fmt.Sprint(st.Ino)
}

func (f *fakeRDMA) NetnsMode() (string, error) { return f.mode, f.modeErr }

func (f *fakeRDMA) loc(dev string) string {
	if w, ok := f.where[dev]; ok {
		return w
	}
	return f.host
}

func (f *fakeRDMA) Move(dev string, from, to *netns.NS) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failMove != nil {
		err := f.failMove
		f.failMove = nil
		return err
	}
	if f.loc(dev) != nsID(from) {
		return fmt.Errorf("RDMA device %s is not in %s", dev, from.Path())
	}
	f.where[dev] = nsID(to)
	f.moves = append(f.moves, dev)
	return nil
}

func (f *fakeRDMA) Present(dev string, in *netns.NS) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loc(dev) == nsID(in), nil
}

// InHost reports whether dev is in the test process's netns.
func (f *fakeRDMA) InHost(dev string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loc(dev) == f.host
}
