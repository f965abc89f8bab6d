// Package rdma reads a PCI function's RDMA devices, their ports and the
// char devices that belong to them from sysfs and /dev under an injected
// root. It never writes. RDMA port counters on a real host come from
// github.com/Mellanox/rdmamap (counters*.go), which reads fixed paths.
package rdma

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// DevDir is the directory RDMA char devices live in, on the host and in
// containers.
const DevDir = "/dev/infiniband"

// RDMACMPath is the node-wide RDMA connection manager device.
const RDMACMPath = DevDir + "/rdma_cm"

// Char device kinds.
const (
	KindUverbs = "uverbs"
	KindUmad   = "umad"
	KindIssm   = "issm"
)

// Link layers as sysfs writes them.
const (
	LinkLayerInfiniBand = "InfiniBand"
	LinkLayerEthernet   = "Ethernet"
)

// CharDevice is one char device of an RDMA device.
type CharDevice struct {
	Kind string `json:"kind"`           // KindUverbs, KindUmad or KindIssm
	Name string `json:"name"`           // "uverbs14"
	Path string `json:"path"`           // "/dev/infiniband/uverbs14", as on the host
	Port int    `json:"port,omitempty"` // the port of a umad/issm device; 0 for uverbs
}

// Port is one port of an RDMA device.
type Port struct {
	Number    int
	LinkLayer string // LinkLayerInfiniBand or LinkLayerEthernet
}

// Device is an RDMA (ib_core) device and what belongs to it.
type Device struct {
	Name        string // "mlx5_12"
	Ports       []Port
	CharDevices []CharDevice // sorted: uverbs, then umad/issm by port
}

// LinkLayer is the link layer of the device's first port, "" without ports.
func (d *Device) LinkLayer() string {
	if len(d.Ports) == 0 {
		return ""
	}
	return d.Ports[0].LinkLayer
}

// Reader reads RDMA state under a root.
type Reader struct {
	root string
	sys  string
}

// NewReader returns a Reader for <root>/sys and <root>/dev. root "" is "/".
func NewReader(root string) *Reader {
	if root == "" {
		root = "/"
	}
	return &Reader{root: root, sys: filepath.Join(root, "sys")}
}

// Devices returns the RDMA devices of the PCI function at addr.
func (r *Reader) Devices(addr string) ([]Device, error) {
	if !pci.ValidAddress(addr) {
		return nil, fmt.Errorf("rdma: %q is not a PCI address", addr)
	}
	return r.DevicesAt(filepath.Join(r.sys, "bus", "pci", "devices", addr))
}

// DevicesAt returns the RDMA devices of the PCI function whose sysfs
// directory is dir: <dir>/infiniband/*, with the uverbs devices of
// <dir>/infiniband_verbs/* and the umad/issm devices of <dir>/infiniband_mad/*
// (the kernel parents them on the PCI function too) matched to them by
// their ibdev attribute — the N of uverbsN is not the N of mlx5_N. Where
// the function has a single device with a single port, membership alone
// decides and the ibdev/port files are not read. A function without RDMA
// has none.
func (r *Reader) DevicesAt(dir string) ([]Device, error) {
	d, err := sysfs.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("rdma: %w", err)
		}
		return nil, err
	}
	defer d.Close()
	return devicesIn(d)
}

// Attrs reads sysfs attributes below a PCI function's directory, by
// relative name ("infiniband/mlx5_0/ports/1/link_layer"), trimmed: the
// reads a node scan makes while the function's directory is open.
// pci.Dir is one.
type Attrs interface {
	Read(name string) ([]byte, error)
	// ReadTo reads into buf, which a caller keeps on its stack.
	ReadTo(name string, buf []byte) ([]byte, error)
}

func devicesIn(dir sysfs.Dir) ([]Device, error) {
	names, err := dir.List("infiniband")
	if err != nil || len(names) == 0 {
		return nil, err
	}
	verbs, err := dir.List("infiniband_verbs")
	if err != nil {
		return nil, err
	}
	mad, err := dir.List("infiniband_mad")
	if err != nil {
		return nil, err
	}
	return devicesFrom(dir, names, verbs, mad)
}

