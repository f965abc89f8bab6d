package nic_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func root(name string) string { return filepath.Join("..", "..", "testdata", "sysfs", name) }

func scan(t *testing.T, name string) *nic.Snapshot {
	t.Helper()
	snap, err := nic.NewScanner(root(name)).Scan()
	require.NoError(t, err)
	return snap
}

func dev(t *testing.T, s *nic.Snapshot, addr string) nic.Device {
	t.Helper()
	d, ok := s.Device(addr)
	require.True(t, ok, "no device %s", addr)
	return *d
}

// chars are the char devices of one RDMA device with one port.
func chars(uverbs, umad int) []rdma.CharDevice {
	return []rdma.CharDevice{
		{Kind: "uverbs", Name: fmt.Sprintf("uverbs%d", uverbs), Path: fmt.Sprintf("/dev/infiniband/uverbs%d", uverbs)},
		{Kind: "umad", Name: fmt.Sprintf("umad%d", umad), Path: fmt.Sprintf("/dev/infiniband/umad%d", umad), Port: 1},
		{Kind: "issm", Name: fmt.Sprintf("issm%d", umad), Path: fmt.Sprintf("/dev/infiniband/issm%d", umad), Port: 1},
	}
}

func TestScanDGX(t *testing.T) {
	s := scan(t, "dgx-h100")
	require.Len(t, s.Devices, 2+8+32+4)
	require.Empty(t, s.Warnings)
	require.Equal(t, "/dev/infiniband/rdma_cm", s.RDMACM)

	require.Equal(t, nic.Device{
		PCIAddress: "0000:18:00.1", Vendor: "15b3", DeviceID: "101e", Class: "0x020700", Model: "15b3:101e",
		Driver: "mlx5_core", NUMANode: 0, PFAddress: "0000:18:00.0", VFIndex: 0,
		Netdev: "ibp24s0v0", PFNetdev: "ibp24s0", LinkType: "InfiniBand", RDMADevice: "mlx5_12",
		CharDevices:     chars(14, 12),
		UpstreamBridges: []string{"0000:17:00.0", "0000:16:00.0", "0000:15:01.0"}, PCIeRoot: "pci0000:15",
	}, dev(t, s, "0000:18:00.1"))

	pf := dev(t, s, "0000:dc:00.0")
	require.Equal(t, "", pf.PFAddress)
	require.Equal(t, -1, pf.VFIndex)
	require.Equal(t, "mlx5_7", pf.RDMADevice)
	require.Equal(t, "ibp220s0", pf.Netdev)
	require.Equal(t, 1, pf.NUMANode)
	require.Equal(t, chars(9, 7), pf.CharDevices)
	require.Equal(t, []string{"/dev/infiniband/uverbs9", "/dev/infiniband/umad7", "/dev/infiniband/issm7"}, pf.CharDevicePaths())

	last := dev(t, s, "0000:dc:00.4")
	require.Equal(t, "mlx5_43", last.RDMADevice)
	require.Equal(t, 3, last.VFIndex)
	require.Equal(t, "/dev/infiniband/uverbs45", last.CharDevices[0].Path)

	storage := dev(t, s, "0000:aa:00.1")
	require.Equal(t, "Ethernet", storage.LinkType)
	require.Equal(t, "enp170s0f1np1", storage.Netdev)
	require.Equal(t, 8, storage.TotalVFs)
	require.Equal(t, 0, storage.NumVFs)
	// The E810's ports are served for their irdma devices, which 6.12
	// parents on the PCI functions; they have no SR-IOV here.
	for i, d := range s.Devices[:2] {
		require.Equal(t, fmt.Sprintf("0000:0c:00.%d", i), d.PCIAddress)
		require.Equal(t, "8086", d.Vendor)
		require.Equal(t, "ice", d.Driver)
		require.Equal(t, fmt.Sprintf("irdma%d", i), d.RDMADevice)
		require.Equal(t, []rdma.CharDevice{{Kind: "uverbs", Name: fmt.Sprintf("uverbs%d", i), Path: fmt.Sprintf("/dev/infiniband/uverbs%d", i)}}, d.CharDevices)
		require.Zero(t, d.TotalVFs)
	}
	for _, d := range s.Devices[2:] {
		require.Equal(t, "15b3", d.Vendor, d.PCIAddress)
	}
}

