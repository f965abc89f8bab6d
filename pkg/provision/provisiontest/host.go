package provisiontest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Host is what the PCI core and the VF drivers do to a fixture host under
// Root when provisioning writes one of their attributes. Kernel (method
// calls) and Standin (file writes seen through inotify) both react
// through it. It is not safe for concurrent use: its callers serialise.
//
// The kernel behaviours it models, and where each was checked:
//   - sriov_numvfs (SetNumVFs): the same count is a no-op; above
//     sriov_totalvfs is ERANGE; one non-zero count to another is EBUSY,
//     for every driver; 0 removes the VFs. drivers/pci/iov.c
//     sriov_numvfs_store; EBUSY also seen in the real-kernel guest
//     (docs/e2e.md, igb).
//   - VFs made while the PF's sriov_drivers_autoprobe is 1 are probed at
//     once, each by the driver its vendor and device IDs match (igbvf for
//     an igb PF's VFs, not the PF's driver); with 0 they stay unbound.
//     drivers/pci/iov.c pci_iov_add_virtfn -> pci_bus_add_device, gated by
//     pci_device_can_probe (drivers/pci/pci-driver.c); seen in the guest.
//   - sriov_drivers_autoprobe is a flag read at probe time: writing it
//     probes nothing. drivers/pci/iov.c sriov_drivers_autoprobe_store.
//   - drivers_probe (DriversProbe) probes an unbound function and answers
//     success whether or not a driver binds; a VF whose PF has autoprobe 0
//     is probed only when its driver_override is set; an override binds
//     the driver it names, else the driver the IDs match binds.
//     drivers/base/bus.c drivers_probe_store, drivers/pci/pci-driver.c
//     pci_device_can_probe and pci_match_device; autoprobe 0 + empty
//     override binding nothing was seen in the guest.
//   - unbind removes the driver's netdevs and RDMA devices.
//
// What it does not model: a driver binds only when it is registered
// (sys/bus/pci/drivers/<name> exists), except vfio-pci, which the fake
// always has; the ID tables are IDDrivers, a few entries of the real ones;
// probes never fail.
type Host struct {
	Root string
	// MLNXOFED lays out what MLNX_OFED's mlx5 adds for each VF of a PF:
	// sriov/<vf>/node and sriov/<vf>/port under the PF, the VF's GUIDs,
	// which a probe of the VF then shows as its node GUID.
	MLNXOFED bool
	// Probed, when set, is called when a VF is probed, with the name of
	// the netdev it gets, before sysfs shows the netdev and RDMA device.
	Probed func(vf, netdev string) error
	// Removed, when set, is called with the netdevs an unbind or a
	// sriov_numvfs 0 removes, before sysfs stops showing them.
	Removed func(netdevs []string)
}

func (h *Host) dev(addr string, attr ...string) string {
	return filepath.Join(append([]string{h.Root, "sys", "bus", "pci", "devices", addr}, attr...)...)
}

func readTrim(path string) string {
	b, _ := os.ReadFile(path)
	return strings.TrimSpace(string(b))
}