// devicesFrom builds the devices named names below dir, with the char
// devices of verbs (infiniband_verbs entries) and mad (infiniband_mad).
func devicesFrom(dir Attrs, names, verbs, mad []string) ([]Device, error) {
	if len(names) == 0 {
		return nil, nil
	}
	single := len(names) == 1
	// ib_umad makes one umad device per IB or RoCE port: a single device
	// with k of them has ports 1..k, and no port k+1 to probe for.
	nports := 0
	if single {
		for _, e := range mad {
			if kind, ok := CharKind(e); ok && kind == KindUmad {
				nports++
			}
		}
	}
	// A node scan reads thousands of functions, nearly all with one
	// device, one port and a uverbs, umad and issm device: those take
	// one allocation for the device, its ports and its char devices.
	var devs []Device
	var ports []Port
	var chars []CharDevice
	if single && nports <= 1 && len(verbs)+len(mad) <= len(oneDevice{}.chars) {
		one := new(oneDevice)
		devs, ports, chars = one.dev[:], one.ports[:0], one.chars[:0]
	} else {
		devs = make([]Device, len(names))
	}
	for i, n := range names {
		devs[i].Name = n
		p, err := readPorts(dir, n, nports, ports)
		if err != nil {
			return nil, fmt.Errorf("rdma %s: %w", n, err)
		}
		devs[i].Ports = p
	}
	// The char devices' paths, DevDir/<name>, are windows of one string.
	paths, off := charPaths(verbs, mad), 0
	classes := [...]struct {
		name    string
		entries []string
	}{{"infiniband_verbs", verbs}, {"infiniband_mad", mad}}
	for _, class := range classes {
		for _, e := range class.entries {
			path := paths[off : off+len(DevDir)+1+len(e)]
			off += len(path)
			kind, ok := CharKind(e)
			if !ok {
				continue
			}
			d := &devs[0]
			if !single {
				ibdev, err := dir.Read(class.name + "/" + e + "/ibdev")
				if err != nil {
					continue // being removed
				}
				i := slices.IndexFunc(devs, func(d Device) bool { return d.Name == string(ibdev) })
				if i < 0 {
					continue
				}
				d = &devs[i]
			}
			cd := CharDevice{Kind: kind, Name: e, Path: path}
			if kind != KindUverbs {
				if len(d.Ports) == 1 {
					cd.Port = d.Ports[0].Number
				} else if p, err := dir.Read(class.name + "/" + e + "/port"); err == nil {
					cd.Port, _ = strconv.Atoi(string(p))
				}
			}
			switch {
			case d.CharDevices != nil:
			case chars != nil:
				d.CharDevices = chars
			default:
				d.CharDevices = make([]CharDevice, 0, 1+2*max(1, len(d.Ports)))
			}
			d.CharDevices = append(d.CharDevices, cd)
		}
	}
	for i := range devs {
		sortCharDevices(devs[i].CharDevices)
	}
	return devs, nil
}

// sortCharDevices orders char devices by port, uverbs (port 0) first,
// then umad before issm.
func sortCharDevices(c []CharDevice) {
	rank := func(kind string) int {
		switch kind {
		case KindUverbs:
			return 0
		case KindUmad:
			return 1
		}
		return 2
	}
	slices.SortStableFunc(c, func(a, b CharDevice) int {
		if a.Port != b.Port {
			return a.Port - b.Port
		}
		return rank(a.Kind) - rank(b.Kind)
	})
}

// oneDevice is the RDMA device of a function with one device, one port
// and up to three char devices, in one allocation.
type oneDevice struct {
	dev   [1]Device
	ports [1]Port
	chars [3]CharDevice
}

// charPaths is DevDir/<name> for every name in lists, in order, in one
// string.
func charPaths(lists ...[]string) string {
	n := 0
	for _, l := range lists {
		for _, e := range l {
			n += len(DevDir) + 1 + len(e)
		}
	}
	var b strings.Builder
	b.Grow(n)
	for _, l := range lists {
		for _, e := range l {
			b.WriteString(DevDir)
			b.WriteByte('/')
			b.WriteString(e)
		}
	}
	return b.String()
}

// readPorts reads the ports of the RDMA device dev (below dir's
// infiniband directory) into ports. Ports of a channel adapter are
// numbered from 1: reading 1, 2, … until one is missing saves listing the
// directory; known > 0 is the number of ports when the caller knows it,
// and saves the probe past the last.
func readPorts(dir Attrs, dev string, known int, ports []Port) ([]Port, error) {
	if ports == nil && known > 0 {
		ports = make([]Port, 0, known)
	}
	for n := 1; known <= 0 || n <= known; n++ {
		// Read, not ReadTo: a buffer passed through the Attrs interface
		// escapes, Read's stays on its stack and only the value is
		// copied out. The name is made in one piece (it escapes too).
		ll, err := dir.Read("infiniband/" + dev + "/ports/" + strconv.Itoa(n) + "/link_layer")
		if errors.Is(err, fs.ErrNotExist) {
			return ports, nil
		}
		if err != nil {
			return nil, err
		}
		ports = append(ports, Port{Number: n, LinkLayer: linkLayer(ll)})
	}
	return ports, nil
}

// linkLayer returns the link layer as a string, without allocating for
// the two the kernel writes.
func linkLayer(b []byte) string {
	switch string(b) {
	case LinkLayerInfiniBand:
		return LinkLayerInfiniBand
	case LinkLayerEthernet:
		return LinkLayerEthernet
	}
	return string(b)
}

