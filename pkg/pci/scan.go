package pci

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// Scan returns every function whose vendor keep accepts (nil keeps all),
// sorted by address. VFs take their PF's NUMA node.
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
	for i := range out {
		f := &out[i]
		if f.numaRead {
			continue
		}
		// A VF: the kernel puts it on its PF's bus, and so on its PF's
		// node.
		if j, ok := index[f.PhysFn]; ok && out[j].NUMANode >= 0 {
			f.NUMANode = out[j].NUMANode
			continue
		}
		// Its PF is not in the scan (gone mid-scan) or does not know:
		// ask the function itself.
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
	f := &Function{Address: addr, NUMANode: -1, SysfsPath: path}
	f.Bridges, f.PCIeRoot = upstream(s.sys, path)
	return f, nil
}

// scanOne reads one function for a node scan; nil, nil when keep rejects
// its vendor. It resolves and checks the bus link, then reads uevent from
// the function's parent directory, so a function of another vendor costs
// a readlink and one file. A VF (it has a physfn link) reads nothing more
// of its own: ScanEach gives it its PF's NUMA node. Netdevs come from the
// class links; the IOMMU group is read only for vfio-pci.
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
	if err := f.readPhysFn(at); err != nil {
		return nil, err
	}
	if !f.IsVF() {
		// Not a VF: read on through its own directory, which pays for
		// itself over the several attributes read below it (here and
		// by visit: a PF's SR-IOV attributes).
		dir, err := bus.Sub(addr)
		if err != nil {
			return nil, fmt.Errorf("pci %s: %w", addr, err)
		}
		defer dir.Close()
		at = dir
		f.readNUMA(dir)
	}
	if f.Driver == DriverVFIO {
		f.readIOMMUGroup(at)
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
