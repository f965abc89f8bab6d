package pci_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

func fixtureRoot(name string) string { return filepath.Join("..", "..", "testdata", "sysfs", name) }

func byAddr(t *testing.T, fns []pci.Function) map[string]pci.Function {
	t.Helper()
	m := map[string]pci.Function{}
	for _, f := range fns {
		m[f.Address] = f
	}
	return m
}

func TestScanDGX(t *testing.T) {
	fns, err := pci.New(fixtureRoot("dgx-h100")).Scan(nil)
	require.NoError(t, err)
	m := byAddr(t, fns)

	pf := m["0000:18:00.0"]
	require.Equal(t, "15b3", pf.Vendor)
	require.Equal(t, "1021", pf.Device)
	require.Equal(t, "0x020700", pf.Class)
	require.Equal(t, "mlx5_core", pf.Driver)
	require.Equal(t, 0, pf.NUMANode)
	require.True(t, pf.IsNIC())
	require.False(t, pf.IsVF())
	require.Equal(t, []string{"ibp24s0"}, pf.Netdevs)
	require.Equal(t, []string{"0000:17:00.0", "0000:16:00.0", "0000:15:01.0"}, pf.Bridges)
	require.Equal(t, "pci0000:15", pf.PCIeRoot)
	require.Equal(t, "", pf.PhysFn)

	vf := m["0000:18:00.3"]
	require.True(t, vf.IsVF())
	require.Equal(t, "0000:18:00.0", vf.PhysFn)
	require.Equal(t, 0, vf.NUMANode, "a VF is on its PF's node")
	require.Equal(t, "101e", vf.Device)
	require.Equal(t, []string{"ibp24s0v2"}, vf.Netdevs)
	require.Equal(t, pf.Bridges, vf.Bridges)

	gpu := m["0000:19:00.0"]
	require.Equal(t, "10de", gpu.Vendor)
	require.False(t, gpu.IsNIC())
	// The GPU shares the PCIe switch upstream port with rail 0's NIC.
	require.Equal(t, "0000:16:00.0", gpu.Bridges[1])

	nics, connectx := 0, 0
	for _, f := range fns {
		if f.IsNIC() {
			nics++
		}
		if f.IsConnectX() {
			connectx++
		}
	}
	require.Equal(t, 8+8*fixture.DGXVFsPerRail+4, connectx)
	// The two E810 ports of the management network are NICs too.
	require.Equal(t, connectx+2, nics)
	ice := m["0000:0c:00.0"]
	require.False(t, ice.IsConnectX())
	require.True(t, ice.IsNIC())

	rail7 := m["0000:dc:00.0"]
	require.Equal(t, 1, rail7.NUMANode)
}

func TestScanEdge(t *testing.T) {
	fns, err := pci.New(fixtureRoot("edge")).Scan(func(f *pci.Function) bool { return f.Vendor == pci.VendorMellanox })
	require.NoError(t, err)
	m := byAddr(t, fns)
	_, intel := m["0000:31:00.0"]
	require.False(t, intel, "vendor filter keeps only 15b3")

	pf := m["0000:86:00.0"]
	require.Equal(t, -1, pf.NUMANode)
	vfio := m["0000:86:00.1"]
	require.Equal(t, "vfio-pci", vfio.Driver)
	require.Equal(t, "71", vfio.IOMMUGroup)
	require.Empty(t, vfio.Netdevs)
	require.Equal(t, "0000:86:00.0", vfio.PhysFn)
	require.Equal(t, -1, vfio.NUMANode, "PF does not know either")
	unbound := m["0000:86:00.2"]
	require.Equal(t, "", unbound.Driver)
	require.Equal(t, "0000:86:00.0", unbound.PhysFn)

	sw := m["0000:af:00.0"]
	require.Equal(t, []string{"enp175s0f0np0"}, sw.Netdevs)
	require.Equal(t, []string{"eth4", "eth5"}, sw.Representors)

	bridge := m["0000:85:00.0"]
	require.Equal(t, "15b3", bridge.Vendor)
	require.False(t, bridge.IsNIC())
	bf := m["0000:03:00.0"]
	require.False(t, bf.IsNIC())
}

