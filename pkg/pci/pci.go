// Package pci enumerates PCI functions from sysfs under an injected root:
// IDs, class, driver, NUMA node, SR-IOV relations, netdevs and the chain of
// upstream bridges. It reads; it never writes to sysfs.
package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// VendorMellanox is the PCI vendor ID of Mellanox/NVIDIA networking.
const VendorMellanox = "15b3"

// Function is one PCI function as sysfs shows it.
type Function struct {
	Address string // "0000:18:00.1"
	Vendor  string // "15b3"
	Device  string // "101e"
	Class   string // "0x020700"
	Driver  string // "" when unbound
	// NUMANode is -1 when the kernel does not know; VFs whose own file says
	// -1 inherit their PF's.
	NUMANode int
	// PhysFn is the PF's address for a VF, "" otherwise; VFIndex is the N of
	// the PF's virtfnN link for a VF, -1 otherwise.
	PhysFn  string
	VFIndex int
	// TotalVFs/NumVFs are sriov_totalvfs/sriov_numvfs; VFs lists the enabled
	// VFs' addresses in index order (PF only).
	TotalVFs int
	NumVFs   int
	VFs      []string
	// Netdevs are the function's own network interfaces, sorted; switchdev
	// representors (phys_port_name pfNvfM / pfNsfM) are in Representors.
	Netdevs      []string
	Representors []string
	IOMMUGroup   string
	// Bridges are the upstream PCI bridges, nearest first; RootComplex is the
	// "pciDDDD:BB" host bridge directory.
	Bridges     []string
	RootComplex string
	// SysfsPath is the resolved directory of the function under the root.
	SysfsPath string

	numaRead bool
}

// IsVF reports whether f is an SR-IOV virtual function.
func (f *Function) IsVF() bool { return f.PhysFn != "" }

// IsNIC reports whether f is a Mellanox/NVIDIA network function: vendor
// 15b3 and class Ethernet (0x0200xx) or InfiniBand (0x0207xx). ConnectX and
// BlueField PCIe bridges and management functions share the vendor ID and
// are not NICs.
func (f *Function) IsNIC() bool {
	return f.Vendor == VendorMellanox && (strings.HasPrefix(f.Class, "0x0200") || strings.HasPrefix(f.Class, "0x0207"))
}

// ErrNotFound is returned for a PCI address with no function under the root.
var ErrNotFound = errors.New("no such PCI function")

