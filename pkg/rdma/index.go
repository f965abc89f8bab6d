package rdma

import (
	"errors"
	"io/fs"
	"path/filepath"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// ScanIndex is which RDMA devices and char devices the class directories
// (<sys>/class/infiniband, infiniband_verbs, infiniband_mad) link below
// each PCI function, and which char devices <root>/dev/infiniband has: a
// node scan reads it once instead of listing three directories below
// every function. The zero ScanIndex is empty; Read fills it, and reuses
// its memory when it reads it again.
type ScanIndex struct {
	devices, verbs, mad pci.ClassLinks
	nodes               DevNodes
	readers             [3]pci.ClassReader
	nodesList           sysfs.Listing
	// nodesOK says nodes is nodesList's last listing.
	nodesOK bool
}

// Read reads idx from r with workers goroutines per class, reusing the
// memory of its last reading: what idx handed out before (Nodes) is no
// longer valid.
func (idx *ScanIndex) Read(r *Reader, workers int) error {
	var errs [4]error
	var wg sync.WaitGroup
	// The four listings and the readlinks overlap: a listing is one long
	// system call that leaves the other CPUs idle.
	wg.Go(func() {
		idx.devices, errs[0] = idx.readers[0].Read(r.sys, "infiniband", "infiniband", workers, nil)
	})
	wg.Go(func() {
		idx.verbs, errs[1] = idx.readers[1].Read(r.sys, "infiniband_verbs", "infiniband_verbs", workers, nil)
	})
	wg.Go(func() {
		idx.mad, errs[2] = idx.readers[2].Read(r.sys, "infiniband_mad", "infiniband_mad", workers, umadFamily)
	})
	errs[3] = idx.readNodes(filepath.Join(r.root, DevDir))
	wg.Wait()
	return errors.Join(errs[:]...)
}

// readNodes lists dir (<root>/dev/infiniband) into idx.nodes. The
// listing is not sorted (DevNodes needs no order), and an unchanged one
// keeps the set built from it.
func (idx *ScanIndex) readNodes(dir string) error {
	ok := idx.nodesOK
	idx.nodesOK = false
	d, err := sysfs.Open(dir)
	if errors.Is(err, fs.ErrNotExist) {
		// No RDMA modules: none, and not the listing's (which is of the
		// directory before it went).
		idx.nodes = newDevNodes(nil, idx.nodes)
		return nil
	}
	if err != nil {
		return err
	}
	defer d.Close()
	names, same, err := idx.nodesList.Raw(d, ".")
	if err != nil {
		return err
	}
	if same && ok {
		idx.nodes.names = names // the same names, in the listing's memory
	} else {
		idx.nodes = newDevNodes(names, idx.nodes)
	}
	idx.nodesOK = true
	return nil
}

// Nodes are the char devices present in <root>/dev/infiniband when idx
// was read (see Reader.DevNodes).
func (idx *ScanIndex) Nodes() DevNodes { return idx.nodes }

// CharKind returns the kind of a char device name ("uverbs14" is
// KindUverbs); false for a name that is not a kind and a number
// ("abi_version", "rdma_cm", a bare "uverbs").
func CharKind(name string) (string, bool) {
	// By hand, not strings.TrimRight with a cutset: that builds its set
	// on every call, and a node scan asks for thousands of names.
	i := len(name)
	for i > 0 && '0' <= name[i-1] && name[i-1] <= '9' {
		i--
	}
	kind := name[:i]
	if kind == name || kind != KindUverbs && kind != KindUmad && kind != KindIssm {
		return "", false
	}
	return kind, true
}

// umadFamily is the family of an ib_umad class entry (pci.Family):
// ib_umad registers umadN and issmN for one port, with one device number
// and the same parent, and umadN heads family N.
func umadFamily(name string) (n uint32, head, ok bool) {
	k, ok := charKeyOf(name)
	if !ok || k.kind() == 0 {
		return 0, false, false
	}
	return uint32(k.number()), k.kind() == 1, true
}

// DevicesForScan is DevicesAt for the function at addr, read through dir,
// with the device and char device names taken from idx.
func (r *Reader) DevicesForScan(dir Attrs, addr string, idx *ScanIndex) ([]Device, error) {
	return devicesFrom(dir, idx.devices.Of(addr), idx.verbs.Of(addr), idx.mad.Of(addr))
}
