// Package failpointtest is the sriov CNI's fault-injection build for the soak
// suite (test/soak): cmd/sriov-cni built with -tags failpoints calls Wire,
// which makes the plugin kill itself at a named step boundary and keeps VF
// settings on the PF and RDMA device placement in files instead of
// netlink. Release builds do not link it (test/shipcheck checks).
package failpointtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/cmd/sriov-cni/internal/plugin"
	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// The fault-injection suite (test/soak) builds the plugin with -tags
// failpoints; release builds have none of this. Its environment:
const (
	// FailpointEnv names the step boundary at which the plugin kills
	// itself with SIGKILL, as the OOM killer or a node drain would:
	// e.g. add:link, teardown:vf.
	FailpointEnv = "FASTPATH_FAILPOINT"
	// FakePFEnv names a directory where VF settings on the PF are kept,
	// one JSON file per PF netdev, instead of rtnetlink (this machine has
	// no SR-IOV PF), so that they outlive a killed plugin like a PF's do.
	FakePFEnv = "FASTPATH_FAKE_PF"
	// FakeRDMAEnv names a JSON file that records which netns (by inode)
	// each RDMA device is in, in exclusive mode, instead of RDMA netlink.
	FakeRDMAEnv = "FASTPATH_FAKE_RDMA"
	// StandInsEnv, when set, says the VFs are veth stand-ins, each told
	// by an alternative name StandInAltName gave it (see NetdevPCI).
	StandInsEnv = "FASTPATH_STANDINS"
)

// standInPrefix starts the alternative name that tells a veth stand-in's
// VF: ifnames take no ':' (dev_valid_name, net/core/dev.c), so the PCI
// address's colons become underscores.
const standInPrefix = "fpvf_"

// StandInAltName is the alternative name that makes a veth stand-in the
// VF at pciAddr for a plugin wired with StandInsEnv set.
func StandInAltName(pciAddr string) string {
	return standInPrefix + strings.ReplaceAll(pciAddr, ":", "_")
}

// NetdevPCI plays the kernel's IFLA_PARENT_DEV_NAME for the stand-ins
// (Plugin.NetdevPCI): a VF netdev's parent device is its VF under any
// name, in any netns (rtnl_fill_ifinfo puts dev_name(dev->dev.parent),
// net/core/rtnetlink.c, since 5.15). A stand-in is told by its
// StandInAltName, which the kernel keeps across renames and moves to
// another netns (the netdev's name nodes move with it in
// __dev_change_net_namespace, net/core/dev.c); every other link, the
// peers included, has no PCI parent, as a veth or bridge has none.
func NetdevPCI(l netlink.Link) string {
	for _, alt := range l.Attrs().AltNames {
		if enc, ok := strings.CutPrefix(alt, standInPrefix); ok {
			return strings.Replace(enc, "_", ":", 2)
		}
	}
	return ""
}

// Wire gives p what the environment asks for: a failpoint, VF settings
// in files, RDMA placement in a file.
func Wire(p *plugin.Plugin) {
	if want := os.Getenv(FailpointEnv); want != "" {
		p.SetFailpoint(func(name string) {
			if name != want {
				return
			}
			fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
			_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {} // the signal is on its way
		})
	}
	if dir := os.Getenv(FakePFEnv); dir != "" {
		p.NewPFLink = func(*netlink.Handle) sriov.PFLink { return filePFLink{dir: dir} }
		p.VFDriver = filePFLink{dir: dir}
	}
	if path := os.Getenv(FakeRDMAEnv); path != "" {
		p.RDMA = fileRDMA{path: path}
	}
	if os.Getenv(StandInsEnv) != "" {
		p.NetdevPCI = NetdevPCI
	}
}

// locked runs f with an exclusive flock on path+".lock": concurrent
// plugins (one per VF) share the files.
func locked(path string, f func() error) error {
	l, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	defer l.Close()
	if err := unix.Flock(int(l.Fd()), unix.LOCK_EX); err != nil {
		return err
	}
	return f()
}

func load(path string, v any) error {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

func save(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return atomicfile.Write(path, b, 0o600)
}

// UnconfiguredVF is the settings of a VF nobody changed, as mlx5 reports
// them: zero MAC, spoof checking on, 802.1Q.
var UnconfiguredVF = sriov.VFConfig{MAC: "00:00:00:00:00:00", SpoofChk: true, Proto: sriov.VlanProto8021Q}

// filePFLink keeps VF settings in <dir>/<pf>.json (map of VF index to
// settings).
type filePFLink struct{ dir string }

func (f filePFLink) update(pf string, vf int, change func(*sriov.VFConfig)) (sriov.VFConfig, error) {
	path := filepath.Join(f.dir, pf+".json")
	var out sriov.VFConfig
	err := locked(path, func() error {
		vfs := map[int]sriov.VFConfig{}
		if err := load(path, &vfs); err != nil {
			return err
		}
		c, ok := vfs[vf]
		if !ok {
			c = UnconfiguredVF
		}
		if change == nil {
			out = c
			return nil
		}
		change(&c)
		vfs[vf] = c
		out = c
		return save(path, vfs)
	})
	return out, err
}

func (f filePFLink) VF(pf string, vf int) (sriov.VFConfig, error) { return f.update(pf, vf, nil) }

func (f filePFLink) SetVFVlan(pf string, vf, vlan, qos, proto int) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.Vlan, c.QoS, c.Proto = vlan, qos, proto })
	return err
}