func readInt(path string) (int, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// NumVFs is how many VFs the PCI core has enabled on pf: its virtfnN
// links (sriov_numvfs may hold a value just written).
func (h *Host) NumVFs(pf string) int {
	links, _ := filepath.Glob(h.dev(pf, "virtfn*"))
	return len(links)
}

// SetNumVFs does what the PCI core's sriov_numvfs_store does: the same
// count is a no-op; a count above sriov_totalvfs is ERANGE (a PF whose
// firmware has SR-IOV off has 0); a change between two non-zero counts is
// EBUSY; 0 removes the VFs; otherwise the VFs appear, each bound to the
// driver its IDs match when sriov_drivers_autoprobe is 1. It returns the
// VFs so bound, which the caller probes (now or later, as a driver's
// probe adds the netdev after the write returned).
func (h *Host) SetNumVFs(pf string, n int) (autoprobed []string, err error) {
	path := h.dev(pf, "sriov_numvfs")
	cur := h.NumVFs(pf)
	total, err := readInt(h.dev(pf, "sriov_totalvfs"))
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", pf, err)
	}
	switch {
	case n == cur:
		return nil, nil
	case n < 0 || n > total:
		return nil, fmt.Errorf("pci %s: %w", pf, writeErr(path, syscall.ERANGE))
	case n != 0 && cur != 0:
		return nil, fmt.Errorf("pci %s: %d VFs already enabled: %w", pf, cur, writeErr(path, syscall.EBUSY))
	case n == 0:
		var gone []string
		links, _ := filepath.Glob(h.dev(pf, "virtfn*"))
		for _, l := range links {
			gone = append(gone, h.netdevs(l)...)
		}
		h.removed(gone)
		if h.MLNXOFED {
			if err := os.RemoveAll(h.dev(pf, "sriov")); err != nil {
				return nil, err
			}
		}
		return nil, fixture.DisableVFs(h.Root, pf)
	}
	if h.MLNXOFED {
		// Before the VFs show on the bus: a writer that sees them may
		// set their GUIDs at once.
		for k := range n {
			for _, f := range []string{"node", "port"} {
				p := h.dev(pf, "sriov", strconv.Itoa(k), f)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					return nil, err
				}
				if err := os.WriteFile(p, []byte("00:00:00:00:00:00:00:00\n"), 0o644); err != nil {
					return nil, err
				}
			}
		}
	}
	// Read as the write is handled, before the VFs show on the bus (the
	// kernel adds and probes them before sriov_numvfs_store returns): a
	// writer that sees them may change autoprobe at once.
	auto := h.autoprobe(pf)
	vfs, err := fixture.EnableVFs(h.Root, pf, n, false)
	if err != nil {
		return nil, err
	}
	if !auto {
		return nil, nil
	}
	for _, vf := range vfs {
		drv := h.match(vf)
		if drv == "" {
			continue
		}
		if err := fixture.BindDriver(h.Root, vf, drv); err != nil {
			return nil, err
		}
		autoprobed = append(autoprobed, vf)
	}
	return autoprobed, nil
}

// autoprobe reads the PF's sriov_drivers_autoprobe (1 when unreadable,
// the kernel's default).
func (h *Host) autoprobe(pf string) bool {
	v, err := readInt(h.dev(pf, "sriov_drivers_autoprobe"))
	return err != nil || v != 0
}

// IDDrivers is the driver whose ID table lists a function's
// "vendor:device", the VF entries of the kernel's tables that the fixture
// hosts use: mlx5_core's mlx5_core_pci_table
// (drivers/net/ethernet/mellanox/mlx5/core/main.c), igbvf's igbvf_pci_tbl
// (drivers/net/ethernet/intel/igbvf/netdev.c), ixgbevf's (82599 VF,
// IXGBE_DEV_ID_82599_VF), iavf's iavf_pci_tbl
// (drivers/net/ethernet/intel/iavf/iavf_main.c), bnxt_en's bnxt_pci_tbl
// (NETXTREME_E_P5_VF, drivers/net/ethernet/broadcom/bnxt/bnxt.c).
var IDDrivers = map[string]string{
	"15b3:1016": "mlx5_core", "15b3:1018": "mlx5_core", "15b3:101a": "mlx5_core",
	"15b3:101c": "mlx5_core", "15b3:101e": "mlx5_core",
	"8086:10ca": "igbvf", "8086:1520": "igbvf",
	"8086:10ed": "ixgbevf",
	"8086:1889": "iavf",
	"14e4:1806": "bnxt_en", "14e4:1807": "bnxt_en",
}

// match is the driver the kernel would bind the function at addr to by
// its IDs: IDDrivers' entry, if that driver is registered (its directory
// under sys/bus/pci/drivers exists); "" when none.
func (h *Host) match(addr string) string {
	vendor, _ := os.ReadFile(h.dev(addr, "vendor"))
	device, _ := os.ReadFile(h.dev(addr, "device"))
	id := strings.TrimPrefix(strings.TrimSpace(string(vendor)), "0x") + ":" + strings.TrimPrefix(strings.TrimSpace(string(device)), "0x")
	drv := IDDrivers[id]
	if drv == "" {
		return ""
	}
	if _, err := os.Stat(filepath.Join(h.Root, "sys", "bus", "pci", "drivers", drv)); err != nil {
		return ""
	}
	return drv
}

