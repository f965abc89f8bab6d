package rdma

import (
	"errors"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// ScanIndex is which RDMA devices and char devices the class directories
// (<sys>/class/infiniband, infiniband_verbs, infiniband_mad) link below
// each PCI function: a node scan reads it once instead of listing three
// directories below every function.
type ScanIndex struct {
	devices, verbs, mad pci.ClassLinks
}

// ScanIndex reads the class directories with workers goroutines.
func (r *Reader) ScanIndex(workers int) (*ScanIndex, error) {
	var idx ScanIndex
	var errs [3]error
	var wg sync.WaitGroup
	// The three listings and their readlinks overlap: a listing is one
	// long system call that leaves the other CPUs idle.
	wg.Go(func() { idx.devices, errs[0] = pci.ReadClassLinks(r.sys, "infiniband", "infiniband", workers) })
	wg.Go(func() {
		idx.verbs, errs[1] = pci.ReadClassLinks(r.sys, "infiniband_verbs", "infiniband_verbs", workers)
	})
	wg.Go(func() {
		idx.mad, errs[2] = pci.ReadClassLinksSharing(r.sys, "infiniband_mad", "infiniband_mad", workers, umadOfIssm)
	})
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, err
	}
	return &idx, nil
}

// charKind returns the kind of a char device name ("uverbs14" is
// KindUverbs); false for a name that is not a kind and a number.
func charKind(name string) (string, bool) {
	kind := strings.TrimRight(name, "0123456789")
	if kind == name || kind != KindUverbs && kind != KindUmad && kind != KindIssm {
		return "", false
	}
	return kind, true
}

// umadOfIssm names the umadN of an issmN: ib_umad registers both for one
// port, with one device number and the same parent.
func umadOfIssm(name string) string {
	if kind, ok := charKind(name); ok && kind == KindIssm {
		return KindUmad + name[len(KindIssm):]
	}
	return ""
}

// DevicesForScan is DevicesAt for the function at addr, read through dir,
// with the device and char device names taken from idx.
func (r *Reader) DevicesForScan(dir Attrs, addr string, idx *ScanIndex) ([]Device, error) {
	return devicesFrom(dir, idx.devices.Of(addr), idx.verbs.Of(addr), idx.mad.Of(addr))
}