func TestScanEdge(t *testing.T) {
	s := scan(t, "edge")
	addrs := []string{}
	for _, d := range s.Devices {
		addrs = append(addrs, d.PCIAddress)
	}
	// The 15b3 bridge and BlueField management function are not NICs; the
	// Intel E810 is served for its irdma device.
	require.Equal(t, []string{"0000:31:00.0", "0000:86:00.0", "0000:86:00.1", "0000:86:00.2", "0000:86:00.3", "0000:86:00.4",
		"0000:af:00.0", "0000:af:00.1", "0000:af:00.2", "0000:af:00.3"}, addrs)

	vfio := dev(t, s, "0000:86:00.1")
	require.True(t, vfio.IsVFIO())
	require.Equal(t, []string{"/dev/vfio/vfio", "/dev/vfio/71"}, vfio.VFIODevices)
	require.Empty(t, vfio.Netdev)
	require.Empty(t, vfio.RDMADevice)
	require.Equal(t, "ibp134s0", vfio.PFNetdev)
	require.Equal(t, -1, vfio.NUMANode)

	unbound := dev(t, s, "0000:86:00.2")
	require.Empty(t, unbound.Driver)
	require.Empty(t, unbound.CharDevices)

	noRDMA := dev(t, s, "0000:86:00.4")
	require.Equal(t, "ibp134s0v3", noRDMA.Netdev)
	require.Empty(t, noRDMA.RDMADevice)
	require.Equal(t, "InfiniBand", noRDMA.LinkType, "from its PCI class, 0x020700")
	require.Equal(t, "InfiniBand", vfio.LinkType, "from its PCI class, 0x020700")
	require.Equal(t, "InfiniBand", unbound.LinkType, "from its PCI class, 0x020700")

	sw := dev(t, s, "0000:af:00.0")
	require.Equal(t, "enp175s0f0np0", sw.Netdev, "representors are not the PF's netdev")
	require.Equal(t, "mlx5_1", sw.RDMADevice)

	require.Contains(t, s.Warnings, "0000:86:00.2: no driver bound")
	require.Contains(t, s.Warnings, "0000:86:00.4: no RDMA device (is mlx5_ib loaded?)")
}

func TestDeviceOne(t *testing.T) {
	sc := nic.NewScanner(root("roce-cx6dx"))
	d, err := sc.Device("0000:3b:01.3")
	require.NoError(t, err)
	require.Equal(t, "0000:3b:00.1", d.PFAddress)
	require.Equal(t, 1, d.VFIndex)
	require.Equal(t, "ens1f1v1", d.Netdev)
	require.Equal(t, "ens1f1np1", d.PFNetdev)
	require.Equal(t, "Ethernet", d.LinkType)
	require.Equal(t, "mlx5_7", d.RDMADevice)

	_, err = sc.Device("0000:3a:00.0")
	require.ErrorContains(t, err, "8086:347a class 0x060400 is not a network function")
	_, err = sc.Device("0000:3b:00.1/../..")
	require.ErrorContains(t, err, "not a PCI address")
}

// rdma_cm is the node's, on the snapshot, not in any device's list; a node
// without it says so once.
func TestRDMACMOnSnapshot(t *testing.T) {
	r := t.TempDir()
	require.NoError(t, fixture.Generate(r, 1, 2))
	s, err := nic.NewScanner(r).Scan()
	require.NoError(t, err)
	require.Equal(t, rdma.RDMACMPath, s.RDMACM)
	for _, d := range s.Devices {
		require.NotEmpty(t, d.CharDevices, d.PCIAddress)
		for _, c := range d.CharDevices {
			require.NotEqual(t, "rdma_cm", c.Name, d.PCIAddress)
		}
	}
	require.Empty(t, s.Warnings)

	require.NoError(t, os.Remove(filepath.Join(r, "dev", "infiniband", "rdma_cm")))
	s, err = nic.NewScanner(r).Scan()
	require.NoError(t, err)
	require.Empty(t, s.RDMACM)
	require.Equal(t, []string{"/dev/infiniband/rdma_cm missing (is rdma_ucm loaded?)"}, s.Warnings)
	require.Len(t, s.Devices[0].CharDevices, 3, "the devices' own char devices are still there")
}

