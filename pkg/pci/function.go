package pci

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// Function reads one function by address. A VF's NUMA node, when its own
// file does not know it, is its PF's.
func (s *Scanner) Function(addr string) (Function, error) {
	if !ValidAddress(addr) {
		return Function{}, fmt.Errorf("pci %q: not a PCI address (want DDDD:BB:DD.F)", addr)
	}
	bus, err := sysfs.Open(s.devicesDir())
	if err != nil {
		return Function{}, fmt.Errorf("pci %s: %w", addr, err)
	}
	defer bus.Close()
	f, err := s.read(bus, addr)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Function{}, fmt.Errorf("pci %s: %w", addr, ErrNotFound)
		}
		return Function{}, err
	}
	if f.IsVF() && f.NUMANode < 0 {
		if n, err := readInt(bus, f.PhysFn+"/numa_node"); err == nil && n >= 0 {
			f.NUMANode = n
		}
	}
	return *f, nil
}

// read reads everything about the one function at addr.
func (s *Scanner) read(bus sysfs.Dir, addr string) (*Function, error) {
	f := &Function{}
	if err := s.resolve(bus, f, addr); err != nil {
		return nil, err
	}
	f.Bridges, f.PCIeRoot = upstream(s.sys, filepath.Dir(f.SysfsPath))
	dir, err := bus.Sub(addr)
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", addr, err)
	}
	defer dir.Close()
	if _, err := f.readIDs(dir, nil, nil); err != nil {
		return nil, err
	}
	if err := f.readPhysFn(dir, nil); err != nil {
		return nil, err
	}
	f.readIOMMUGroup(dir)
	f.readNUMA(dir)
	names, err := dir.List("net")
	if err != nil {
		return nil, fmt.Errorf("pci %s: list netdevs: %w", addr, err)
	}
	readNetdevs(f, dir, names)
	return f, nil
}

// interned makes the strings of a read: a scan worker's keeps each one it
// has made (IDs and drivers repeat on every VF); nil makes them anew.
type interned map[string]string

// of returns b as a string.
func (m interned) of(b []byte) string {
	if s, ok := m[string(b)]; ok {
		return s
	}
	s := string(b)
	if m != nil {
		m[s] = s
	}
	return s
}

// readIDs reads vendor, device, class and driver: from uevent, the
// kernel's one-read summary, or attribute by attribute from a tree without
// it. It reports false when keep rejects the function by them. str makes
// the strings (a scan worker interns them).
func (f *Function) readIDs(dir sysfs.Dir, keep func(*Function) bool, str interned) (bool, error) {
	if f.fromUevent(dir, str) {
		return keep == nil || keep(f), nil
	}
	var err error
	if f.Vendor, err = readHex(dir, "vendor"); err != nil {
		return false, fmt.Errorf("pci %s: read vendor: %w", f.Address, err)
	}
	if f.Device, err = readHex(dir, "device"); err != nil {
		return false, fmt.Errorf("pci %s: read device: %w", f.Address, err)
	}
	if f.Class, err = readClass(dir); err != nil {
		return false, fmt.Errorf("pci %s: read class: %w", f.Address, err)
	}
	if drv, err := dir.Readlink("driver"); err == nil {
		f.Driver = filepath.Base(drv)
	}
	return keep == nil || keep(f), nil
}

// readPhysFn reads the physfn link a VF has to its PF ("../0000:18:00.0").
func (f *Function) readPhysFn(dir sysfs.Dir, str interned) error {
	var buf [512]byte
	n, err := dir.ReadlinkTo("physfn", buf[:])
	if err != nil {
		return nil // not a VF
	}
	pf := buf[:n]
	base := pf[bytes.LastIndexByte(pf, '/')+1:]
	if len(base) != 12 || !ValidAddress(string(base)) {
		return fmt.Errorf("pci %s: physfn -> %q is not a PCI function", f.Address, string(pf))
	}
	f.PhysFn = str.of(base)
	return nil
}

// readIOMMUGroup reads the iommu_group link: the kernel names groups by
// number (…/kernel/iommu_groups/71), and a /dev/vfio path is built from
// it, so anything else is no group.
func (f *Function) readIOMMUGroup(dir sysfs.Dir) {
	g, err := dir.Readlink("iommu_group")
	if err != nil {
		return
	}
	g = filepath.Base(g)
	if g == "" || strings.Trim(g, "0123456789") != "" {
		return
	}
	f.IOMMUGroup = g
}

// readNUMA reads the function's own NUMA node.
func (f *Function) readNUMA(dir sysfs.Dir) {
	if n, err := readInt(dir, "numa_node"); err == nil && n >= 0 {
		f.NUMANode = n
	}
	f.numaRead = true
}

// readNetdevs sorts names (f's netdevs) into Netdevs and Representors.
func readNetdevs(f *Function, dir sysfs.Dir, names []string) {
	if f.IsVF() && len(names) == 1 {
		f.Netdevs = slices.Clip(names) // nothing to sort out, nothing to copy
		return
	}
	for _, name := range names {
		// Only a PF (switchdev representors of its VFs and SFs) or a
		// function with several netdevs can carry representors; a VF
		// with one netdev skips reading phys_port_name.
		if !f.IsVF() || len(names) > 1 {
			if ppn, err := dir.Read("net/" + name + "/phys_port_name"); err == nil && IsRepresentor(string(ppn)) {
				f.Representors = append(f.Representors, name)
				continue
			}
		}
		f.Netdevs = append(f.Netdevs, name)
	}
}
