package sriov

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"strconv"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// PF is the SR-IOV capability of a physical function as sysfs shows it.
type PF struct {
	TotalVFs int // sriov_totalvfs
	NumVFs   int // sriov_numvfs
	// VFs are the addresses the PF's virtfn0, virtfn1, … links name, in
	// index order, up to the first one missing (VFs being disabled: the
	// kernel removes the links first).
	VFs []string
}

// Attrs reads below a function's sysfs directory; pci.Dir is one.
type Attrs interface {
	Read(name string) ([]byte, error)
	// ReadlinkTo reads a link's target into buf, which a caller keeps
	// on its stack, and returns its length.
	ReadlinkTo(name string, buf []byte) (int, error)
}

var _ Attrs = pci.Dir(nil)

// ReadPF reads the SR-IOV attributes below a function's directory. It
// reports false for a function without the capability (no
// sriov_totalvfs: a VF, or a PF without SR-IOV).
func ReadPF(dir Attrs) (PF, bool) {
	var p PF
	total, err := atoi(dir, "sriov_totalvfs")
	if err != nil {
		return p, false
	}
	p.TotalVFs = total
	p.NumVFs, _ = atoi(dir, "sriov_numvfs")
	if p.NumVFs > 0 {
		p.VFs = make([]string, 0, min(p.NumVFs, len(virtfnNames)))
	}
	var buf [512]byte
	for i := 0; i < p.NumVFs && i < maxVFs; i++ {
		n, err := dir.ReadlinkTo(virtfn(i), buf[:])
		if err != nil {
			break
		}
		addr := buf[bytes.LastIndexByte(buf[:n], '/')+1 : n]
		if len(addr) != 12 || !pci.ValidAddress(string(addr)) {
			break // not a link the kernel made; what follows cannot be indexed
		}
		p.VFs = append(p.VFs, string(addr))
	}
	return p, true
}

// maxVFs bounds the virtfnN links read: a PCIe function has at most
// 65535 VFs, and sriov_numvfs past that is not the kernel's.
const maxVFs = 1 << 16

// virtfnNames are "virtfn0", "virtfn1", …, made once for the indexes VFs
// commonly have.
var virtfnNames = func() []string {
	n := make([]string, 256)
	for i := range n {
		n[i] = "virtfn" + strconv.Itoa(i)
	}
	return n
}()

func virtfn(i int) string {
	if i < len(virtfnNames) {
		return virtfnNames[i]
	}
	return "virtfn" + strconv.Itoa(i)
}

// ReadPFOf reads the SR-IOV attributes of f (read by pkg/pci: its
// SysfsPath is resolved and checked to be inside the root).
func ReadPFOf(f *pci.Function) (PF, bool, error) {
	d, err := sysfs.Open(f.SysfsPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return PF{}, false, fmt.Errorf("pci %s: %w", f.Address, pci.ErrNotFound)
		}
		return PF{}, false, fmt.Errorf("pci %s: %w", f.Address, err)
	}
	defer d.Close()
	p, ok := ReadPF(d)
	return p, ok, nil
}

// Index is the index of the VF at addr under p (the N of the virtfnN
// link that names it), -1 when p does not list it.
func (p *PF) Index(addr string) int {
	for i, vf := range p.VFs {
		if vf == addr {
			return i
		}
	}
	return -1
}

func atoi(d Attrs, name string) (int, error) {
	b, err := d.Read(name)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return 0, fmt.Errorf("%s: not a number: %q", name, b)
	}
	return n, nil
}
