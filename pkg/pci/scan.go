package pci

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// Scan returns every function that keep accepts by its IDs, class and
// driver (nil keeps all), sorted by address. VFs take their PF's NUMA
// node.
func (s *Scanner) Scan(keep func(*Function) bool) ([]Function, error) {
	fns, _, err := ScanInto(s, keep, nil, new(ScanBuffer[struct{}]))
	return fns, err
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
	// ReadlinkTo reads a link's target into buf, which a caller keeps
	// on its stack, and returns its length.
	ReadlinkTo(name string, buf []byte) (int, error)
	List(name string) ([]string, error)
}

var (
	_ Dir = sysfs.Dir{}
	_ Dir = (*sysfs.Dir)(nil)
)

// Visitor is called for each kept function while its sysfs directory is
// open, from parallel workers: it may read more below dir but must not
// keep it. What it returns for f is handed back beside f.
type Visitor[T any] func(f *Function, dir Dir) (T, error)

// ScanBuffer is a node scan's memory, kept for the next scan with it to
// reuse (a node's periodic rescan): the bus listing, the netdev class
// index, the functions and what visit returned for them, and the strings
// of the names and paths that are as they were. The zero ScanBuffer is
// ready to use; one ScanBuffer serves one scan at a time.
type ScanBuffer[T any] struct {
	bus   sysfs.Listing
	addrs []string // the bus's addresses, sorted
	// busAddrs': each entry's key (0: no address), their order, and the
	// memory of ordering them.
	owners  []ownerKey
	order   []int32
	sort    ownerOrder
	netdevs ClassReader
	fns     []Function
	vals    []T
	kept    []bool
	errs    []error
}

// ScanInto is Scan calling visit (when not nil) for each kept function,
// with buf's memory. The second result holds what visit returned for each
// function, at the function's index in the first: a caller joins
// per-function reads by index, without a map or a lock shared by the
// workers. What it returns belongs to buf: valid until buf scans again,
// so a caller copies out what it keeps.
//
// A node scan is the hot path of discovery (thousands of VFs, every
// periodic update), so it reads each function with as few system calls as
// the kernel's layout allows (see scanOne) and allocates little: the
// garbage of a scan costs a 2-CPU node as much as a tenth of its reads.
func ScanInto[T any](s *Scanner, keep func(*Function) bool, visit Visitor[T], buf *ScanBuffer[T]) ([]Function, []T, error) {
	bus, err := sysfs.Open(s.devicesDir())
	if err != nil {
		return nil, nil, fmt.Errorf("list pci devices: %w", err)
	}
	defer bus.Close()
	// The bus listing and the class net links overlap: each is a long
	// run of system calls on one CPU.
	var netdevs ClassLinks
	var netErr error
	listed := make(chan struct{})
	go func() {
		defer close(listed)
		netdevs, netErr = buf.netdevs.read(s.sys, "net", "net", s.workers, nil, true)
	}()
	entries, same, err := buf.bus.Raw(bus, ".")
	<-listed
	if err != nil {
		buf.addrs = buf.addrs[:0]
		return nil, nil, fmt.Errorf("list pci devices: %w", err)
	}
	// An unchanged listing has the addresses of the last.
	addrs := buf.addrs
	if !same || len(addrs) == 0 {
		addrs = buf.busAddrs(entries)
	}
	if netErr != nil {
		return nil, nil, netErr
	}
	fns := resize(buf.fns, len(addrs))
	kept := resize(buf.kept, len(addrs))
	errs := resize(buf.errs, len(addrs))
	vals := resize(buf.vals, len(addrs))
	clear(vals)
	buf.fns, buf.kept, buf.errs, buf.vals = fns, kept, errs, vals
	var v func(i int, f *Function, dir Dir) error
	if visit != nil {
		v = func(i int, f *Function, dir Dir) (err error) {
			vals[i], err = visit(f, dir)
			return err
		}
	}
	var wg sync.WaitGroup
	// Workers take contiguous chunks: VFs of one PF sit next to each
	// other below the same parent directory, which each worker opens
	// once (see scanOne).
	chunk := (len(addrs) + s.workers - 1) / s.workers
	for lo := 0; lo < len(addrs); lo += chunk {
		hi := min(lo+chunk, len(addrs))
		wg.Go(func() {
			w := newWorker(s, bus, keep, v, netdevs)
			defer w.close()
			for i := lo; i < hi; i++ {
				kept[i], errs[i] = w.scanOne(i, &fns[i], addrs[i])
			}
		})
	}
	wg.Wait()

	n := 0 // kept so far: fns[:n], sorted by address
	for i := range fns {
		if errs[i] != nil {
			// A function that vanished mid-scan (hot unplug, VFs being
			// disabled) is not an error of the scan.
			if errors.Is(errs[i], fs.ErrNotExist) {
				continue
			}
			return nil, nil, errs[i]
		}
		if !kept[i] {
			continue
		}
		fns[n], vals[n] = fns[i], vals[i] // in place: n <= i
		n++
	}
	clear(fns[n:])
	clear(vals[n:])
	out, vals := fns[:n], vals[:n]
	pf := -1 // the last VF's PF, where FindNear looks first
	for i := range out {
		f := &out[i]
		if f.numaRead {
			continue
		}
		// A VF: the kernel puts it on its PF's bus, and so on its PF's
		// node.
		pf = FindNear(out, f.PhysFn, pf)
		if pf >= 0 && out[pf].NUMANode >= 0 {
			f.NUMANode = out[pf].NUMANode
			continue
		}
		// Its PF is not in the scan (gone mid-scan) or does not know:
		// ask the function itself.
		if n, err := readInt(bus, f.Address+"/numa_node"); err == nil && n >= 0 {
			f.NUMANode = n
		}
	}
	return out, vals, nil
}

