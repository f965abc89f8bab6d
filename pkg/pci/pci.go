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

// DriverVFIO is the driver of a function handed to user space whole (DPDK,
// VMs): it has no netdev and no RDMA device, only an IOMMU group.
const DriverVFIO = "vfio-pci"

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

// Dir reads below one function's sysfs directory while a scan has it
// open, by relative name ("infiniband/mlx5_0/ports/1/link_layer").
// Attributes come back trimmed; a missing one is an error that
// errors.Is(err, fs.ErrNotExist); List of a missing directory is empty.
type Dir interface {
	Read(name string) ([]byte, error)
	// ReadTo reads into buf, which a caller keeps on its stack.
	ReadTo(name string, buf []byte) ([]byte, error)
	Readlink(name string) (string, error)
	List(name string) ([]string, error)
}

var _ Dir = sysfs.Dir{}

// Visitor is called for each kept function while its sysfs directory is
// open, from parallel workers: it may read more below dir but must not
// keep it.
type Visitor func(f *Function, dir Dir) error

// ScanEach is Scan calling visit (when not nil) for each kept function.
//
// A node scan is the hot path of discovery (thousands of VFs, every
// periodic update), so it reads each function with as few system calls as
// the kernel's layout allows; see scanOne.
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
	// Workers take contiguous chunks: VFs of one PF sit next to each
	// other below the same parent directory, which each worker opens
	// once (see scanOne).
	chunk := (len(addrs) + s.workers - 1) / s.workers
	for lo := 0; lo < len(addrs); lo += chunk {
		hi := min(lo+chunk, len(addrs))
		wg.Add(1)
		go func() {
			defer wg.Done()
			parents := parentDirs{}
			defer parents.close()
			for i := lo; i < hi; i++ {
				fns[i], errs[i] = s.scanOne(bus, parents, addrs[i], keep, visit, netdevs)
			}
		}()
	}
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
	// PF↔VF relations in one pass over the PFs' virtfnN links, which
	// give each VF its index.
	for i := range out {
		pf := &out[i]
		for idx, vf := range pf.VFs {
			if j, ok := index[vf]; ok && out[j].PhysFn == pf.Address {
				out[j].VFIndex = idx
				if out[j].NUMANode < 0 {
					out[j].NUMANode = pf.NUMANode
				}
			}
		}
	}
	for i := range out {
		f := &out[i]
		if f.numaRead || f.NUMANode >= 0 {
			continue
		}
		// A VF whose PF does not know or does not list it (being
		// disabled right now): ask the function itself.
		if n, err := readInt(bus, f.Address+"/numa_node"); err == nil && n >= 0 {
			f.NUMANode = n
		}
	}
	return out, nil
}

// resolve starts a Function for addr from its bus link, resolved and
// checked before anything is read through it: a link out of the root is
// refused, not followed. It records the function's directory and the
// bridges above it.
func (s *Scanner) resolve(bus sysfs.Dir, addr string) (*Function, error) {
	target, err := bus.Readlink(addr)
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", addr, err)
	}
	path := filepath.Join(bus.Path(), target)
	if !strings.HasPrefix(path, filepath.Join(s.sys, "devices")+string(filepath.Separator)) || filepath.Base(path) != addr {
		return nil, fmt.Errorf("pci %s: link points outside %s/devices, to %s", addr, s.sys, path)
	}
	f := &Function{Address: addr, VFIndex: -1, NUMANode: -1, SysfsPath: path}
	f.Bridges, f.RootComplex = upstream(s.sys, path)
	return f, nil
}

