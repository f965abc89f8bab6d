package provision

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// GUIDSetter sets an InfiniBand VF's node and port GUID through its PF
// (sriov.PFLink's SetVFGUID: rtnetlink IFLA_VF_IB_NODE_GUID and
// IFLA_VF_IB_PORT_GUID on the PF's netdev).
type GUIDSetter interface {
	SetVFGUID(pf string, vf int, guid net.HardwareAddr) error
}

var _ GUIDSetter = sriov.PFLink(nil)

// SysfsKernel is the real Kernel: it writes the sysfs attributes the
// kernel takes these changes through, below <root>/sys, and sets GUIDs
// through GUIDs (the netlink PFLink in production).
type SysfsKernel struct {
	sys   string
	guids GUIDSetter
}

var _ Kernel = (*SysfsKernel)(nil)

// NewSysfsKernel writes below <root>/sys; root "" is "/".
func NewSysfsKernel(root string, guids GUIDSetter) *SysfsKernel {
	if root == "" {
		root = "/"
	}
	return &SysfsKernel{sys: filepath.Join(root, "sys"), guids: guids}
}

// write writes one attribute, the way `echo v > path` does: one write of
// the whole value, and the kernel's answer (EBUSY, ERANGE, …) is the
// error.
func write(path, v string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(v))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func (k *SysfsKernel) dev(addr string, attr ...string) (string, error) {
	if !pci.ValidAddress(addr) {
		return "", fmt.Errorf("%q is not a PCI address", addr)
	}
	return filepath.Join(append([]string{k.sys, "bus", "pci", "devices", addr}, attr...)...), nil
}

func (k *SysfsKernel) writeDev(addr, attr, v, what string) error {
	p, err := k.dev(addr, attr)
	if err != nil {
		return err
	}
	if err := write(p, v); err != nil {
		return fmt.Errorf("pci %s: %s: %w", addr, what, err)
	}
	return nil
}

// SetNumVFs writes sriov_numvfs.
func (k *SysfsKernel) SetNumVFs(pf string, n int) error {
	return k.writeDev(pf, "sriov_numvfs", strconv.Itoa(n), "write sriov_numvfs "+strconv.Itoa(n))
}

// SetAutoprobe writes sriov_drivers_autoprobe.
func (k *SysfsKernel) SetAutoprobe(pf string, on bool) error {
	v := "0"
	if on {
		v = "1"
	}
	return k.writeDev(pf, "sriov_drivers_autoprobe", v, "write sriov_drivers_autoprobe "+v)
}

// SetVFGUID sets the VF's node and port GUID through its PF's netdev
// (rtnetlink). Where that is refused (no IPoIB netdev for the PF, e.g.
// ib_ipoib not loaded) and the PF has MLNX_OFED's per-VF GUID files
// (<pf>/sriov/<vf>/node and port), they are written instead: the same
// firmware setting through the vendor driver's own interface.
func (k *SysfsKernel) SetVFGUID(pf, pfNetdev string, vf int, guid net.HardwareAddr) error {
	var err error
	if k.guids == nil {
		err = errors.New("no netlink access")
	} else if err = k.guids.SetVFGUID(pfNetdev, vf, guid); err == nil {
		return nil
	}
	err = fmt.Errorf("pci %s: set VF %d node/port GUID %s on %s: %w", pf, vf, guid, orNone(pfNetdev), err)
	dir, derr := k.dev(pf, "sriov", strconv.Itoa(vf))
	if derr != nil {
		return derr
	}
	if _, serr := os.Stat(filepath.Join(dir, "node")); serr != nil {
		return err // no MLNX_OFED files: the netlink error is the answer
	}
	for _, f := range []string{"node", "port"} {
		if werr := write(filepath.Join(dir, f), guid.String()); werr != nil {
			return fmt.Errorf("%w; MLNX_OFED sriov/%d/%s: %w", err, vf, f, werr)
		}
	}
	return nil
}

func orNone(netdev string) string {
	if netdev == "" {
		return "(no PF netdev)"
	}
	return netdev
}

// Unbind writes the function's address to its driver's unbind; an
// unbound function is left as it is.
func (k *SysfsKernel) Unbind(addr string) error {
	p, err := k.dev(addr, "driver", "unbind")
	if err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Dir(p)); os.IsNotExist(err) {
		return nil
	}
	if err := write(p, addr); err != nil {
		return fmt.Errorf("pci %s: unbind: %w", addr, err)
	}
	return nil
}

// Bind sets driver_override to driver (or clears it for DriverByID) and
// asks the PCI core to probe the function (drivers_probe). The write
// succeeds whether or not a driver binds: a VF with no override is probed
// only while its PF's sriov_drivers_autoprobe is 1 (pci_device_can_probe,
// drivers/pci/pci-driver.c), which is for the caller to see to.
func (k *SysfsKernel) Bind(addr, driver string) error {
	override := "\n"
	if driver != DriverByID {
		override = driver
	}
	what := driver
	if driver == DriverByID {
		what = "the driver its IDs match"
	}
	if err := k.writeDev(addr, "driver_override", override, "write driver_override "+strings.TrimSpace(override)); err != nil {
		return err
	}
	if err := write(filepath.Join(k.sys, "bus", "pci", "drivers_probe"), addr); err != nil {
		return fmt.Errorf("pci %s: probe for %s (drivers_probe): %w", addr, what, err)
	}
	return nil
}

// SetMTU writes the netdev's mtu attribute.
func (k *SysfsKernel) SetMTU(netdev string, mtu int) error {
	if err := ifname.Check(netdev); err != nil {
		return fmt.Errorf("set MTU %d: %w", mtu, err)
	}
	if err := write(filepath.Join(k.sys, "class", "net", netdev, "mtu"), strconv.Itoa(mtu)); err != nil {
		return fmt.Errorf("netdev %s: set MTU %d: %w", netdev, mtu, err)
	}
	return nil
}
