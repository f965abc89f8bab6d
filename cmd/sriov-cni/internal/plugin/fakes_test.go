package plugin

import (
	"bytes"
	"fmt"
	"net"
	"sync"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

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

// igbVF plays igbvf, with igb for its PF, for the veth links that stand
// in for VFs (which take any MAC and have no driver), from the VF's
// settings on the fake PF pf. What it models, from the kernel source:
//   - while the PF holds a non-zero MAC for the VF (igb_ndo_set_vf_mac sets
//     IGB_VF_FLAG_PF_SET_MAC; a zero MAC clears it, the 6.12 igb.ko
//     prints "remove administratively set MAC on VF" then), igb NACKs the
//     VF's E1000_VF_SET_MAC_ADDR (igb_rcv_msg_from_vf,
//     drivers/net/ethernet/intel/igb/igb_main.c); igbvf then falls back to
//     perm_addr, the MAC the PF gave at the VF's last reset
//     (e1000_rar_set_vf, igbvf/vf.c), and igbvf_set_mac answers
//     EADDRNOTAVAIL unless the MAC asked for is that one (MACChange);
//   - closing the netdev resets the VF (igbvf_close -> igbvf_down ->
//     igbvf_reset, igbvf/netdev.c): perm_addr becomes the PF's MAC for the
//     VF and, while the PF holds one, the netdev takes it (Closed).
//
// Seen in the real-kernel guest (make e2e-kernel, 6.12.95, igb): ADD with
// mac failing with EADDRNOTAVAIL on the netdev's MAC after the PF's was
// set, and DEL after the pod netns was deleted failing to put the
// netdev's MAC back after the PF's was restored. Not modelled: a trusted
// VF, which igb versions with the trust check let through (the guest
// refused one too, so the fake refuses regardless); the MAC a VF sets for
// itself, which igb then reports as the VF's (the fake PF keeps the last
// one set through it); the reset that moving an up netdev to another
// netns causes (a test that moves one calls Closed). mlx5 takes a VF-side
// MAC either way: a nil Plugin.VFDriver.
type igbVF struct {
	pf   *sriovtest.PFLink
	mu   sync.Mutex                  // guards the field below
	perm map[string]net.HardwareAddr // by PF netdev and VF index: the PF's MAC at the VF's last reset
}

var _ VFDriver = (*igbVF)(nil)

func newIgbVF(pf *sriovtest.PFLink) *igbVF {
	return &igbVF{pf: pf, perm: map[string]net.HardwareAddr{}}
}

// adminMAC is the non-zero MAC the PF holds for the VF, nil when none.
func (d *igbVF) adminMAC(st *State) net.HardwareAddr {
	admin, err := net.ParseMAC(d.pf.Get(st.PFNetdev, st.VFIndex).MAC)
	if err != nil || bytes.Equal(admin, make(net.HardwareAddr, len(admin))) {
		return nil
	}
	return admin
}

func vfKey(st *State) string { return fmt.Sprintf("%s/%d", st.PFNetdev, st.VFIndex) }

func (d *igbVF) MACChange(st *State, mac net.HardwareAddr) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.adminMAC(st) == nil || bytes.Equal(d.perm[vfKey(st)], mac) {
		return nil
	}
	return unix.EADDRNOTAVAIL
}

func (d *igbVF) Closed(st *State, h *netlink.Handle, l netlink.Link) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	admin := d.adminMAC(st)
	d.perm[vfKey(st)] = admin
	if admin == nil {
		return nil
	}
	return h.LinkSetHardwareAddr(l, admin)
}