// scanOne reads one function for a node scan; nil, nil when keep rejects
// its vendor. It resolves and checks the bus link, then reads uevent from
// the function's parent directory, so a function of another vendor costs
// a readlink and one file. A VF (it has a physfn link) reads nothing more
// of its own: it has no SR-IOV capability, and ScanEach takes its index
// and NUMA node from its PF's virtfnN links. Netdevs come from the class
// links; the IOMMU group is read only for vfio-pci.
func (s *Scanner) scanOne(bus sysfs.Dir, parents parentDirs, addr string, keep func(string) bool, visit Visitor, netdevs ClassLinks) (*Function, error) {
	f, err := s.resolve(bus, addr)
	if err != nil {
		return nil, err
	}
	// Names below the function are resolved from its parent directory:
	// two path components per read instead of following the bus link
	// (seven components on a typical host) every time.
	parent, err := parents.open(filepath.Dir(f.SysfsPath))
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", addr, err)
	}
	at := parent.At(addr)
	if ok, err := f.readIDs(at, keep); !ok || err != nil {
		return nil, err
	}
	if pf, err := at.Readlink("physfn"); err == nil {
		f.PhysFn = filepath.Base(pf)
		if !ValidAddress(f.PhysFn) {
			return nil, fmt.Errorf("pci %s: physfn -> %q is not a PCI function", addr, pf)
		}
	} else {
		// Not a VF: read on through its own directory, which pays for
		// itself over the several attributes read below it.
		dir, err := bus.Sub(addr)
		if err != nil {
			return nil, fmt.Errorf("pci %s: %w", addr, err)
		}
		defer dir.Close()
		at = dir
		f.readSRIOV(dir)
	}
	if f.Driver == DriverVFIO {
		if g, err := at.Readlink("iommu_group"); err == nil {
			f.IOMMUGroup = filepath.Base(g)
		}
	}
	readNetdevs(f, at, netdevs[addr])
	if visit != nil {
		if err := visit(f, at); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// parentDirs are the parent directories of functions one scan worker has
// opened, by path.
type parentDirs map[string]sysfs.Dir

func (p parentDirs) open(path string) (sysfs.Dir, error) {
	if d, ok := p[path]; ok {
		return d, nil
	}
	d, err := sysfs.Open(path)
	if err != nil {
		return d, err
	}
	p[path] = d
	return d, nil
}

func (p parentDirs) close() {
	for _, d := range p {
		d.Close()
	}
}

// readIDs reads vendor, device, class and driver: from uevent, the
// kernel's one-read summary, or attribute by attribute from a tree without
// it. It reports false when keep rejects the vendor.
func (f *Function) readIDs(dir sysfs.Dir, keep func(string) bool) (bool, error) {
	if f.fromUevent(dir) {
		return keep == nil || keep(f.Vendor), nil
	}
	var err error
	if f.Vendor, err = readHex(dir, "vendor"); err != nil {
		return false, fmt.Errorf("pci %s: read vendor: %w", f.Address, err)
	}
	if keep != nil && !keep(f.Vendor) {
		return false, nil
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
	return true, nil
}

// readSRIOV reads the NUMA node and, for a PF, its SR-IOV counts and the
// VFs its virtfnN links name.
func (f *Function) readSRIOV(dir sysfs.Dir) {
	if n, err := readInt(dir, "numa_node"); err == nil && n >= 0 {
		f.NUMANode = n
	}
	f.numaRead = true
	total, err := readInt(dir, "sriov_totalvfs")
	if err != nil {
		return
	}
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
	f, err := s.read(bus, addr)
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
	pf, err := s.read(bus, pfAddr)
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

// read reads everything about the one function at addr.
func (s *Scanner) read(bus sysfs.Dir, addr string) (*Function, error) {
	f, err := s.resolve(bus, addr)
	if err != nil {
		return nil, err
	}
	dir, err := bus.Sub(addr)
	if err != nil {
		return nil, fmt.Errorf("pci %s: %w", addr, err)
	}
	defer dir.Close()
	if _, err := f.readIDs(dir, nil); err != nil {
		return nil, err
	}
	if g, err := dir.Readlink("iommu_group"); err == nil {
		f.IOMMUGroup = filepath.Base(g)
	}
	f.readSRIOV(dir)
	names, err := dir.List("net")
	if err != nil {
		return nil, fmt.Errorf("pci %s: list netdevs: %w", addr, err)
	}
	readNetdevs(f, dir, names)
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