// The PF↔VF relation: a PF's counts, each VF's index under it, and a VF
// its PF no longer lists (VFs being disabled) kept with a warning, in a
// node scan and in a single lookup alike.
func TestVFIndexes(t *testing.T) {
	r := t.TempDir()
	require.NoError(t, fixture.Generate(r, 1, 3))
	pf, vf1, vf2 := fixture.PCIAddress(0, 0x10, 0, 0), fixture.VFAddress(0x10, 1), fixture.VFAddress(0x10, 2)
	sc := nic.NewScanner(r)
	check := func(want1 int) {
		t.Helper()
		s, err := sc.Scan()
		require.NoError(t, err)
		p := dev(t, s, pf)
		require.Equal(t, 3, p.TotalVFs)
		require.Equal(t, 3, p.NumVFs)
		require.Equal(t, -1, p.VFIndex)
		require.Equal(t, want1, dev(t, s, vf1).VFIndex)
		one, err := sc.Device(vf1)
		require.NoError(t, err)
		require.Equal(t, want1, one.VFIndex)
		one, err = sc.Device(pf)
		require.NoError(t, err)
		require.Equal(t, 3, one.TotalVFs)
		if want1 < 0 {
			require.Contains(t, s.Warnings, vf1+": its PF "+pf+" does not list it among its virtfnN links (VFs being changed?); no VF index")
			require.Equal(t, -1, dev(t, s, vf2).VFIndex, "nothing after the gap is indexed")
		} else {
			require.Empty(t, s.Warnings)
			require.Equal(t, 2, dev(t, s, vf2).VFIndex)
		}
	}
	check(1)
	require.NoError(t, os.Remove(filepath.Join(r, "sys/bus/pci/devices", pf, "virtfn1")))
	check(-1)
}

// A PF whose virtfnN links do not name its VFs in address order (the
// scan's join tries the next VF in order first): each VF still gets the
// N of the link that names it.
func TestVFIndexesOutOfAddressOrder(t *testing.T) {
	r := t.TempDir()
	require.NoError(t, fixture.Generate(r, 1, 3))
	pf := fixture.PCIAddress(0, 0x10, 0, 0)
	dir := filepath.Join(r, "sys/bus/pci/devices", pf)
	link0, err := os.Readlink(filepath.Join(dir, "virtfn0"))
	require.NoError(t, err)
	link2, err := os.Readlink(filepath.Join(dir, "virtfn2"))
	require.NoError(t, err)
	for n, target := range map[string]string{"virtfn0": link2, "virtfn2": link0} {
		require.NoError(t, os.Remove(filepath.Join(dir, n)))
		require.NoError(t, os.Symlink(target, filepath.Join(dir, n)))
	}
	sc := nic.NewScanner(r)
	s, err := sc.Scan()
	require.NoError(t, err)
	require.Empty(t, s.Warnings)
	for vf, want := range []int{2, 1, 0} {
		addr := fixture.VFAddress(0x10, vf)
		require.Equal(t, want, dev(t, s, addr).VFIndex, addr)
		one, err := sc.Device(addr)
		require.NoError(t, err)
		require.Equal(t, want, one.VFIndex, addr)
	}
}

// A VF whose PF the scan does not find (its bus entry gone mid-change) is
// listed with a warning that names the PF.
func TestVFWithoutItsPF(t *testing.T) {
	r := t.TempDir()
	require.NoError(t, fixture.Generate(r, 1, 1))
	pf, vf := fixture.PCIAddress(0, 0x10, 0, 0), fixture.VFAddress(0x10, 0)
	require.NoError(t, os.Remove(filepath.Join(r, "sys/bus/pci/devices", pf)))
	s, err := nic.NewScanner(r).Scan()
	require.NoError(t, err)
	require.Len(t, s.Devices, 1)
	d := dev(t, s, vf)
	require.Equal(t, pf, d.PFAddress)
	require.Equal(t, -1, d.VFIndex)
	require.Empty(t, d.PFNetdev)
	require.Equal(t, []string{vf + ": its PF " + pf + " is not among the NIC functions found (being removed or reset?); no VF index"}, s.Warnings)
}