// netdevs lists the netdevs of the function at dir.
func (h *Host) netdevs(dir string) []string {
	ents, _ := os.ReadDir(filepath.Join(dir, "net"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

func (h *Host) removed(netdevs []string) {
	if h.Removed != nil && len(netdevs) > 0 {
		h.Removed(netdevs)
	}
}

// VF is the PF and index of the VF at addr (from its physfn and the PF's
// virtfnN links).
func (h *Host) VF(addr string) (pf string, k int, err error) {
	l, err := os.Readlink(h.dev(addr, "physfn"))
	if err != nil {
		return "", 0, fmt.Errorf("pci %s is not a VF: %w", addr, err)
	}
	pf = filepath.Base(l)
	links, _ := filepath.Glob(h.dev(pf, "virtfn*"))
	for _, link := range links {
		if t, err := os.Readlink(link); err == nil && filepath.Base(t) == addr {
			k, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(link), "virtfn"))
			return pf, k, err
		}
	}
	return "", 0, fmt.Errorf("pci %s: no virtfn link of %s points to it", addr, pf)
}

// Driver is the driver the function at addr is bound to, "" when none.
func (h *Host) Driver(addr string) string {
	l, err := os.Readlink(h.dev(addr, "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}

// DriversProbe does what writing addr to /sys/bus/pci/drivers_probe does:
// nothing to a bound function; a VF whose PF has sriov_drivers_autoprobe
// 0 and whose driver_override is empty is not probed (and the write still
// succeeds); otherwise the driver driver_override names binds, or without
// one the driver its IDs match, if any. It returns the driver bound ("":
// none) and whether a netdev driver's probe (Probe) follows.
func (h *Host) DriversProbe(addr string) (driver string, probe bool, err error) {
	if h.Driver(addr) != "" {
		return "", false, nil
	}
	override := readTrim(h.dev(addr, "driver_override"))
	if override == "(null)" {
		override = ""
	}
	if l, err := os.Readlink(h.dev(addr, "physfn")); err == nil && override == "" && !h.autoprobe(filepath.Base(l)) {
		return "", false, nil // pci_device_can_probe: false
	}
	driver = override
	if driver == "" {
		driver = h.match(addr)
	} else if _, err := os.Stat(filepath.Join(h.Root, "sys", "bus", "pci", "drivers", driver)); err != nil && driver != provision.DriverVFIO {
		driver = "" // not registered
	}
	if driver == "" {
		return "", false, nil
	}
	if err := fixture.BindDriver(h.Root, addr, driver); err != nil {
		return "", false, err
	}
	return driver, driver != provision.DriverVFIO, nil
}

// Unbind unbinds the function from its driver, as writing its address to
// the driver's unbind does; its netdevs and RDMA devices go.
func (h *Host) Unbind(addr string) error {
	h.removed(h.netdevs(h.dev(addr)))
	return fixture.UnbindDriver(h.Root, addr)
}

// Probe is the bound driver's probe of the VF at addr adding what it adds
// (fixture.ProbeVF): for mlx5_core (and mlx5_ib) its netdev and RDMA
// device, whose node GUID is guid, or with MLNXOFED and guid nil the one
// sriov/<vf>/node holds; for iavf, igbvf, ixgbevf a netdev; for bnxt_en a
// netdev and its bnxt_re device. A VF unbound meanwhile, or bound to
// vfio-pci, is left alone.
func (h *Host) Probe(addr string, guid net.HardwareAddr) error {
	switch drv := h.Driver(addr); {
	case drv == "" || drv == provision.DriverVFIO:
		return nil
	case drv != provision.DriverNetdevice:
		guid = nil // set GUIDs are ConnectX's
	case guid == nil && h.MLNXOFED:
		pf, k, err := h.VF(addr)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(h.dev(pf, "sriov", strconv.Itoa(k), "node"))
		if err != nil {
			return fmt.Errorf("pci %s: read its MLNX_OFED node GUID: %w", addr, err)
		}
		if guid, err = net.ParseMAC(strings.TrimSpace(string(b))); err != nil {
			return fmt.Errorf("pci %s: MLNX_OFED node GUID %q: %w", addr, strings.TrimSpace(string(b)), err)
		}
	}
	s := ""
	if len(guid) == 8 && strings.Trim(guid.String(), "0:") != "" {
		h := fmt.Sprintf("%x", []byte(guid))
		s = h[0:4] + ":" + h[4:8] + ":" + h[8:12] + ":" + h[12:16]
	}
	if h.Probed != nil {
		// Before sysfs shows the netdev: whoever sees it there finds
		// the link too, as on a node.
		name, err := fixture.VFNetdev(h.Root, addr)
		if err != nil {
			return err
		}
		if err := h.Probed(addr, name); err != nil {
			return err
		}
	}
	return fixture.ProbeVF(h.Root, addr, s)
}
