package provisiontest

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/fastpath-k8s/fastpath/internal/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Host is what the PCI core and mlx5 do to a fixture host under Root
// when provisioning writes one of their attributes. Kernel (method calls)
// and Standin (file writes seen through inotify) both react through it.
// It is not safe for concurrent use: its callers serialise.
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
// EBUSY; 0 removes the VFs; otherwise the VFs appear, bound to the PF's
// driver when sriov_drivers_autoprobe is 1. It returns the VFs so bound,
// which the caller probes (now or later, as mlx5 would).
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
	auto, _ := readInt(h.dev(pf, "sriov_drivers_autoprobe"))
	vfs, err := fixture.EnableVFs(h.Root, pf, n, auto == 1)
	if err != nil {
		return nil, err
	}
	if auto == 1 {
		return vfs, nil
	}
	return nil, nil
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

// Bind binds the function to driver, as drivers_probe does once
// driver_override names it; probe says whether mlx5_core's probe (Probe)
// follows.
func (h *Host) Bind(addr, driver string) (probe bool, err error) {
	if err := fixture.BindDriver(h.Root, addr, driver); err != nil {
		return false, err
	}
	return driver == provision.DriverNetdevice, nil
}

// Unbind unbinds the function from its driver, as writing its address to
// the driver's unbind does; its netdevs and RDMA devices go.
func (h *Host) Unbind(addr string) error {
	h.removed(h.netdevs(h.dev(addr)))
	return fixture.UnbindDriver(h.Root, addr)
}

// Probe is mlx5_core and mlx5_ib binding the VF at addr: its netdev and
// RDMA device appear; the RDMA device's node GUID is guid, or with
// MLNXOFED and guid nil the one sriov/<vf>/node holds. A VF no longer
// bound to mlx5_core (unbound meanwhile) is left alone.
func (h *Host) Probe(addr string, guid net.HardwareAddr) error {
	if h.Driver(addr) != provision.DriverNetdevice {
		return nil
	}
	if guid == nil && h.MLNXOFED {
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
