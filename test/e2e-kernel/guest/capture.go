package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// The attributes a capture keeps of each PCI function and of each netdev:
// what discovery, the pools, provisioning and doctor read (pkg/pci,
// pkg/sriov, pkg/nic, pkg/provision), and the few a reader of the tree
// wants to see (modalias, enable). Everything else in the kernel's
// directories (config space, resources, statistics, power) is left out.
var (
	functionAttrs = []string{
		"vendor", "device", "class", "subsystem_vendor", "subsystem_device", "revision",
		"numa_node", "uevent", "modalias", "enable", "local_cpulist",
		"sriov_totalvfs", "sriov_numvfs", "sriov_offset", "sriov_stride", "sriov_vf_device",
		"sriov_drivers_autoprobe", "driver_override",
		"current_link_speed", "current_link_width", "max_link_speed", "max_link_width",
	}
	functionLinks = []string{"driver", "iommu_group", "physfn", "subsystem"} // and virtfnN
	netdevAttrs   = []string{"address", "operstate", "carrier", "ifindex", "iflink", "mtu", "type", "dev_id", "dev_port", "phys_port_name", "phys_switch_id", "speed"}
)

// capturer writes a tar of sysfs paths as the kernel shows them: links
// as links (relative, as the kernel made them), attributes as files.
type capturer struct {
	tw   *tar.Writer
	seen map[string]bool
	now  time.Time
}

func (c *capturer) dir(p string) error {
	p = filepath.Clean(p)
	if p == "/" || c.seen[p] {
		return nil
	}
	if err := c.dir(filepath.Dir(p)); err != nil {
		return err
	}
	c.seen[p] = true
	return c.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(p, "/") + "/", Mode: 0o755, ModTime: c.now})
}

func (c *capturer) link(p string) error {
	if c.seen[p] {
		return nil
	}
	t, err := os.Readlink(p)
	if err != nil {
		return err
	}
	if err := c.dir(filepath.Dir(p)); err != nil {
		return err
	}
	c.seen[p] = true
	return c.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: strings.TrimPrefix(p, "/"), Linkname: t, Mode: 0o777, ModTime: c.now})
}

// file captures an attribute; one the kernel will not read (EOPNOTSUPP,
// EINVAL: phys_port_name of a driver without one, speed of a link that
// is down) is left out, as the kernel leaves a reader without it.
func (c *capturer) file(p string) error {
	if c.seen[p] {
		return nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return nil //nolint:nilerr // a missing or unreadable attribute is not part of what a reader sees
	}
	if err := c.dir(filepath.Dir(p)); err != nil {
		return err
	}
	c.seen[p] = true
	if err := c.tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(p, "/"), Size: int64(len(b)), Mode: 0o644, ModTime: c.now}); err != nil {
		return err
	}
	_, err = c.tw.Write(b)
	return err
}

// function captures a PCI function's directory (resolved), its
// /sys/bus/pci/devices link, its driver's link to it and its IOMMU
// group, and its netdevs with their class/net links.
func (c *capturer) function(addr string) error {
	busLink := filepath.Join(pciDevices, addr)
	real, err := filepath.EvalSymlinks(busLink)
	if err != nil {
		return err
	}
	if err := c.link(busLink); err != nil {
		return err
	}
	for _, a := range functionAttrs {
		if err := c.file(filepath.Join(real, a)); err != nil {
			return err
		}
	}
	ents, _ := os.ReadDir(real)
	for _, e := range ents {
		n := e.Name()
		if e.Type()&fs.ModeSymlink != 0 && (slices.Contains(functionLinks, n) || strings.HasPrefix(n, "virtfn")) {
			if err := c.link(filepath.Join(real, n)); err != nil {
				return err
			}
		}
	}
	if d := driverOf(addr); d != "" {
		if err := c.link(filepath.Join("/sys/bus/pci/drivers", d, addr)); err != nil {
			return err
		}
	}
	if grp := iommuGroup(addr); grp != "" {
		if err := c.link(filepath.Join("/sys/kernel/iommu_groups", grp, "devices", addr)); err != nil {
			return err
		}
	}
	for _, nd := range netdevsOf(addr) {
		nreal := filepath.Join(real, "net", nd)
		for _, a := range netdevAttrs {
			if err := c.file(filepath.Join(nreal, a)); err != nil {
				return err
			}
		}
		if err := c.link(filepath.Join(nreal, "device")); err != nil {
			return err
		}
		if err := c.link(filepath.Join("/sys/class/net", nd)); err != nil {
			return err
		}
	}
	return nil
}