// DevNodes is the set of char devices present in <root>/dev/infiniband.
// A node of a thousand VFs has three thousand, and a node scan asks for
// every VF's three one after the other, so they are not searched by
// name: the names of a kind and a number ("uverbs14") are bits, one
// bitmap per kind indexed by the number (the kernel numbers them from 0,
// densely), and a number past the bitmaps' reach is a sorted integer key
// (charKeyOf). Only the other names ("rdma_cm") are searched as strings,
// sorted. Nothing is sorted but those: the listing comes as the kernel
// gives it. Against a map of the names (issue 40, docs/benchmarks.md,
// seven interleaved rounds) the map build's 1024-VF daemon peaked at
// 36.3 MiB instead of 34.2 (DRA build), took 2,005 page faults to
// registration instead of 1,953 and 1.37× floor+list instead of 1.31×;
// why a map of 3,097 names moves the peak by 2 MiB is not known.
type DevNodes struct {
	names  []string    // every name, in the listing's order
	bits   [3][]uint64 // by kind (uverbs, umad, issm): bit n for number n
	keys   []charKey   // the names numbered from maxBit on, sorted
	others []string
}

// maxBit bounds the numbers kept as bits: 8 KiB per kind at most.
const maxBit = 1 << 16

// newDevNodes is the set of names (in any order), in the memory of prev,
// which it no longer is.
func newDevNodes(names []string, prev DevNodes) DevNodes {
	n := DevNodes{names: names, keys: prev.keys[:0], others: prev.others[:0]}
	for i, b := range prev.bits {
		// Zero to its capacity: a bitmap only grows within it by
		// reslicing.
		clear(b[:cap(b)])
		n.bits[i] = b[:0]
	}
	for _, name := range names {
		k, ok := charKeyOf(name)
		if !ok {
			n.others = append(n.others, name)
			continue
		}
		num := k.number()
		if num >= maxBit {
			n.keys = append(n.keys, k)
			continue
		}
		b, w := n.bits[k.kind()], int(num/64)
		if w >= len(b) {
			b = slices.Grow(b, w+1-len(b))[:w+1]
		}
		b[w] |= 1 << (num % 64)
		n.bits[k.kind()] = b
	}
	slices.Sort(n.keys)
	slices.Sort(n.others)
	return n
}

// charKey is a char device name of a kind and a number as one integer:
// the kind (1, 2, 3 for uverbs, umad, issm) above the number.
type charKey uint64

// kind is the index of k's kind: 0, 1, 2 for uverbs, umad, issm.
func (k charKey) kind() int { return int(k>>32) - 1 }

// number is k's number, the N of uverbsN.
func (k charKey) number() uint64 { return uint64(k) & (1<<32 - 1) }

// charKeyOf is the key of a char device name; false for another name,
// and for a number with a leading zero or of more than nine digits, which
// only the names search.
func charKeyOf(name string) (charKey, bool) {
	kind, ok := CharKind(name)
	if !ok {
		return 0, false
	}
	digits := name[len(kind):]
	if len(digits) > 9 || len(digits) > 1 && digits[0] == '0' {
		return 0, false
	}
	var k uint64
	switch kind {
	case KindUverbs:
		k = 1
	case KindUmad:
		k = 2
	default:
		k = 3
	}
	n := uint64(0)
	for i := 0; i < len(digits); i++ {
		n = n*10 + uint64(digits[i]-'0')
	}
	return charKey(k<<32 | n), true
}

// Has reports whether the device at host path ("/dev/infiniband/uverbs14")
// is present.
func (n DevNodes) Has(path string) bool {
	name, ok := strings.CutPrefix(path, DevDir+"/")
	if !ok {
		return false
	}
	if k, ok := charKeyOf(name); ok {
		if num := k.number(); num < maxBit {
			b, w := n.bits[k.kind()], int(num/64)
			return w < len(b) && b[w]&(1<<(num%64)) != 0
		}
		_, ok = slices.BinarySearch(n.keys, k)
		return ok
	}
	_, ok = slices.BinarySearch(n.others, name)
	return ok
}

// Len is how many char devices there are.
func (n DevNodes) Len() int { return len(n.names) }

// DevNodes lists the char devices present in <root>/dev/infiniband. A
// missing directory is an empty set: the RDMA modules are not loaded.
// It is a scan's reading of them (ScanIndex.readNodes), made once.
func (r *Reader) DevNodes() (DevNodes, error) {
	var idx ScanIndex
	if err := idx.readNodes(filepath.Join(r.root, DevDir)); err != nil {
		return DevNodes{}, err
	}
	return idx.nodes, nil
}
