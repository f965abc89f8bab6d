package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const pciDevices = "/sys/bus/pci/devices"

// pf is one igb PF as the guest's kernel showed it at start.
type pf struct {
	addr   string // 0000:01:00.0
	netdev string // the kernel's name at start (eth0, …)
	mac    string // QEMU's -device igb,mac= (what tells the PFs apart)
}

func (p *pf) String() string { return p.addr + " (" + p.netdev + ")" }

// QEMU's MACs for the three PFs (run.sh): two on the hub, the node's own.
const (
	macWireA = "52:54:00:e2:00:01"
	macWireB = "52:54:00:e2:00:02"
	macNode  = "52:54:00:e2:00:03"
)

func readAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

func writeAttr(path, v string) error {
	if err := os.WriteFile(path, []byte(v), 0o200); err != nil {
		return fmt.Errorf("write %q to %s: %w", v, path, err)
	}
	return nil
}

func devAttr(addr, name string) string {
	v, _ := readAttr(filepath.Join(pciDevices, addr, name))
	return v
}

// driverOf is the function's bound driver, "" when none.
func driverOf(addr string) string {
	l, err := os.Readlink(filepath.Join(pciDevices, addr, "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}

// netdevsOf lists the function's netdevs in this netns.
func netdevsOf(addr string) []string {
	ents, _ := os.ReadDir(filepath.Join(pciDevices, addr, "net"))
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	return out
}

// vfsOf lists a PF's VFs by index (virtfnN).
func vfsOf(pfAddr string) []string {
	n, _ := strconv.Atoi(devAttr(pfAddr, "sriov_numvfs"))
	out := make([]string, 0, n)
	for i := 0; i < n; i++ {
		l, err := os.Readlink(filepath.Join(pciDevices, pfAddr, fmt.Sprintf("virtfn%d", i)))
		if err != nil {
			break
		}
		out = append(out, filepath.Base(l))
	}
	return out
}

// iommuGroup is the function's IOMMU group number, "" when none.
func iommuGroup(addr string) string {
	l, err := os.Readlink(filepath.Join(pciDevices, addr, "iommu_group"))
	if err != nil {
		return ""
	}
	return filepath.Base(l)
}

// modprobe loads modules with busybox's modprobe (modules.dep made by
// depmod over the initramfs's decompressed modules).
//
// A module the kernel has built in is not probed (the initramfs has no
// file for it; run.sh lists it in /etc/e2e-modules-builtin); one the
// kernel lacks (/etc/e2e-modules-absent) is a skipError naming it.
func modprobe(mods ...string) error {
	for _, m := range mods {
		switch {
		case kernelModuleListed("/etc/e2e-modules-builtin", m):
			continue
		case kernelModuleListed("/etc/e2e-modules-absent", m):
			return skipf("kernel %s has no module %s", kernelRelease(), m)
		}
		if r := run(60*time.Second, nil, "", "/sbin/modprobe", m); r.err != nil {
			return fmt.Errorf("modprobe %s: %s", m, r)
		}
	}
	return nil
}

// kernelModuleListed says whether module m is a line of file (run.sh's
// lists; - and _ are one).
func kernelModuleListed(file, m string) bool {
	b, _ := os.ReadFile(file)
	norm := func(s string) string { return strings.ReplaceAll(s, "-", "_") }
	for _, l := range strings.Fields(string(b)) {
		if norm(l) == norm(m) {
			return true
		}
	}
	return false
}

// kernelRelease is uname -r.
func kernelRelease() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return "?"
	}
	return unix.ByteSliceToString(u.Release[:])
}

// findPFs finds the igb PFs by QEMU's MACs.
func (g *guest) findPFs() error {
	ents, err := os.ReadDir(pciDevices)
	if err != nil {
		return err
	}
	for _, e := range ents {
		a := e.Name()
		if devAttr(a, "vendor") != "0x8086" || devAttr(a, "device") != "0x10c9" {
			continue
		}
		nds := netdevsOf(a)
		if len(nds) != 1 {
			return fmt.Errorf("igb PF %s has netdevs %v (want one; is igb loaded?)", a, nds)
		}
		mac, _ := readAttr(filepath.Join(pciDevices, a, "net", nds[0], "address"))
		p := &pf{addr: a, netdev: nds[0], mac: mac}
		switch mac {
		case macWireA:
			g.wireA = p
		case macWireB:
			g.wireB = p
		case macNode:
			g.nodePF = p
		default:
			return fmt.Errorf("igb PF %s has MAC %s, none of QEMU's three", a, mac)
		}
	}
	if g.wireA == nil || g.wireB == nil || g.nodePF == nil {
		return errors.New("not all three igb PFs are there (wire A, wire B, node)")
	}
	g.pfs = []*pf{g.wireA, g.wireB, g.nodePF}
	return nil
}

// setNumVFs is the harness's own way to give a PF n VFs bound by the
// kernel (sriov_drivers_autoprobe 1), for the checks that must not
// depend on provisioning: through 0, as the PCI core wants.
func setNumVFs(pfAddr string, n int) error {
	base := filepath.Join(pciDevices, pfAddr)
	cur, _ := strconv.Atoi(devAttr(pfAddr, "sriov_numvfs"))
	if cur == n && devAttr(pfAddr, "sriov_drivers_autoprobe") == "1" {
		return nil
	}
	if err := writeAttr(filepath.Join(base, "sriov_drivers_autoprobe"), "1"); err != nil {
		return err
	}
	if cur != 0 {
		if err := writeAttr(filepath.Join(base, "sriov_numvfs"), "0"); err != nil {
			return err
		}
	}
	if n == 0 {
		return nil
	}
	if err := writeAttr(filepath.Join(base, "sriov_numvfs"), strconv.Itoa(n)); err != nil {
		return err
	}
	return waitFor(30*time.Second, func() error {
		vfs := vfsOf(pfAddr)
		if len(vfs) != n {
			return fmt.Errorf("%s: %d VFs", pfAddr, len(vfs))
		}
		for _, v := range vfs {
			if d := driverOf(v); d != "igbvf" {
				return fmt.Errorf("VF %s bound to %q", v, d)
			}
			if len(netdevsOf(v)) != 1 {
				return fmt.Errorf("VF %s: no netdev yet", v)
			}
		}
		return nil
	})
}

// vfSettings is a VF's settings on its PF (ip link show PF: vf N …).
func vfSettings(pfNetdev string, idx int) (netlink.VfInfo, error) {
	l, err := netlink.LinkByName(pfNetdev)
	if err != nil {
		return netlink.VfInfo{}, fmt.Errorf("PF %s: %w", pfNetdev, err)
	}
	for _, v := range l.Attrs().Vfs {
		if v.ID == idx {
			return v, nil
		}
	}
	return netlink.VfInfo{}, fmt.Errorf("PF %s has no vf %d", pfNetdev, idx)
}

// vfIndex is a VF's index on its PF.
func vfIndex(pfAddr, vf string) int {
	return slices.Index(vfsOf(pfAddr), vf)
}

func setupChecks() []check {
	return []check{
		{"setup/modules", func(g *guest) error {
			// what udev would load on a node: the PF and VF drivers, vfio-pci
			// for the vfio VFs, virtio_blk for the capture disk
			// (virtio_pci: a module on 5.10, built in from 6.1 on)
			return modprobe("virtio_pci", "virtio_blk", "igb", "igbvf", "vfio-pci")
		}},
		{"setup/pfs", func(g *guest) error {
			if err := waitFor(20*time.Second, g.findPFs); err != nil {
				return err
			}
			for _, p := range g.pfs {
				if t := devAttr(p.addr, "sriov_totalvfs"); t != "7" {
					return fmt.Errorf("%s: sriov_totalvfs %q, want 7 (igb on PCIe)", p, t)
				}
				if iommuGroup(p.addr) == "" {
					return fmt.Errorf("%s: no iommu_group (intel_iommu=on?)", p)
				}
				if err := ipCmd("link", "set", p.netdev, "up"); err != nil {
					return err
				}
			}
			logf("wire A %s, wire B %s, node %s", g.wireA, g.wireB, g.nodePF)
			return nil
		}},
		{"setup/daemonset-caps", daemonSetCapsCheck},
		{"setup/node-default-route", func(g *guest) error {
			// QEMU's user net answers router solicitations: an IPv6 default
			// route through the node PF, as a node's own network has
			return waitFor(40*time.Second, func() error {
				rs, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{}, 0)
				if err != nil {
					return err
				}
				for _, r := range rs {
					if r.Dst == nil || r.Dst.IP.IsUnspecified() {
						l, err := netlink.LinkByIndex(r.LinkIndex)
						if err == nil && l.Attrs().Name == g.nodePF.netdev {
							return nil
						}
					}
				}
				return fmt.Errorf("no IPv6 default route through %s", g.nodePF.netdev)
			})
		}},
	}
}