// Find returns the index of the function at addr in fns, sorted by
// address (as Scan returns them), or false.
func Find(fns []Function, addr string) (int, bool) {
	return slices.BinarySearchFunc(fns, addr, func(f Function, addr string) int { return strings.Compare(f.Address, addr) })
}

// FindNear is Find trying fns[near] first, and -1 when addr is not in
// fns: a scan asks for each VF's PF in address order, and a PF's VFs
// mostly follow one another, so near is the last answer.
func FindNear(fns []Function, addr string, near int) int {
	if near >= 0 && near < len(fns) && fns[near].Address == addr {
		return near
	}
	if i, ok := Find(fns, addr); ok {
		return i
	}
	return -1
}

// busLinkPrefix is how every entry of <sys>/bus/pci/devices points into
// <sys>/devices.
const busLinkPrefix = "../../../devices/"

// resolve starts f for addr from its bus link, resolved and checked
// before anything is read through it: a link out of <sys>/devices (or
// not as the kernel makes them: relative, no "." or "..") is refused, not
// followed. It records the function's directory.
func (s *Scanner) resolve(bus sysfs.Dir, f *Function, addr string) error {
	var buf [512]byte
	n, err := bus.ReadlinkTo(addr, buf[:])
	if err != nil {
		return fmt.Errorf("pci %s: %w", addr, err)
	}
	target := buf[:n]
	rest, ok := bytes.CutPrefix(target, []byte(busLinkPrefix))
	if !ok || !cleanRelative(rest) || len(rest) < len(addr)+1 || string(rest[len(rest)-len(addr)-1:]) != "/"+addr {
		return fmt.Errorf("pci %s: link points outside %s/devices, to %s", addr, s.sys, filepath.Join(bus.Path(), string(target)))
	}
	*f = Function{Address: addr, NUMANode: -1, SysfsPath: s.sys + "/devices/" + string(rest)}
	return nil
}

// cleanRelative reports whether p is a relative path with no empty, "."
// or ".." element.
func cleanRelative(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	for len(p) > 0 {
		elem := p
		if i := bytes.IndexByte(p, '/'); i >= 0 {
			elem, p = p[:i], p[i+1:]
			if len(p) == 0 {
				return false // a trailing slash
			}
		} else {
			p = nil
		}
		if len(elem) == 0 || elem[0] == '.' && (len(elem) == 1 || len(elem) == 2 && elem[1] == '.') {
			return false
		}
	}
	return true
}

// worker is one scan goroutine's state: the parent directories it has
// open and what it has worked out about them, and the strings it has
// already made (IDs and drivers repeat on every VF).
type worker struct {
	s    *Scanner
	bus  sysfs.Dir
	keep func(*Function) bool
	// visit is called with f's index in the bus listing.
	visit   func(i int, f *Function, dir Dir) error
	netdevs ClassLinks // with the owners' directories
	parents map[string]*parentDir
	strs    interned
	// at is the directory visit reads through, passed by pointer: one
	// allocation per worker, not one per function.
	at sysfs.Dir
}

