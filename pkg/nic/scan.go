package nic

import (
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// Snapshot is one scan of a node: every NIC function it serves (see
// Scanner.Scan), sorted by PCI address, and what discovery found missing.
type Snapshot struct {
	Devices []Device
	// RDMACM is the node-wide RDMA connection manager device
	// (rdma.RDMACMPath, a host path) when <root>/dev/infiniband has it, ""
	// when not. A container given an RDMA device needs it too.
	RDMACM   string
	Warnings []string
}

// Device returns the device at addr, or false.
func (s *Snapshot) Device(addr string) (*Device, bool) {
	for i := range s.Devices {
		if s.Devices[i].PCIAddress == addr {
			return &s.Devices[i], true
		}
	}
	return nil, false
}

// Scanner discovers NIC functions under a host root.
type Scanner struct {
	root  string
	pci   *pci.Scanner
	rdma  *rdma.Reader
	names *pci.Names
	bufs  sync.Pool // of *scanBuffer
}

// Option configures a Scanner.
type Option func(*Scanner)

// WithNames resolves model names (pci.LoadNames); without it Model is the
// hex "vendor:device".
func WithNames(n *pci.Names) Option { return func(s *Scanner) { s.names = n } }

// NewScanner reads <root>/sys and <root>/dev. root "" is "/".
func NewScanner(root string, opts ...Option) *Scanner {
	if root == "" {
		root = "/"
	}
	s := &Scanner{root: root, pci: pci.New(root), rdma: rdma.NewReader(root)}
	for _, o := range opts {
		o(s)
	}
	return s
}

// Root is the host root the scanner reads under.
func (s *Scanner) Root() string { return s.root }

// isNIC keeps a scan to network functions (class Ethernet or InfiniBand)
// of any vendor.
func isNIC(f *pci.Function) bool { return f.IsNIC() }

// serves reports whether a scan hands out f, a network function, with
// what its visit read: every ConnectX function (with or without SR-IOV,
// as before vendors other than 15b3 were served), and of other vendors
// the SR-IOV PFs and VFs and the functions with an RDMA device. A
// management port without SR-IOV or RDMA is none of fastpath's business.
func serves(f *pci.Function, v *visited) bool {
	return f.IsConnectX() || f.IsVF() || v.sriov.TotalVFs > 0 || len(v.rdma) > 0
}

// Scan discovers every NIC function that serves accepts. It makes no netlink call:
// everything comes from sysfs and one listing of /dev/infiniband. The RDMA
// devices of each function are read while its directory is open, in the
// PCI scan's parallel workers.
func (s *Scanner) Scan() (*Snapshot, error) {
	// A scan's working memory is the last scan's, when no other scan
	// has it: a rescan of an unchanged node then allocates little more
	// than the snapshot it returns.
	buf, _ := s.bufs.Get().(*scanBuffer)
	if buf == nil {
		buf = new(scanBuffer)
	}
	defer s.bufs.Put(buf)
	// The RDMA class directories and /dev/infiniband are read while the
	// PCI scan lists the bus and reads the functions' IDs: each listing
	// is a long run of system calls that leaves the other CPUs idle. A
	// function's RDMA devices are read once the class index is there.
	idx := &buf.idx
	var idxErr error
	indexed := make(chan struct{})
	go func() {
		defer close(indexed)
		idxErr = idx.Read(s.rdma, 2*runtime.GOMAXPROCS(0))
	}()
	fns, read, err := pci.ScanInto(s.pci, isNIC, func(f *pci.Function, dir pci.Dir) (visited, error) {
		var v visited
		if !f.IsVF() {
			v.sriov, _ = sriov.ReadPF(dir)
		}
		if f.Driver == "" || f.Driver == pci.DriverVFIO {
			return v, nil
		}
		<-indexed
		if idxErr != nil {
			return v, idxErr
		}
		devs, err := s.rdma.DevicesForScan(dir, f.Address, idx)
		if err != nil {
			return v, fmt.Errorf("pci %s: %w", f.Address, err)
		}
		v.rdma = devs
		return v, nil
	}, &buf.pci)
	<-indexed
	if err != nil {
		return nil, err
	}
	if idxErr != nil {
		return nil, idxErr
	}
	nodes := idx.Nodes()
	snap := &Snapshot{Devices: make([]Device, 0, len(fns))}
	models := map[[8]byte]string{}
	if nodes.Has(rdma.RDMACMPath) {
		snap.RDMACM = rdma.RDMACMPath
	}
	var class map[string][]rdma.CharDevice
	hasRDMA := false
	lastPF := -1 // the last VF's PF, where FindNear looks first
	var noRDMA rdmaMissing
	for i := range fns {
		f := &fns[i]
		if !serves(f, &read[i]) {
			continue
		}
		var pf *pci.Function
		vfIndex := -1
		if f.IsVF() {
			if lastPF = pci.FindNear(fns, f.PhysFn, lastPF); lastPF >= 0 {
				pf = &fns[lastPF]
				vfIndex = read[lastPF].vfIndex(f.Address)
			}
		}
		devs := read[i].rdma
		if len(devs) > 0 && len(devs[0].CharDevices) == 0 {
			if class == nil {
				if class, err = s.rdma.ClassCharDevices(); err != nil {
					return nil, err
				}
			}
			devs[0].CharDevices = class[devs[0].Name]
		}
		d, warns, missing := s.device(f, pf, read[i].sriov, vfIndex, devs, nodes, models)
		snap.Devices = append(snap.Devices, d)
		snap.Warnings = append(snap.Warnings, warns...)
		if missing {
			noRDMA.add(f)
		}
		hasRDMA = hasRDMA || d.RDMADevice != ""
	}
	snap.Warnings = noRDMA.warnings(snap.Warnings)
	if hasRDMA && snap.RDMACM == "" {
		snap.Warnings = append(snap.Warnings, fmt.Sprintf("%s missing (is rdma_ucm loaded?)", rdma.RDMACMPath))
	}
	return snap, nil
}

// scanBuffer is a scan's working memory, kept for the next scan.
type scanBuffer struct {
	pci pci.ScanBuffer[visited]
	idx rdma.ScanIndex
}

// visited is what a scan's workers read below one function besides what
// pkg/pci reads: a PF's SR-IOV capability and the function's RDMA devices.
type visited struct {
	sriov sriov.PF
	rdma  []rdma.Device
	// next is where, in sriov.VFs, the join looks first for the PF's
	// next VF.
	next int
}

// vfIndex is the index of the VF at addr under v's PF (-1 when it does
// not list it). The join asks in address order, and a PF's VFs are in
// address order by index (SR-IOV gives VF i the routing ID First VF
// Offset + i * VF Stride past the PF's), so the VF after the last one
// found is tried before the PF's whole list.
func (v *visited) vfIndex(addr string) int {
	i := v.next
	if i >= len(v.sriov.VFs) || v.sriov.VFs[i] != addr {
		if i = v.sriov.Index(addr); i < 0 {
			return -1
		}
	}
	v.next = i + 1
	return i
}

// Device reads the one function at addr (a PF or VF), without scanning the
// node: the CNI's lookup of its deviceID.
func (s *Scanner) Device(addr string) (Device, error) {
	f, err := s.pci.Function(addr)
	if err != nil {
		return Device{}, err
	}
	if !f.IsNIC() {
		return Device{}, fmt.Errorf("pci %s: %s:%s class %s is not a network function (class 0x0200xx Ethernet or 0x0207xx InfiniBand)", addr, f.Vendor, f.Device, f.Class)
	}
	var pf *pci.Function
	var sr sriov.PF
	vfIndex := -1
	if f.IsVF() {
		p, err := s.pci.Function(f.PhysFn)
		if err != nil {
			return Device{}, fmt.Errorf("pci %s: read PF: %w", addr, err)
		}
		pf = &p
		psr, _, err := sriov.ReadPFOf(pf)
		if err != nil {
			return Device{}, fmt.Errorf("pci %s: read PF: %w", addr, err)
		}
		vfIndex = psr.Index(addr)
	} else if sr, _, err = sriov.ReadPFOf(&f); err != nil {
		return Device{}, err
	}
	var devs []rdma.Device
	if f.Driver != "" && f.Driver != pci.DriverVFIO {
		if devs, err = s.rdma.DevicesAt(f.SysfsPath); err != nil {
			return Device{}, fmt.Errorf("pci %s: %w", addr, err)
		}
		if len(devs) > 0 && len(devs[0].CharDevices) == 0 {
			class, err := s.rdma.ClassCharDevices()
			if err != nil {
				return Device{}, err
			}
			devs[0].CharDevices = class[devs[0].Name]
		}
	}
	nodes, err := s.rdma.DevNodes()
	if err != nil {
		return Device{}, err
	}
	d, _, _ := s.device(&f, pf, sr, vfIndex, devs, nodes, nil)
	return d, nil
}

// device joins what was read about one function: f, its PF (VFs), its
// own SR-IOV capability sr (PFs), its index under its PF (VFs, -1 when
// its PF does not list it) and its RDMA devices, which it takes over.
// models, when not nil, keeps the model names a scan has looked up. The
// third result reports a ConnectX function bound to its netdevice driver
// without an RDMA device, which mlx5_ib gives every one: the caller
// warns once per PF (rdmaMissing). Other vendors' functions without one
// are plain Ethernet functions (igbvf has no RDMA at all); a pool that
// asks for RDMA says so itself.
func (s *Scanner) device(f, pf *pci.Function, sr sriov.PF, vfIndex int, devs []rdma.Device, nodes rdma.DevNodes, models map[[8]byte]string) (Device, []string, bool) {
	d := Device{
		PCIAddress: f.Address, Vendor: f.Vendor, DeviceID: f.Device, Class: f.Class,
		Model: s.model(f.Vendor, f.Device, models), Driver: f.Driver, NUMANode: f.NUMANode,
		PFAddress: f.PhysFn, VFIndex: vfIndex, TotalVFs: sr.TotalVFs, NumVFs: sr.NumVFs,
		UpstreamBridges: f.Bridges, PCIeRoot: f.PCIeRoot,
		CharDevices: []rdma.CharDevice{}, LinkType: classLinkType(f),
	}
	var warns []string
	warn := func(format string, args ...any) {
		warns = append(warns, fmt.Sprintf("%s: ", f.Address)+fmt.Sprintf(format, args...))
	}
	if len(f.Netdevs) > 0 {
		d.Netdev = f.Netdevs[0]
		if len(f.Netdevs) > 1 {
			warn("several netdevs (%s); using %s", strings.Join(f.Netdevs, ", "), d.Netdev)
		}
	}
	if !f.IsVF() {
		d.PFNetdev = d.Netdev
	}
	switch {
	case f.IsVF() && (pf == nil || !pf.IsNIC()):
		warn("its PF %s is not among the NIC functions found (being removed or reset?); no VF index", f.PhysFn)
	case f.IsVF() && vfIndex < 0:
		warn("its PF %s does not list it among its virtfnN links (VFs being changed?); no VF index", f.PhysFn)
	}
	if pf != nil {
		if len(pf.Netdevs) > 0 {
			d.PFNetdev = pf.Netdevs[0]
		}
	}
	switch {
	case f.Driver == pci.DriverVFIO:
		d.IOMMUGroup = f.IOMMUGroup
		if f.IOMMUGroup == "" {
			warn("bound to %s but has no iommu_group", pci.DriverVFIO)
			break
		}
		for _, p := range []string{"/dev/vfio/vfio", "/dev/vfio/" + f.IOMMUGroup} {
			d.VFIODevices = append(d.VFIODevices, p)
		}
		return d, warns, false
	case f.Driver == "":
		warn("no driver bound")
		return d, warns, false
	}
	if d.Netdev == "" {
		warn("no netdev")
	}
	if len(devs) == 0 {
		return d, warns, f.IsConnectX()
	}
	if len(devs) > 1 {
		var names []string
		for _, r := range devs {
			names = append(names, r.Name)
		}
		warn("several RDMA devices (%s); using %s", strings.Join(names, ", "), devs[0].Name)
	}
	r := devs[0]
	d.RDMADevice = r.Name
	if ll := r.LinkLayer(); ll != "" {
		d.LinkType = ll
	}
	hasUverbs := false
	// r's char devices are this device's alone: keep the present ones in
	// place.
	if len(r.CharDevices) > 0 {
		d.CharDevices = r.CharDevices[:0:len(r.CharDevices)]
	}
	for _, c := range r.CharDevices {
		if !nodes.Has(c.Path) {
			warn("%s: %s is in sysfs but missing under %s", r.Name, c.Path, filepath.Join(s.root, rdma.DevDir))
			continue
		}
		hasUverbs = hasUverbs || c.Kind == rdma.KindUverbs
		d.CharDevices = append(d.CharDevices, c)
	}
	if !hasUverbs {
		warn("%s: no uverbs char device (is ib_uverbs loaded?)", r.Name)
	}
	return d, warns, false
}

// rdmaMissing gathers the ConnectX functions a scan found without an RDMA
// device, by PF (a PF by its own address), in scan order: one cause, one
// warning, not one per VF of a node whose mlx5_ib is not loaded.
type rdmaMissing struct {
	pfs   []string
	funcs map[string][]string
}

func (m *rdmaMissing) add(f *pci.Function) {
	pf := f.PhysFn
	if pf == "" {
		pf = f.Address
	}
	if m.funcs == nil {
		m.funcs = map[string][]string{}
	}
	if _, ok := m.funcs[pf]; !ok {
		m.pfs = append(m.pfs, pf)
	}
	m.funcs[pf] = append(m.funcs[pf], f.Address)
}

// warnings appends one warning per PF to warns.
func (m *rdmaMissing) warnings(warns []string) []string {
	for _, pf := range m.pfs {
		fns := m.funcs[pf]
		if len(fns) == 1 {
			warns = append(warns, fns[0]+": no RDMA device (is mlx5_ib loaded?)")
			continue
		}
		warns = append(warns, fmt.Sprintf("%s: %d functions of this PF have no RDMA device (%s): is mlx5_ib loaded?", pf, len(fns), words.List(fns, 4)))
	}
	return warns
}

// classLinkType is the link type f's PCI class gives: a ConnectX port's
// class follows its configured link type (InfiniBand or Ethernet).
func classLinkType(f *pci.Function) string {
	switch {
	case f.IsInfiniBand():
		return rdma.LinkLayerInfiniBand
	case f.IsEthernet():
		return rdma.LinkLayerEthernet
	}
	return ""
}

// model is the model name of vendor:device, looked up once per scan in
// models (when not nil).
func (s *Scanner) model(vendor, device string, models map[[8]byte]string) string {
	if models == nil || len(vendor) != 4 || len(device) != 4 {
		return s.names.Model(vendor, device)
	}
	var k [8]byte
	copy(k[:4], vendor)
	copy(k[4:], device)
	m, ok := models[k]
	if !ok {
		m = s.names.Model(vendor, device)
		models[k] = m
	}
	return m
}