// ValidAddress reports whether s is a full PCI address DDDD:BB:DD.F in
// lower-case hex, the only form sysfs uses. It never touches the filesystem,
// so callers can check untrusted input before building a path from it.
func ValidAddress(s string) bool {
	if len(s) != 12 || s[4] != ':' || s[7] != ':' || s[10] != '.' {
		return false
	}
	for i, c := range s {
		switch i {
		case 4, 7, 10:
			continue
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	dev, _ := strconv.ParseUint(s[8:10], 16, 8)
	return dev <= 0x1f && s[11] <= '7'
}

// Scanner reads PCI functions under a root.
type Scanner struct {
	root string
	sys  string
	// workers bounds the parallel reads of a scan.
	workers int
}

// Option configures a Scanner.
type Option func(*Scanner)

// WithWorkers sets how many functions are read in parallel (default two
// per CPU).
func WithWorkers(n int) Option { return func(s *Scanner) { s.workers = n } }

// New returns a Scanner reading <root>/sys. root "" means "/".
func New(root string, opts ...Option) *Scanner {
	if root == "" {
		root = "/"
	}
	// sysfs reads block in the kernel often enough that two workers per
	// CPU keep the CPUs busy.
	s := &Scanner{root: root, sys: filepath.Join(root, "sys"), workers: 2 * runtime.GOMAXPROCS(0)}
	for _, o := range opts {
		o(s)
	}
	if s.workers < 1 {
		s.workers = 1
	}
	return s
}

// Root is the host root the scanner reads under.
func (s *Scanner) Root() string { return s.root }

func (s *Scanner) devicesDir() string { return filepath.Join(s.sys, "bus", "pci", "devices") }

// Scan returns every function whose vendor keep accepts (nil keeps all),
// sorted by address. PF↔VF relations come from one pass over the PFs'
// virtfnN links; VFs with an unknown NUMA node take their PF's.
func (s *Scanner) Scan(keep func(vendor string) bool) ([]Function, error) {
	return s.ScanEach(keep, nil)
}

// Visitor is called for each kept function while its sysfs directory is
// open, from parallel workers: it may read more below dir but must not
// keep it.
type Visitor func(f *Function, dir sysfs.Dir) error

// ScanEach is Scan calling visit (when not nil) for each kept function.
func (s *Scanner) ScanEach(keep func(vendor string) bool, visit Visitor) ([]Function, error) {
	bus, err := sysfs.Open(s.devicesDir())
	if err != nil {
		return nil, fmt.Errorf("list pci devices: %w", err)
	}
	defer bus.Close()
	entries, err := bus.List(".")
	if err != nil {
		return nil, fmt.Errorf("list pci devices: %w", err)
	}
	addrs := make([]string, 0, len(entries))
	for _, e := range entries {
		if ValidAddress(e) {
			addrs = append(addrs, e)
		}
	}
	netdevs, err := ReadClassLinks(s.sys, "net", "net", s.workers)
	if err != nil {
		return nil, err
	}
	fns := make([]*Function, len(addrs))
	errs := make([]error, len(addrs))
	var wg sync.WaitGroup
	next := make(chan int)
	for w := 0; w < s.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				fns[i], errs[i] = s.read(bus, addrs[i], keep, visit, netdevs)
			}
		}()
	}
	for i := range addrs {
		next <- i
	}
	close(next)
	wg.Wait()

	out := make([]Function, 0, len(addrs))
	index := make(map[string]int, len(addrs))
	for i, f := range fns {
		if errs[i] != nil {
			// A function that vanished mid-scan (hot unplug, VFs being
			// disabled) is not an error of the scan.
			if errors.Is(errs[i], fs.ErrNotExist) {
				continue
			}
			return nil, errs[i]
		}
		if f == nil {
			continue
		}
		index[f.Address] = len(out)
		out = append(out, *f)
	}
	for i := range out {
		pf := &out[i]
		for idx, vf := range pf.VFs {
			j, ok := index[vf]
			if !ok {
				continue
			}
			out[j].PhysFn = pf.Address
			out[j].VFIndex = idx
			if out[j].NUMANode < 0 {
				out[j].NUMANode = pf.NUMANode
			}
		}
	}
	for i := range out {
		f := &out[i]
		if f.numaRead || f.NUMANode >= 0 {
			continue
		}
		// Not a VF of a PF we saw, or its PF does not know: ask the
		// function itself.
		if n, err := readInt(bus, f.Address+"/numa_node"); err == nil && n >= 0 {
			f.NUMANode = n
		}
	}
	return out, nil
}

// Function reads one function by address, with its PF relation and VF
// index resolved from its physfn link and the PF's virtfnN links.
func (s *Scanner) Function(addr string) (Function, error) {
	if !ValidAddress(addr) {
		return Function{}, fmt.Errorf("pci %q: not a PCI address (want DDDD:BB:DD.F)", addr)
	}
	bus, err := sysfs.Open(s.devicesDir())
	if err != nil {
		return Function{}, fmt.Errorf("pci %s: %w", addr, err)
	}
	defer bus.Close()
	f, err := s.read(bus, addr, nil, nil, nil)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Function{}, fmt.Errorf("pci %s: %w", addr, ErrNotFound)
		}
		return Function{}, err
	}
	pfLink, err := bus.Readlink(addr + "/physfn")
	if err != nil {
		return *f, nil // not a VF
	}
	pfAddr := filepath.Base(pfLink)
	if !ValidAddress(pfAddr) {
		return Function{}, fmt.Errorf("pci %s: physfn -> %q is not a PCI function", addr, pfLink)
	}
	pf, err := s.read(bus, pfAddr, nil, nil, nil)
	if err != nil {
		return Function{}, fmt.Errorf("pci %s: read its PF %s: %w", addr, pfAddr, err)
	}
	f.PhysFn = pfAddr
	for i, vf := range pf.VFs {
		if vf == addr {
			f.VFIndex = i
		}
	}
	if f.NUMANode < 0 {
		f.NUMANode = pf.NUMANode
	}
	return *f, nil
}