// Without an RDMA device (vfio-pci, unbound, mlx5_ib not loaded) the link
// type is what the PCI class says; with one, its port's link layer.
func TestLinkTypeFromClass(t *testing.T) {
	r := t.TempDir()
	b, err := fixture.NewBuilder(r)
	require.NoError(t, err)
	parent, err := b.Bridge("pci0000:00", "0000:00:01.0", "8086", "347a", 0)
	require.NoError(t, err)
	vf := func(addr, class, driver string, group int) fixture.Function {
		return fixture.Function{Address: addr, Vendor: "15b3", Device: "101e", Class: class, Driver: driver, IOMMUGroup: group}
	}
	for _, pf := range []fixture.Function{
		{Address: "0000:01:00.0", Vendor: "15b3", Device: "101d", Class: "0x020000", Driver: "mlx5_core", IOMMUGroup: 10,
			Parent: parent, TotalVFs: 4, Netdevs: []fixture.Netdev{{Name: "eth0", MAC: fixture.MAC(1, 0)}},
			RDMA: []fixture.RDMADevice{{Name: "mlx5_0", LinkLayer: "Ethernet", Uverbs: 0, Umad: 0, NodeGUID: fixture.GUID(1, 0)}},
			VFs:  []fixture.Function{vf("0000:01:00.1", "0x020000", "vfio-pci", 11), vf("0000:01:00.2", "0x020000", "", 12)}},
		{Address: "0000:01:00.3", Vendor: "15b3", Device: "1021", Class: "0x020700", Driver: "mlx5_core", IOMMUGroup: 13,
			Parent: parent, TotalVFs: 4, Netdevs: []fixture.Netdev{{Name: "ib0", MAC: fixture.MAC(1, 3), Type: 32}},
			VFs: []fixture.Function{vf("0000:01:00.4", "0x020700", "vfio-pci", 14)}},
	} {
		require.NoError(t, b.Add(pf))
	}
	s, err := nic.NewScanner(r).Scan()
	require.NoError(t, err)
	for addr, want := range map[string]string{
		"0000:01:00.0": "Ethernet",   // its RDMA device's port
		"0000:01:00.1": "Ethernet",   // vfio-pci, class 0x020000
		"0000:01:00.2": "Ethernet",   // unbound
		"0000:01:00.3": "InfiniBand", // mlx5_core without an RDMA device
		"0000:01:00.4": "InfiniBand", // vfio-pci, class 0x020700
	} {
		require.Equal(t, want, dev(t, s, addr).LinkType, addr)
		one, err := nic.NewScanner(r).Device(addr)
		require.NoError(t, err)
		require.Equal(t, want, one.LinkType, addr)
	}
}

// A node with NICs of three vendors: discovery serves every SR-IOV PF and
// VF whatever its vendor, leaves out a NIC without SR-IOV or RDMA (the
// node's management port), and says once per PF, not once per VF, that
// ConnectX functions lack their RDMA devices.
func TestScanAnyVendor(t *testing.T) {
	root := t.TempDir()
	b, err := fixture.NewBuilder(root)
	require.NoError(t, err)
	vfs := func(vendor, device, driver string, bus, n int) []fixture.Function {
		var out []fixture.Function
		for i := range n {
			out = append(out, fixture.Function{Address: fixture.PCIAddress(0, bus, 0x10, 2*i), Vendor: vendor, Device: device,
				Class: "0x020000", Driver: driver, IOMMUGroup: 40 + bus + i,
				Netdevs: []fixture.Netdev{{Name: fmt.Sprintf("eth%d", bus*8+i), MAC: fixture.MAC(bus, i)}}})
		}
		return out
	}
	// igb's 82576: VFs at devfn 10.0, 10.2, ... (sriov_offset 0x80, stride 2).
	require.NoError(t, b.Add(fixture.Function{Address: "0000:01:00.0", Vendor: "8086", Device: "10c9", Class: "0x020000",
		Driver: "igb", Parent: "pci0000:00", IOMMUGroup: 10, TotalVFs: 7, SRIOVOffset: 0x80, SRIOVStride: 2,
		Netdevs: []fixture.Netdev{{Name: "enp1s0", MAC: fixture.MAC(1, 0)}},
		VFs:     vfs("8086", "10ca", "igbvf", 1, 2)}))
	// A management port: an Intel NIC without SR-IOV or RDMA.
	require.NoError(t, b.Add(fixture.Function{Address: "0000:02:00.0", Vendor: "8086", Device: "15b8", Class: "0x020000",
		Driver: "e1000e", Parent: "pci0000:00", IOMMUGroup: 11, Netdevs: []fixture.Netdev{{Name: "eno1", MAC: fixture.MAC(2, 0)}}}))
	// A ConnectX PF and two VFs without mlx5_ib.
	require.NoError(t, b.Add(fixture.Function{Address: "0000:03:00.0", Vendor: "15b3", Device: "101d", Class: "0x020000",
		Driver: "mlx5_core", Parent: "pci0000:00", IOMMUGroup: 12, TotalVFs: 8, SRIOVOffset: 0x80, SRIOVStride: 2,
		Netdevs: []fixture.Netdev{{Name: "enp3s0f0np0", MAC: fixture.MAC(3, 0)}},
		VFs:     vfs("15b3", "101e", "mlx5_core", 3, 2)}))

	s, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	var addrs []string
	for _, d := range s.Devices {
		addrs = append(addrs, d.PCIAddress)
	}
	require.Equal(t, []string{"0000:01:00.0", "0000:01:10.0", "0000:01:10.2", "0000:03:00.0", "0000:03:10.0", "0000:03:10.2"}, addrs,
		"the SR-IOV PFs and VFs of both vendors, not the management port")
	vf := dev(t, s, "0000:01:10.2")
	require.Equal(t, "8086", vf.Vendor)
	require.Equal(t, "igbvf", vf.Driver)
	require.Equal(t, "0000:01:00.0", vf.PFAddress)
	require.Equal(t, 1, vf.VFIndex)
	require.Equal(t, "eth9", vf.Netdev)
	require.Equal(t, "enp1s0", vf.PFNetdev)
	require.Equal(t, "Ethernet", vf.LinkType)
	require.Empty(t, vf.RDMADevice)
	require.Equal(t, 7, dev(t, s, "0000:01:00.0").TotalVFs)
	require.Equal(t, []string{
		"0000:03:00.0: 3 functions of this PF have no RDMA device (0000:03:00.0, 0000:03:10.0, 0000:03:10.2): is mlx5_ib loaded?",
	}, s.Warnings, "igb functions have no RDMA and need none; the ConnectX ones get one warning")

	d, err := nic.NewScanner(root).Device("0000:01:10.0")
	require.NoError(t, err)
	require.Equal(t, "igbvf", d.Driver)
	require.Equal(t, 0, d.VFIndex)
}

