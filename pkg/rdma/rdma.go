// Package rdma reads a PCI function's RDMA devices, their ports and the
// char devices that belong to them from sysfs and /dev under an injected
// root. It never writes. RDMA port counters on a real host come from
// github.com/Mellanox/rdmamap (counters*.go), which reads fixed paths.
package rdma

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
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
	Kind string // KindUverbs, KindUmad or KindIssm
	Name string // "uverbs14"
	Path string // "/dev/infiniband/uverbs14", as on the host
	Port int    // the port of a umad/issm device; 0 for uverbs
}

// Port is one port of an RDMA device.
type Port struct {
	Number    int
	LinkLayer string // LinkLayerInfiniBand or LinkLayerEthernet
	State     string // "ACTIVE", "DOWN", "INIT", … (the name after "4: ")
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

// ErrNoGID is returned when a port has no GID of the asked kind.
var ErrNoGID = errors.New("no matching GID")

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
// directory is dir. See DevicesIn.
func (r *Reader) DevicesAt(dir string) ([]Device, error) {
	d, err := sysfs.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("rdma: %w", err)
		}
		return nil, err
	}
	defer d.Close()
	return r.DevicesIn(d)
}

// DevicesIn returns the RDMA devices of the PCI function whose sysfs
// directory is open as dir: <dir>/infiniband/*, with the uverbs devices of
// <dir>/infiniband_verbs/* and the umad/issm devices of <dir>/infiniband_mad/*
// (the kernel parents them on the PCI function too) matched to them by
// their ibdev attribute — the N of uverbsN is not the N of mlx5_N. Where
// the function has a single device with a single port, membership alone
// decides and the ibdev/port files are not read. A function without RDMA
// has none.
func (r *Reader) DevicesIn(dir sysfs.Dir) ([]Device, error) {
	return devicesIn(dir, true)
}

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
	var err error
	if idx.devices, err = pci.ReadClassLinks(r.sys, "infiniband", "infiniband", workers); err != nil {
		return nil, err
	}
	if idx.verbs, err = pci.ReadClassLinks(r.sys, "infiniband_verbs", "infiniband_verbs", workers); err != nil {
		return nil, err
	}
	if idx.mad, err = pci.ReadClassLinks(r.sys, "infiniband_mad", "infiniband_mad", workers); err != nil {
		return nil, err
	}
	return &idx, nil
}

// DevicesForScan is DevicesIn for the function at addr, open as dir, with
// the device and char device names taken from idx, and without the ports'
// state, which a node scan does not need (health follows netlink,
// PortState reads it on demand).
func (r *Reader) DevicesForScan(dir sysfs.Dir, addr string, idx *ScanIndex) ([]Device, error) {
	return devicesFrom(dir, idx.devices[addr], idx.verbs[addr], idx.mad[addr], false)
}

func devicesIn(dir sysfs.Dir, withState bool) ([]Device, error) {
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
	return devicesFrom(dir, names, verbs, mad, withState)
}

// devicesFrom builds the devices named names below dir, with the char
// devices of verbs (infiniband_verbs entries) and mad (infiniband_mad).
func devicesFrom(dir sysfs.Dir, names, verbs, mad []string, withState bool) ([]Device, error) {
	if len(names) == 0 {
		return nil, nil
	}
	devs := make([]Device, len(names))
	byName := make(map[string]*Device, len(names))
	for i, n := range names {
		devs[i].Name = n
		byName[n] = &devs[i]
		ports, err := readPorts(dir, "infiniband/"+n, withState)
		if err != nil {
			return nil, fmt.Errorf("rdma %s: %w", n, err)
		}
		devs[i].Ports = ports
	}
	single := len(devs) == 1
	for class, entries := range map[string][]string{"infiniband_verbs": verbs, "infiniband_mad": mad} {
		for _, e := range entries {
			kind := strings.TrimRight(e, "0123456789")
			if kind != KindUverbs && kind != KindUmad && kind != KindIssm || kind == e {
				continue
			}
			d := &devs[0]
			if !single {
				ibdev, err := dir.Read(class + "/" + e + "/ibdev")
				if err != nil {
					continue // being removed
				}
				var ok bool
				if d, ok = byName[string(ibdev)]; !ok {
					continue
				}
			}
			cd := CharDevice{Kind: kind, Name: e, Path: DevDir + "/" + e}
			if kind != KindUverbs {
				if len(d.Ports) == 1 {
					cd.Port = d.Ports[0].Number
				} else if p, err := dir.Read(class + "/" + e + "/port"); err == nil {
					cd.Port, _ = strconv.Atoi(string(p))
				}
			}
			d.CharDevices = append(d.CharDevices, cd)
		}
	}
	for i := range devs {
		sortCharDevices(devs[i].CharDevices)
	}
	return devs, nil
}

func sortCharDevices(c []CharDevice) {
	rank := map[string]int{KindUverbs: 0, KindUmad: 1, KindIssm: 2}
	sort.Slice(c, func(i, j int) bool {
		if c[i].Port != c[j].Port {
			return c[i].Port < c[j].Port
		}
		return rank[c[i].Kind] < rank[c[j].Kind]
	})
}

// readPorts reads the ports of dev (a path below dir). Ports of a channel
// adapter are numbered from 1: reading 1, 2, … until one is missing saves
// listing the directory. withState also reads each port's state.
func readPorts(dir sysfs.Dir, dev string, withState bool) ([]Port, error) {
	var ports []Port
	for n := 1; ; n++ {
		p := dev + "/ports/" + strconv.Itoa(n)
		ll, err := dir.Read(p + "/link_layer")
		if errors.Is(err, fs.ErrNotExist) {
			return ports, nil
		}
		if err != nil {
			return nil, err
		}
		port := Port{Number: n, LinkLayer: string(ll)}
		if withState {
			if st, err := dir.Read(p + "/state"); err == nil {
				port.State = stateName(string(st))
			}
		}
		ports = append(ports, port)
	}
}