func (f filePFLink) SetVFMAC(pf string, vf int, mac net.HardwareAddr) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.MAC = mac.String() })
	return err
}

func (f filePFLink) SetVFSpoofChk(pf string, vf int, on bool) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.SpoofChk = on })
	return err
}

func (f filePFLink) SetVFTrust(pf string, vf int, on bool) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.Trust = on })
	return err
}

func (f filePFLink) SetVFLinkState(pf string, vf int, state uint32) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.LinkState = state })
	return err
}

func (f filePFLink) SetVFRate(pf string, vf, lo, hi int) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.MinTxRate, c.MaxTxRate = lo, hi })
	return err
}

func (f filePFLink) SetVFGUID(pf string, vf int, guid net.HardwareAddr) error {
	_, err := f.update(pf, vf, func(c *sriov.VFConfig) { c.GUID = guid.String() })
	return err
}

// MACChange answers a change of the VF netdev's own MAC to mac as igb and
// igbvf do, from the VF's settings in the files: EADDRNOTAVAIL while the
// PF holds a non-zero MAC for the VF, unless mac is that MAC. Closed
// gives the netdev the PF's MAC, as igbvf's reset does. The unit tests'
// igbVF (fakes_test.go) says where each part was checked, and also keeps
// the MAC of the VF's last reset, which this one takes to be the PF's.
func (f filePFLink) MACChange(st *plugin.State, mac net.HardwareAddr) error {
	admin, err := f.adminMAC(st)
	if err != nil || admin == nil || admin.String() == mac.String() {
		return err
	}
	return unix.EADDRNOTAVAIL
}

func (f filePFLink) Closed(st *plugin.State, h *netlink.Handle, l netlink.Link) error {
	admin, err := f.adminMAC(st)
	if err != nil || admin == nil {
		return err
	}
	return h.LinkSetHardwareAddr(l, admin)
}

// adminMAC is the non-zero MAC the PF holds for the VF, nil when none.
func (f filePFLink) adminMAC(st *plugin.State) (net.HardwareAddr, error) {
	c, err := f.VF(st.PFNetdev, st.VFIndex)
	if err != nil {
		return nil, err
	}
	admin, err := net.ParseMAC(c.MAC)
	if err != nil || admin.String() == "00:00:00:00:00:00" {
		return nil, nil
	}
	return admin, nil
}

// fileRDMA keeps, in one JSON file, the netns inode of each RDMA device
// that is not in the plugin's own (host) netns.
type fileRDMA struct{ path string }

func inode(n *netns.NS) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(n.Fd(), &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func hostInode() (uint64, error) {
	var st unix.Stat_t
	err := unix.Stat("/proc/self/ns/net", &st)
	return st.Ino, err
}

func (fileRDMA) NetnsMode() (string, error) { return plugin.RDMAModeExclusive, nil }

func (r fileRDMA) where(devs map[string]uint64, dev string) (uint64, error) {
	if ino, ok := devs[dev]; ok {
		return ino, nil
	}
	return hostInode()
}

func (r fileRDMA) Move(dev string, from, to *netns.NS) error {
	return locked(r.path, func() error {
		devs := map[string]uint64{}
		if err := load(r.path, &devs); err != nil {
			return err
		}
		at, err := r.where(devs, dev)
		if err != nil {
			return err
		}
		src, err := inode(from)
		if err != nil {
			return err
		}
		if at != src {
			return fmt.Errorf("RDMA device %s is not in %s", dev, from.Path())
		}
		dst, err := inode(to)
		if err != nil {
			return err
		}
		if host, _ := hostInode(); dst == host {
			delete(devs, dev)
		} else {
			devs[dev] = dst
		}
		return save(r.path, devs)
	})
}

func (r fileRDMA) Present(dev string, in *netns.NS) (bool, error) {
	var present bool
	err := locked(r.path, func() error {
		devs := map[string]uint64{}
		if err := load(r.path, &devs); err != nil {
			return err
		}
		at, err := r.where(devs, dev)
		if err != nil {
			return err
		}
		n, err := inode(in)
		present = at == n
		return err
	})
	return present, err
}