// The vendor hosts: E810 (ice, iavf, irdma) and Broadcom (bnxt_en,
// bnxt_re) laid out from the kernel sources, and igb/igbvf captured from
// a real Linux 6.12 guest (make e2e-kernel; testdata/sysfs-captured).
func TestScanVendorHosts(t *testing.T) {
	for _, tc := range []struct {
		root  string
		addr  string // one function to check whole
		want  nic.Device
		count int
	}{
		{root("e810-irdma"), "0000:3b:00.1", nic.Device{PCIAddress: "0000:3b:00.1", Vendor: "8086", DeviceID: "159b",
			Driver: "ice", Netdev: "enp59s0f1np1", RDMADevice: "irdma1", TotalVFs: 128, VFIndex: -1}, 6},
		{root("e810-irdma"), "0000:3b:01.2", nic.Device{PCIAddress: "0000:3b:01.2", Vendor: "8086", DeviceID: "1889",
			Driver: "iavf", Netdev: "enp59s0f0v2", PFAddress: "0000:3b:00.0", VFIndex: 2}, 6},
		{root("bnxt-re"), "0000:41:00.3", nic.Device{PCIAddress: "0000:41:00.3", Vendor: "14e4", DeviceID: "1806",
			Driver: "bnxt_en", Netdev: "enp65s0f0v1", PFAddress: "0000:41:00.0", VFIndex: 1, RDMADevice: "bnxt_re3"}, 8},
		{filepath.Join("..", "..", "testdata", "sysfs-captured", "igb-qemu"), "0000:02:10.2", nic.Device{PCIAddress: "0000:02:10.2",
			Vendor: "8086", DeviceID: "10ca", Driver: "vfio-pci", PFAddress: "0000:02:00.0", VFIndex: 1}, 8},
	} {
		t.Run(filepath.Base(tc.root)+"/"+tc.addr, func(t *testing.T) {
			s, err := nic.NewScanner(tc.root).Scan()
			require.NoError(t, err)
			require.Len(t, s.Devices, tc.count)
			require.Empty(t, s.Warnings, "nothing is missing that these drivers give")
			d := dev(t, s, tc.addr)
			got := nic.Device{PCIAddress: d.PCIAddress, Vendor: d.Vendor, DeviceID: d.DeviceID, Driver: d.Driver, Netdev: d.Netdev,
				PFAddress: d.PFAddress, VFIndex: d.VFIndex, RDMADevice: d.RDMADevice, TotalVFs: d.TotalVFs}
			require.Equal(t, tc.want, got)
			if d.RDMADevice != "" {
				require.Equal(t, "/dev/infiniband/uverbs"+strings.TrimLeft(d.RDMADevice, "abcdefghijklmnopqrstuvwxyz_"), d.CharDevices[0].Path)
			}
			if d.Driver == "vfio-pci" {
				require.Equal(t, []string{"/dev/vfio/vfio", "/dev/vfio/" + d.IOMMUGroup}, d.VFIODevices)
			}
		})
	}
}