func TestFunction(t *testing.T) {
	s := pci.New(fixtureRoot("dgx-h100"))
	vf, err := s.Function("0000:40:00.4")
	require.NoError(t, err)
	require.Equal(t, "0000:40:00.0", vf.PhysFn)
	require.Equal(t, []string{"ibp64s0v3"}, vf.Netdevs)

	_, err = s.Function("0000:77:00.0")
	require.ErrorIs(t, err, pci.ErrNotFound)
	_, err = s.Function("../../etc")
	require.ErrorContains(t, err, "not a PCI address")
}

func TestVFInheritsPFNUMA(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 2, 2))
	vfDir := filepath.Join(root, "sys/bus/pci/devices", fixture.VFAddress(0x11, 1), "numa_node")
	require.NoError(t, os.WriteFile(vfDir, []byte("-1\n"), 0o644))
	s := pci.New(root)
	fns, err := s.Scan(nil)
	require.NoError(t, err)
	require.Equal(t, 1, byAddr(t, fns)[fixture.VFAddress(0x11, 1)].NUMANode)
	f, err := s.Function(fixture.VFAddress(0x11, 1))
	require.NoError(t, err)
	require.Equal(t, 1, f.NUMANode)
}

func TestValidAddress(t *testing.T) {
	for s, want := range map[string]bool{
		"0000:18:00.1": true, "0000:ff:1f.7": true, "0001:3b:00.0": true,
		"0000:18:00.8": false, "0000:18:20.0": false, "0000:18:00": false, "18:00.1": false,
		"0000:18:00.1\n": false, "0000:1G:00.1": false, "0000:18:00.1/..": false, "../../../..00": false,
		"0000:AB:00.1": false, "": false,
		"0000:18:10.0": true, "0000:18:1a.0": true, "0000:18:2a.0": false, "0000:18:a0.0": false, "0000:18:0f.8": false,
	} {
		require.Equal(t, want, pci.ValidAddress(s), s)
	}
	// Every device and function number: device 00-1f, function 0-7.
	for dev := range 256 {
		for fn := range 16 {
			s := fmt.Sprintf("0000:18:%02x.%x", dev, fn)
			require.Equal(t, dev <= 0x1f && fn <= 7, pci.ValidAddress(s), s)
		}
	}
}

func TestIsRepresentor(t *testing.T) {
	for s, want := range map[string]bool{
		"pf0vf3": true, "c1pf0vf3": true, "pf1sf7": true, "pf12vf127": true,
		"p0": false, "p1": false, "": false, "pf0": false, "pf0vf": false, "vf0": false, "cpf0vf1": false,
	} {
		require.Equal(t, want, pci.IsRepresentor(s), s)
	}
}

func TestScanErrors(t *testing.T) {
	_, err := pci.New(t.TempDir()).Scan(nil)
	require.ErrorContains(t, err, "list pci devices")

	// A bus link that escapes the root is refused, not followed.
	root := t.TempDir()
	dir := filepath.Join(root, "sys/bus/pci/devices")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.Symlink("../../../../../etc", filepath.Join(dir, "0000:01:00.0")))
	_, err = pci.New(root).Scan(nil)
	require.ErrorContains(t, err, "points outside")

	// Garbage in an ID file is an error naming the file.
	root = t.TempDir()
	require.NoError(t, fixture.Generate(root, 1, 0))
	dev := filepath.Join(root, "sys/bus/pci/devices/0000:10:00.0")
	require.NoError(t, os.WriteFile(filepath.Join(dev, "uevent"), []byte("PCI_ID=zz\n"), 0o644))
	fns, err := pci.New(root).Scan(nil)
	require.NoError(t, err, "a uevent without usable IDs falls back to the attributes")
	require.Equal(t, "1021", byAddr(t, fns)["0000:10:00.0"].Device)
	require.NoError(t, os.WriteFile(filepath.Join(dev, "vendor"), []byte("zzzz\n"), 0o644))
	_, err = pci.New(root).Scan(nil)
	require.ErrorContains(t, err, "vendor")
	require.ErrorContains(t, err, "zzzz")
}