// read reads one function; it returns nil, nil when keep rejects its vendor.
//
// A scan (netdevs from ReadClassLinks, not nil) skips what it can infer
// later or rarely needs: the NUMA node of a function without SR-IOV
// capability (a VF takes its PF's; Scan reads the rest afterwards) and the
// IOMMU group of a function not bound to vfio-pci; and it takes the
// function's netdevs from the class links instead of listing net/. A
// single read (netdevs nil) reads everything from the function itself.
func (s *Scanner) read(bus sysfs.Dir, addr string, keep func(string) bool, visit Visitor, netdevs ClassLinks) (*Function, error) {
	full := netdevs == nil
	target, err := bus.Readlink(addr)
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", addr, err)
	}
	path := filepath.Join(bus.Path, target)
	if !strings.HasPrefix(path, filepath.Join(s.sys, "devices")+string(filepath.Separator)) {
		return nil, fmt.Errorf("pci %s: %s points outside %s/devices", addr, target, s.sys)
	}
	dir, err := bus.Sub(addr)
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", addr, err)
	}
	defer dir.Close()
	f := &Function{Address: addr, VFIndex: -1, NUMANode: -1, SysfsPath: path}
	// uevent carries vendor, device, class and driver in one read; a tree
	// without it (or with a partial one) is read attribute by attribute.
	if !f.fromUevent(dir) {
		if f.Vendor, err = readHex(dir, "vendor"); err != nil {
			return nil, fmt.Errorf("pci %s: read vendor: %w", addr, err)
		}
		if keep != nil && !keep(f.Vendor) {
			return nil, nil
		}
		if f.Device, err = readHex(dir, "device"); err != nil {
			return nil, fmt.Errorf("pci %s: read device: %w", addr, err)
		}
		if f.Class, err = readClass(dir); err != nil {
			return nil, fmt.Errorf("pci %s: read class: %w", addr, err)
		}
		if drv, err := dir.Readlink("driver"); err == nil {
			f.Driver = filepath.Base(drv)
		}
	}
	if keep != nil && !keep(f.Vendor) {
		return nil, nil
	}
	if f.Driver == "vfio-pci" || full {
		if g, err := dir.Readlink("iommu_group"); err == nil {
			f.IOMMUGroup = filepath.Base(g)
		}
	}
	f.Bridges, f.RootComplex = upstream(s.sys, path)
	total, err := readInt(dir, "sriov_totalvfs")
	if err == nil || full {
		// A PF, or a function that cannot be a VF of a kept PF: its own
		// numa_node. A VF's is taken from its PF once relations are
		// known (the kernel gives VFs their PF's node), see Scan.
		if n, err := readInt(dir, "numa_node"); err == nil && n >= 0 {
			f.NUMANode = n
		}
		f.numaRead = true
	}
	if err == nil {
		f.TotalVFs = total
		f.NumVFs, _ = readInt(dir, "sriov_numvfs")
		for i := 0; i < f.NumVFs; i++ {
			vf, err := dir.Readlink("virtfn" + strconv.Itoa(i))
			if err != nil {
				break // VFs being disabled right now; take what is there
			}
			f.VFs = append(f.VFs, filepath.Base(vf))
		}
	}
	var names []string
	if full {
		if names, err = dir.List("net"); err != nil {
			return nil, fmt.Errorf("pci %s: list netdevs: %w", addr, err)
		}
	} else {
		names = netdevs[addr]
	}
	readNetdevs(f, dir, names)
	if visit != nil {
		if err := visit(f, dir); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// readNetdevs sorts names (f's netdevs) into Netdevs and Representors.
func readNetdevs(f *Function, dir sysfs.Dir, names []string) {
	for _, name := range names {
		// Only an SR-IOV PF or a function with several netdevs can carry
		// switchdev representors; the others skip reading phys_port_name.
		if f.TotalVFs > 0 || len(names) > 1 {
			if ppn, err := dir.Read("net/" + name + "/phys_port_name"); err == nil && IsRepresentor(string(ppn)) {
				f.Representors = append(f.Representors, name)
				continue
			}
		}
		f.Netdevs = append(f.Netdevs, name)
	}
}

// representorRE matches the phys_port_name of a switchdev representor of
// a VF or SF ("pf0vf3", "c1pf0vf3", "pf1sf7"); uplinks are "p0".
var representorRE = regexp.MustCompile(`^(c[0-9]+)?pf[0-9]+(vf|sf)[0-9]+$`)

// IsRepresentor reports whether a phys_port_name names a switchdev
// representor rather than an uplink or a plain netdev.
func IsRepresentor(physPortName string) bool { return representorRE.MatchString(physPortName) }

// upstream splits a resolved device path into its bridges (nearest first)
// and the host bridge directory.
func upstream(sys, dir string) ([]string, string) {
	rel, err := filepath.Rel(filepath.Join(sys, "devices"), dir)
	if err != nil || strings.HasPrefix(rel, "..") {
		return nil, ""
	}
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if len(parts) < 2 {
		return nil, ""
	}
	var bridges []string
	for i := len(parts) - 2; i >= 1; i-- {
		if ValidAddress(parts[i]) {
			bridges = append(bridges, parts[i])
		}
	}
	return bridges, parts[0]
}