// stateName turns "4: ACTIVE" into "ACTIVE".
func stateName(s string) string {
	if i := strings.Index(s, ":"); i >= 0 {
		return strings.TrimSpace(s[i+1:])
	}
	return strings.TrimSpace(s)
}

// PortState reads the current state of a port ("ACTIVE", "DOWN", …).
func (r *Reader) PortState(dev string, port int) (string, error) {
	if err := checkName(dev); err != nil {
		return "", err
	}
	s, err := pci.ReadString(filepath.Join(r.sys, "class", "infiniband", dev, "ports", strconv.Itoa(port), "state"))
	if err != nil {
		return "", fmt.Errorf("rdma %s port %d: read state: %w", dev, port, err)
	}
	return stateName(s), nil
}

// DevNodes lists the char devices present in <root>/dev/infiniband, by
// host path ("/dev/infiniband/uverbs14"). A missing directory is an empty
// set: the RDMA modules are not loaded.
func (r *Reader) DevNodes() (map[string]bool, error) {
	names, err := readDirNames(filepath.Join(r.root, DevDir))
	if err != nil {
		return nil, err
	}
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[DevDir+"/"+n] = true
	}
	return m, nil
}

// HostPath is where a host path such as /dev/infiniband/uverbs14 is found
// under the reader's root.
func (r *Reader) HostPath(path string) string { return filepath.Join(r.root, path) }

// RoCEv2IPv4GIDIndex returns the index of the RoCE v2 GID that carries an
// IPv4 address of netdev on the port: the one NCCL and UCX want. Empty
// slots have no gid_attrs/types entry (the kernel answers EINVAL) and are
// skipped.
func (r *Reader) RoCEv2IPv4GIDIndex(dev string, port int, netdev string) (int, error) {
	if err := checkName(dev); err != nil {
		return -1, err
	}
	portDir := filepath.Join(r.sys, "class", "infiniband", dev, "ports", strconv.Itoa(port))
	names, err := readDirNames(filepath.Join(portDir, "gids"))
	if err != nil {
		return -1, fmt.Errorf("rdma %s port %d: read gid table: %w", dev, port, err)
	}
	if len(names) == 0 {
		return -1, fmt.Errorf("rdma %s port %d: no gid table", dev, port)
	}
	idx := make([]int, 0, len(names))
	for _, n := range names {
		if i, err := strconv.Atoi(n); err == nil {
			idx = append(idx, i)
		}
	}
	sort.Ints(idx)
	for _, i := range idx {
		s := strconv.Itoa(i)
		typ, err := pci.ReadString(filepath.Join(portDir, "gid_attrs", "types", s))
		if err != nil || typ != "RoCE v2" {
			continue
		}
		ndev, err := pci.ReadString(filepath.Join(portDir, "gid_attrs", "ndevs", s))
		if err != nil || ndev != netdev {
			continue
		}
		gid, err := pci.ReadString(filepath.Join(portDir, "gids", s))
		if err != nil {
			continue
		}
		if ip := ParseGID(gid); ip != nil && ip.To4() != nil {
			return i, nil
		}
	}
	return -1, fmt.Errorf("rdma %s port %d: netdev %s: RoCE v2 IPv4 GID: %w", dev, port, netdev, ErrNoGID)
}

// ParseGID parses a sysfs GID ("fe80:0000:…", eight groups of four hex
// digits) into an IP; nil when malformed.
func ParseGID(s string) net.IP {
	parts := strings.Split(s, ":")
	if len(parts) != 8 {
		return nil
	}
	ip := make(net.IP, 16)
	for i, p := range parts {
		if len(p) != 4 {
			return nil
		}
		v, err := strconv.ParseUint(p, 16, 16)
		if err != nil {
			return nil
		}
		ip[2*i], ip[2*i+1] = byte(v>>8), byte(v)
	}
	return ip
}

// checkName refuses device names that would build paths outside sysfs.
func checkName(dev string) error {
	if dev == "" || strings.ContainsAny(dev, "/\x00") || dev == "." || dev == ".." {
		return fmt.Errorf("rdma: invalid device name %q", dev)
	}
	return nil
}

// readDirNames lists a directory, sorted; a missing directory is empty.
func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, err
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	sort.Strings(names)
	return names, nil
}

// ClassCharDevices maps ib device names to their char devices as listed in
// <root>/sys/class/infiniband_verbs and infiniband_mad (each entry's ibdev
// and port attributes). Discovery reads the PCI function's own directories
// first; this is the fallback for layouts that only show the class view.
func (r *Reader) ClassCharDevices() (map[string][]CharDevice, error) {
	out := map[string][]CharDevice{}
	for _, class := range []string{"infiniband_verbs", "infiniband_mad"} {
		dir := filepath.Join(r.sys, "class", class)
		names, err := readDirNames(dir)
		if err != nil {
			return nil, err
		}
		for _, e := range names {
			kind := strings.TrimRight(e, "0123456789")
			if kind != KindUverbs && kind != KindUmad && kind != KindIssm || kind == e {
				continue
			}
			ibdev, err := pci.ReadString(filepath.Join(dir, e, "ibdev"))
			if err != nil {
				continue
			}
			cd := CharDevice{Kind: kind, Name: e, Path: DevDir + "/" + e}
			if kind != KindUverbs {
				cd.Port, _ = pci.ReadInt(filepath.Join(dir, e, "port"))
			}
			out[ibdev] = append(out[ibdev], cd)
		}
	}
	for k := range out {
		sortCharDevices(out[k])
	}
	return out, nil
}