func TestNamesFallBackToHex(t *testing.T) {
	t.Setenv("PCIDB_ENABLE_NETWORK_FETCH", "1")
	t.Setenv("HOME", t.TempDir())
	n := pci.LoadNames(t.TempDir())
	require.False(t, n.Loaded())
	require.Equal(t, "15b3:1021", n.Model("15b3", "1021"))
	var nilNames *pci.Names
	require.Equal(t, "15b3:101e", nilNames.Model("15b3", "101e"))
}

func TestNamesFromPCIIDs(t *testing.T) {
	root := t.TempDir()
	t.Setenv("HOME", t.TempDir())
	ids := "15b3  Mellanox Technologies\n\t1021  MT2910 Family [ConnectX-7]\n"
	require.NoError(t, os.MkdirAll(filepath.Join(root, "usr/share/misc"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "usr/share/misc/pci.ids"), []byte(ids), 0o644))
	n := pci.LoadNames(root)
	require.True(t, n.Loaded())
	require.Equal(t, "MT2910 Family [ConnectX-7]", n.Model("15b3", "1021"))
	require.Equal(t, "15b3:101e", n.Model("15b3", "101e"))
}

func TestScanVFItsPFDoesNotList(t *testing.T) {
	// VFs being disabled: the kernel removes the PF's virtfnN link first;
	// the VF's physfn still names its PF, and it is still on its PF's node.
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 2, 2))
	pf := fixture.PCIAddress(0, 0x11, 0, 0)
	require.NoError(t, os.Remove(filepath.Join(root, "sys/bus/pci/devices", pf, "virtfn1")))
	fns, err := pci.New(root).Scan(nil)
	require.NoError(t, err)
	m := byAddr(t, fns)
	vf := m[fixture.VFAddress(0x11, 1)]
	require.Equal(t, pf, vf.PhysFn, "physfn still names the PF")
	require.Equal(t, 1, vf.NUMANode)
	require.Equal(t, m[pf].Bridges, vf.Bridges)
}

// A VF whose PF is not in the scan (gone mid-scan) reads its own node.
func TestScanVFWithoutItsPF(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 2, 1))
	pf := fixture.PCIAddress(0, 0x11, 0, 0)
	require.NoError(t, os.Remove(filepath.Join(root, "sys/bus/pci/devices", pf)))
	fns, err := pci.New(root).Scan(nil)
	require.NoError(t, err)
	m := byAddr(t, fns)
	require.NotContains(t, m, pf)
	require.Equal(t, 1, m[fixture.VFAddress(0x11, 0)].NUMANode)
}

func TestScanVFPhysfnGarbage(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 1, 1))
	physfn := filepath.Join(root, "sys/bus/pci/devices", fixture.VFAddress(0x10, 0), "physfn")
	require.NoError(t, os.Remove(physfn))
	require.NoError(t, os.Symlink("../not-a-function", physfn))
	_, err := pci.New(root).Scan(nil)
	require.ErrorContains(t, err, "physfn")
	require.ErrorContains(t, err, "not-a-function")
}

// The IOMMU group is a number: a /dev/vfio path is built from it.
func TestIOMMUGroupIsANumber(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Write(root, "edge"))
	vfio := "0000:86:00.1"
	link := filepath.Join(root, "sys/bus/pci/devices", vfio, "iommu_group")
	for target, want := range map[string]string{
		"../../../../../kernel/iommu_groups/71": "71",
		"iommu_group":                           "",
		"../../../../../kernel/iommu_groups/..": "",
		"../../../../../kernel/iommu_groups/7a": "",
	} {
		require.NoError(t, os.Remove(link))
		require.NoError(t, os.Symlink(target, link))
		fns, err := pci.New(root).Scan(nil)
		require.NoError(t, err)
		require.Equal(t, want, byAddr(t, fns)[vfio].IOMMUGroup, target)
		f, err := pci.New(root).Function(vfio)
		require.NoError(t, err)
		require.Equal(t, want, f.IOMMUGroup, target)
	}
}

