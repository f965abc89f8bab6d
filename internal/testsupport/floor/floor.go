//go:build linux

// Package floor is not fastpath code but a yardstick for discovery: the
// system calls no faithful scan of a node can do without, per VF, made
// from as many threads as there are CPUs, with nothing parsed or kept.
// Per VF: read its uevent, readlink its physfn and its PF's virtfnN,
// readlink its four class entries (net, infiniband, infiniband_verbs,
// infiniband_mad) and read its port's link_layer. Per host (Listings):
// list the bus's functions and those four class directories, where a scan
// learns the names the per-VF calls use.
//
// BenchmarkDiscover of pkg/nic sets a scan against it, and test/regfloor
// makes it before registering, which is the floor of the device plugin's
// start on a large host. The VFs come from a scan made beforehand, in the
// benchmark's process: a floor pass reads nothing to find them.
package floor

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// VF is what a floor pass needs to know of one VF: where each of its
// entries is.
type VF struct {
	Address, PF  string // PCI addresses
	Index        int    // its virtfnN below its PF
	Netdev, RDMA string // its netdev and RDMA device
	Uverbs, Umad string // its char devices' names ("uverbs5", "umad5")
	Port         int    // the port whose link_layer is read
}

// The directories below <root>/sys that a pass reads from.
const (
	dirBus = iota
	dirNet
	dirIB
	dirVerbs
	dirMad
	numDirs
)

var dirNames = [numDirs]string{"bus/pci/devices", "class/net", "class/infiniband", "class/infiniband_verbs", "class/infiniband_mad"}

// The kinds of Op.
const (
	opReadlink = iota
	opRead     // open, read, close
	opList     // open, getdents to the end, close
)

// Op is one system call of a pass: a readlink, an open, read and close,
// or the listing of a directory.
type Op struct {
	dir  int
	name string
	kind int
}

// Listings are the directories a pass lists: the functions on the bus and
// the four classes' devices. Their names are what a scan learns there and
// Ops takes as known; a pass that lists makes them first.
func Listings() []Op {
	ops := make([]Op, numDirs)
	for i := range ops {
		ops[i] = Op{dir: i, name: ".", kind: opList}
	}
	return ops
}

// Ops are the system calls of a pass over vfs, made in the order given.
func Ops(vfs []VF) []Op {
	ops := make([]Op, 0, 8*len(vfs))
	for _, v := range vfs {
		ops = append(ops,
			Op{dirBus, v.Address + "/uevent", opRead},
			Op{dirBus, v.Address + "/physfn", opReadlink},
			Op{dirBus, v.PF + "/virtfn" + strconv.Itoa(v.Index), opReadlink},
			Op{dirNet, v.Netdev, opReadlink}, Op{dirIB, v.RDMA, opReadlink}, Op{dirVerbs, v.Uverbs, opReadlink}, Op{dirMad, v.Umad, opReadlink},
			Op{dirBus, v.Address + "/infiniband/" + v.RDMA + "/ports/" + strconv.Itoa(v.Port) + "/link_layer", opRead},
		)
	}
	return ops
}

// Pass makes passes under one root: it holds the directories open.
type Pass struct {
	dirs [numDirs]int
}

// Open opens the directories of <root>/sys that a pass reads from.
func Open(root string) (*Pass, error) {
	p := &Pass{}
	for i := range p.dirs {
		p.dirs[i] = -1
	}
	for i, n := range dirNames {
		path := filepath.Join(root, "sys", n)
		fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			p.Close()
			return nil, fmt.Errorf("open %s: %w", path, err)
		}
		p.dirs[i] = fd
	}
	return p, nil
}

// Close closes the directories.
func (p *Pass) Close() {
	for i, fd := range p.dirs {
		if fd >= 0 {
			unix.Close(fd)
			p.dirs[i] = -1
		}
	}
}

// Run makes ops once, split in contiguous parts over threads goroutines,
// and returns the first error (a missing entry: the VFs are not this
// root's).
func (p *Pass) Run(ops []Op, threads int) error {
	threads = max(threads, 1)
	errs := make([]error, threads)
	var wg sync.WaitGroup
	chunk := (len(ops) + threads - 1) / threads
	for t, lo := 0, 0; lo < len(ops); t, lo = t+1, lo+chunk {
		part := ops[lo:min(lo+chunk, len(ops))]
		wg.Go(func() {
			buf := make([]byte, 512)
			for _, o := range part {
				if err := p.do(o, &buf); err != nil {
					errs[t] = err
					return
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// do makes o with *buf, which a listing grows to a directory read's size.
func (p *Pass) do(o Op, buf *[]byte) error {
	switch o.kind {
	case opReadlink:
		if _, err := unix.Readlinkat(p.dirs[o.dir], o.name, *buf); err != nil {
			return fmt.Errorf("readlink %s/%s: %w", dirNames[o.dir], o.name, err)
		}
		return nil
	case opRead:
		fd, err := unix.Openat(p.dirs[o.dir], o.name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s/%s: %w", dirNames[o.dir], o.name, err)
		}
		unix.Read(fd, *buf)
		unix.Close(fd)
		return nil
	}
	fd, err := unix.Openat(p.dirs[o.dir], o.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("list %s: %w", dirNames[o.dir], err)
	}
	defer unix.Close(fd)
	if len(*buf) < 8192 {
		*buf = make([]byte, 8192)
	}
	for {
		n, err := unix.Getdents(fd, *buf)
		if err != nil {
			return fmt.Errorf("list %s: %w", dirNames[o.dir], err)
		}
		if n == 0 {
			return nil
		}
	}
}

// Write writes vfs one per line, for Read in another process.
func Write(w io.Writer, vfs []VF) error {
	bw := bufio.NewWriter(w)
	for _, v := range vfs {
		fmt.Fprintf(bw, "%s %s %d %s %s %s %s %d\n", v.Address, v.PF, v.Index, v.Netdev, v.RDMA, v.Uverbs, v.Umad, v.Port)
	}
	return bw.Flush()
}

// Read reads what Write wrote.
func Read(r io.Reader) ([]VF, error) {
	var vfs []VF
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		f := strings.Fields(sc.Text())
		if len(f) != 8 {
			return nil, fmt.Errorf("line %d: %d fields, want 8", line, len(f))
		}
		index, err1 := strconv.Atoi(f[2])
		port, err2 := strconv.Atoi(f[7])
		if err1 != nil || err2 != nil || index < 0 || port < 1 {
			return nil, fmt.Errorf("line %d: bad VF index %q or port %q", line, f[2], f[7])
		}
		vfs = append(vfs, VF{Address: f[0], PF: f[1], Index: index, Netdev: f[3], RDMA: f[4], Uverbs: f[5], Umad: f[6], Port: port})
	}
	return vfs, sc.Err()
}