// parentDir is an open parent directory of functions, with the bridges
// and PCIe root that every function below it shares.
type parentDir struct {
	dir      sysfs.Dir
	bridges  []string
	pcieRoot string
}

func newWorker(s *Scanner, bus sysfs.Dir, keep func(*Function) bool, visit func(int, *Function, Dir) error, netdevs ClassLinks) *worker {
	return &worker{s: s, bus: bus, keep: keep, visit: visit, netdevs: netdevs,
		parents: map[string]*parentDir{}, strs: interned{}}
}

func (w *worker) close() {
	for _, p := range w.parents {
		p.dir.Close()
	}
}

// parent opens (once) the parent directory at path.
func (w *worker) parent(path string) (*parentDir, error) {
	if p, ok := w.parents[path]; ok {
		return p, nil
	}
	d, err := sysfs.Open(path)
	if err != nil {
		return nil, err
	}
	p := &parentDir{dir: d}
	p.bridges, p.pcieRoot = upstream(w.s.sys, path)
	p.bridges = slices.Clip(p.bridges)
	w.parents[path] = p
	return p, nil
}

// scanOne reads one function for a node scan into f; false when keep
// rejects it. It finds the function's directory, then reads uevent from
// the function's parent directory, so a function that is not kept (a
// bridge, a GPU) costs a readlink and one file. A VF (it has a physfn link) reads
// nothing more of its own: ScanInto gives it its PF's NUMA node. Netdevs
// come from the class links; the IOMMU group is read only for vfio-pci.
//
// The directory of a function with a netdev is where its netdev's class
// link says (checked as a bus link is: inside <sys>/devices, ending in the
// address), which spares the readlink of its bus link; another function's
// comes from its bus link.
func (w *worker) scanOne(i int, f *Function, addr string) (bool, error) {
	netdevs, path := w.netdevs.entries(addr)
	if path != "" {
		*f = Function{Address: addr, NUMANode: -1, SysfsPath: path}
	} else if err := w.s.resolve(w.bus, f, addr); err != nil {
		return false, err
	}
	// Names below the function are resolved from its parent directory:
	// two path components per read instead of following the bus link
	// (seven components on a typical host) every time.
	// SysfsPath is clean, as resolve and the class links made it (no
	// trailing slash, no "." or ".."): its parent is up to its last slash,
	// without filepath.Dir's Clean.
	parent, err := w.parent(f.SysfsPath[:strings.LastIndexByte(f.SysfsPath, '/')])
	if err != nil {
		return false, fmt.Errorf("pci %s: %w", addr, err)
	}
	// Siblings share their bridges: a clipped slice, so that appending
	// to one function's copies it.
	f.Bridges, f.PCIeRoot = parent.bridges, parent.pcieRoot
	at := parent.dir.At(addr)
	if ok, err := f.readIDs(at, w.keep, w.strs); !ok || err != nil {
		return false, err
	}
	if err := f.readPhysFn(at, w.strs); err != nil {
		return false, err
	}
	if !f.IsVF() {
		// Not a VF: read on through its own directory, which pays for
		// itself over the several attributes read below it (here and
		// by visit: a PF's SR-IOV attributes).
		dir, err := w.bus.Sub(addr)
		if err != nil {
			return false, fmt.Errorf("pci %s: %w", addr, err)
		}
		defer dir.Close()
		at = dir
		f.readNUMA(dir)
	}
	if f.Driver == DriverVFIO {
		f.readIOMMUGroup(at)
	}
	readNetdevs(f, at, netdevs)
	if w.visit != nil {
		w.at = at
		if err := w.visit(i, f, &w.at); err != nil {
			return false, err
		}
	}
	return true, nil
}

// busAddrs are the PCI addresses among a bus listing's entries, sorted
// as their keys, which order as the addresses do (ownerOrder): an
// address is twelve bytes that mostly share their first eight, which a
// string sort compares again at every step.
func (buf *ScanBuffer[T]) busAddrs(entries []string) []string {
	owners := resize(buf.owners, len(entries))
	for i, e := range entries {
		owners[i], _ = keyOf(e)
	}
	buf.owners = owners
	buf.order = buf.sort.appendOrder(slices.Grow(buf.order[:0], len(entries)), owners)
	addrs := slices.Grow(buf.addrs[:0], len(buf.order))
	for _, i := range buf.order {
		addrs = append(addrs, entries[i])
	}
	clear(addrs[len(addrs):cap(addrs)])
	buf.addrs = addrs
	return addrs
}