// A function with a netdev is found where its netdev's class link says,
// as the kernel makes that link: the scan does not read its bus link too.
func TestScanDirFromNetdevLink(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 1, 1))
	vf := fixture.VFAddress(0x10, 0)
	fns, err := pci.New(root).Scan(nil)
	require.NoError(t, err)
	want := byAddr(t, fns)[vf]
	require.NotEmpty(t, want.Netdevs)

	bus := filepath.Join(root, "sys/bus/pci/devices", vf)
	require.NoError(t, os.Remove(bus))
	require.NoError(t, os.Symlink(vf, bus)) // a loop: no directory through it
	fns, err = pci.New(root).Scan(nil)
	require.NoError(t, err)
	got := byAddr(t, fns)[vf]
	require.Equal(t, want.SysfsPath, got.SysfsPath)
	require.Equal(t, want.Bridges, got.Bridges)
	require.Equal(t, want.PCIeRoot, got.PCIeRoot)
	require.Equal(t, want.Netdevs, got.Netdevs)
	_, err = pci.New(root).Function(vf)
	require.Error(t, err, "a lookup of the one function goes by its bus link")

	// A netdev link that leaves <sys>/devices is not taken: the bus link
	// (a loop here) is, and the function is an error of the scan.
	link := filepath.Join(root, "sys/class/net", want.Netdevs[0])
	target, err := os.Readlink(link)
	require.NoError(t, err)
	require.NoError(t, os.Remove(link))
	require.NoError(t, os.Symlink("../../../outside/"+target[len("../../"):], link))
	_, err = pci.New(root).Scan(nil)
	require.Error(t, err)
}

// A scan lists the bus in address order, whatever order the directory
// lists it in, without its entries that are no PCI address; a buffer
// scanning again sees functions come and go.
func TestScanBusOrder(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 4, 8))
	bus := filepath.Join(root, "sys/bus/pci/devices")
	require.NoError(t, os.WriteFile(filepath.Join(bus, "not-a-function"), nil, 0o644))
	require.NoError(t, os.Symlink("../../../devices/pci0000:00/0000:18:00.8", filepath.Join(bus, "0000:18:00.8")))
	var want []string
	entries, err := os.ReadDir(bus)
	require.NoError(t, err)
	for _, e := range entries {
		if pci.ValidAddress(e.Name()) {
			want = append(want, e.Name())
		}
	}
	slices.Sort(want)
	addrs := func(fns []pci.Function) []string {
		var out []string
		for _, f := range fns {
			out = append(out, f.Address)
		}
		return out
	}
	s := pci.New(root)
	var buf pci.ScanBuffer[struct{}]
	for range 2 { // the second: an unchanged listing
		fns, _, err := pci.ScanInto(s, nil, nil, &buf)
		require.NoError(t, err)
		require.Equal(t, want, addrs(fns))
	}
	vf := fixture.VFAddress(0x11, 3)
	link, err := os.Readlink(filepath.Join(bus, vf))
	require.NoError(t, err)
	require.NoError(t, os.Remove(filepath.Join(bus, vf)))
	fns, _, err := pci.ScanInto(s, nil, nil, &buf)
	require.NoError(t, err)
	require.Equal(t, slices.DeleteFunc(slices.Clone(want), func(a string) bool { return a == vf }), addrs(fns))
	require.NoError(t, os.Symlink(link, filepath.Join(bus, vf)))
	fns, _, err = pci.ScanInto(s, nil, nil, &buf)
	require.NoError(t, err)
	require.Equal(t, want, addrs(fns))
}