// captureSysfs writes the igb PFs, their VFs and the root ports above
// them, as the kernel shows them now, under sys/ in tw.
func captureSysfs(tw *tar.Writer, pfs []*pf) error {
	c := &capturer{tw: tw, seen: map[string]bool{}, now: time.Now()}
	var fns []string
	for _, p := range pfs {
		real, err := filepath.EvalSymlinks(filepath.Join(pciDevices, p.addr))
		if err != nil {
			return err
		}
		// the bridges above (a PCIe root port each): discovery walks up
		// to the root for the pcieRoot and the upstream bridges
		for d := filepath.Dir(real); strings.HasPrefix(filepath.Base(d), "0000:"); d = filepath.Dir(d) {
			fns = append(fns, filepath.Base(d))
		}
		fns = append(fns, p.addr)
		fns = append(fns, vfsOf(p.addr)...)
	}
	for _, a := range fns {
		if err := c.function(a); err != nil {
			return fmt.Errorf("capture %s: %w", a, err)
		}
	}
	// the modules of the drivers bound, as /sys/module shows them loaded
	for _, m := range []string{"igb", "igbvf", "vfio", "vfio_pci", "vfio_pci_core"} {
		if m == "vfio_pci_core" && !moduleLoaded(m) {
			continue // before 5.15 vfio-pci is one module (5.10 has no vfio_pci_core)
		}
		if err := c.file(filepath.Join("/sys/module", m, "initstate")); err != nil {
			return err
		}
	}
	return nil
}

// moduleLoaded says whether /sys/module has module m.
func moduleLoaded(m string) bool {
	_, err := os.Stat(filepath.Join("/sys/module", m))
	return err == nil
}

// writeOut writes the capture and the guest's logs as one tar to the
// raw disk the host reads after poweroff.
func (g *guest) writeOut() error {
	if g.out == "" {
		return errors.New("no -out disk")
	}
	f, err := os.OpenFile(g.out, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	if err := captureSysfs(tw, g.pfs); err != nil {
		return err
	}
	// the kernel's log (igb's and igbvf's answers, warnings included,
	// which the console's loglevel leaves out)
	if r := run(30*time.Second, nil, "", "/bin/busybox", "dmesg"); r.err == nil {
		_ = os.WriteFile(filepath.Join(g.logs, "dmesg.txt"), []byte(r.stdout), 0o644)
	}
	c := &capturer{tw: tw, seen: map[string]bool{}, now: time.Now()}
	err = filepath.WalkDir(g.logs, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		return c.file(p)
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Sync()
}

func captureChecks() []check {
	return []check{
		{"capture/sysfs", func(g *guest) error {
			if err := g.needs("setup/pfs"); err != nil {
				return err
			}
			// a state worth a fixture, made by the harness itself (not by
			// provisioning): wire A with 3 igbvf VFs, wire B with 2, its
			// second bound to vfio-pci, the node's PF without VFs
			if err := setNumVFs(g.nodePF.addr, 0); err != nil {
				return err
			}
			if err := setNumVFs(g.wireA.addr, 3); err != nil {
				return err
			}
			if err := setNumVFs(g.wireB.addr, 2); err != nil {
				return err
			}
			if err := bindVFIO(vfsOf(g.wireB.addr)[1]); err != nil {
				return err
			}
			if err := g.writeOut(); err != nil {
				return err
			}
			logf("capture and logs written to %s", g.out)
			return nil
		}},
	}
}

// bindVFIO rebinds a function to vfio-pci the way the kernel documents
// (driver_override, unbind, drivers_probe).
func bindVFIO(addr string) error {
	base := filepath.Join(pciDevices, addr)
	if err := writeAttr(filepath.Join(base, "driver_override"), "vfio-pci"); err != nil {
		return err
	}
	if d := driverOf(addr); d != "" && d != "vfio-pci" {
		if err := writeAttr(filepath.Join(base, "driver", "unbind"), addr); err != nil {
			return err
		}
	}
	if driverOf(addr) == "" {
		if err := writeAttr("/sys/bus/pci/drivers_probe", addr); err != nil {
			return err
		}
	}
	if d := driverOf(addr); d != "vfio-pci" {
		return fmt.Errorf("%s bound to %q after drivers_probe with driver_override vfio-pci", addr, d)
	}
	return nil
}
