// Package pci enumerates PCI functions from sysfs under an injected root:
// IDs, class, driver, NUMA node, the physfn link of a VF, netdevs and the
// chain of upstream bridges. It reads; it never writes to sysfs. The PF
// side of SR-IOV (sriov_totalvfs, sriov_numvfs, virtfnN) is pkg/sriov's.
package pci

import (
	"errors"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
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
	// NUMANode is -1 when the kernel does not know. A VF has its PF's (the
	// kernel puts a VF on its PF's bus).
	NUMANode int
	// PhysFn is the PF's address for a VF (its physfn link), "" otherwise.
	PhysFn string
	// Netdevs are the function's own network interfaces, sorted; switchdev
	// representors (phys_port_name pfNvfM / pfNsfM) are in Representors.
	Netdevs      []string
	Representors []string
	IOMMUGroup   string
	// Bridges are the upstream PCI bridges, nearest first.
	Bridges []string
	// PCIeRoot is the PCIe root complex the function hangs off, as the
	// Kubernetes standard device attribute resource.kubernetes.io/pcieRoot
	// has it: the host bridge directory "pci<domain>:<bus>" ("pci0000:15")
	// that its path starts with below <sys>/devices. "" when the path
	// starts otherwise (a root complex under devices/platform/…), where
	// k8s.io/dynamic-resource-allocation/deviceattribute finds none either.
	PCIeRoot string
	// SysfsPath is the resolved directory of the function under the root.
	SysfsPath string

	numaRead bool
}

// IsVF reports whether f is an SR-IOV virtual function.
func (f *Function) IsVF() bool { return f.PhysFn != "" }

// PCI class codes (base class and subclass, as Function.Class begins) of
// network controllers.
const (
	ClassEthernet   = "0x0200"
	ClassInfiniBand = "0x0207"
)

// IsEthernet reports whether f's class is Ethernet controller (0x0200xx).
func (f *Function) IsEthernet() bool { return strings.HasPrefix(f.Class, ClassEthernet) }

// IsInfiniBand reports whether f's class is InfiniBand controller
// (0x0207xx). A ConnectX port's class follows its configured link type.
func (f *Function) IsInfiniBand() bool { return strings.HasPrefix(f.Class, ClassInfiniBand) }

// IsNIC reports whether f is a network function of any vendor: class
// Ethernet or InfiniBand controller. NIC vendors' PCIe bridges and
// management functions (ConnectX and BlueField bridges) have other
// classes.
func (f *Function) IsNIC() bool { return f.IsEthernet() || f.IsInfiniBand() }

// IsConnectX reports whether f is a Mellanox/NVIDIA NIC function (vendor
// 15b3: ConnectX, BlueField), the one family with the mlx5-only features:
// InfiniBand GUIDs, shared HCA pools, the mlx5 VF count change.
func (f *Function) IsConnectX() bool { return f.Vendor == VendorMellanox && f.IsNIC() }

// ErrNotFound is returned for a PCI address with no function under the root.
var ErrNotFound = errors.New("no such PCI function")

// ValidAddress reports whether s is a full PCI address DDDD:BB:DD.F in
// lower-case hex, the only form sysfs uses. It never touches the filesystem,
// so callers can check untrusted input before building a path from it.
func ValidAddress(s string) bool {
	// Device 00-1f, function 0-7; keyOf checks it as it reads it.
	_, ok := keyOf(s)
	return ok
}

// Scanner reads PCI functions under a root.
type Scanner struct {
	sys string
	// workers bounds the parallel reads of a scan.
	workers int
}

// New returns a Scanner reading <root>/sys. root "" means "/".
func New(root string) *Scanner {
	if root == "" {
		root = "/"
	}
	// sysfs reads block in the kernel often enough that two workers per
	// CPU keep the CPUs busy.
	return &Scanner{sys: filepath.Join(root, "sys"), workers: max(1, 2*runtime.GOMAXPROCS(0))}
}

func (s *Scanner) devicesDir() string { return filepath.Join(s.sys, "bus", "pci", "devices") }

// representorRE matches the phys_port_name of a switchdev representor of
// a VF or SF ("pf0vf3", "c1pf0vf3", "pf1sf7"); uplinks are "p0".
var representorRE = regexp.MustCompile(`^(c[0-9]+)?pf[0-9]+(vf|sf)[0-9]+$`)

// IsRepresentor reports whether a phys_port_name names a switchdev
// representor rather than an uplink or a plain netdev.
func IsRepresentor(physPortName string) bool { return representorRE.MatchString(physPortName) }

// upstream returns the bridges (nearest first) and the PCIe root (see
// Function.PCIeRoot) of a function whose directory is below parent, a
// path below <sys>/devices.
func upstream(sys, parent string) ([]string, string) {
	rel, ok := strings.CutPrefix(parent, sys+"/devices/")
	if !ok || rel == "" {
		return nil, ""
	}
	root, rest, _ := strings.Cut(rel, "/")
	var bridges []string
	for rest != "" {
		var elem string
		if i := strings.LastIndexByte(rest, '/'); i >= 0 {
			elem, rest = rest[i+1:], rest[:i]
		} else {
			elem, rest = rest, ""
		}
		if ValidAddress(elem) {
			bridges = append(bridges, elem)
		}
	}
	if !strings.HasPrefix(root, "pci") {
		root = ""
	}
	return bridges, root
}
