package nic_test

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// corruptHosts are the hosts the corruption tests damage: a generated one
// (one PF, two VFs) and the edge fixture (vfio-pci, unbound and RDMA-less
// VFs, switchdev representors, a bridge and a BlueField function of the
// same vendor, another vendor's RDMA NIC).
var corruptHosts = []struct {
	name  string
	write func(root string) error
}{
	{"generated", func(root string) error { return fixture.Generate(root, 1, 2) }},
	{"edge", func(root string) error { return fixture.Write(root, "edge") }},
}

// hosts holds, made once per test process, an untouched copy of each
// corrupt host and a working copy that one corruption at a time damages
// and restore repairs.
var hosts struct {
	once  sync.Once
	dir   string
	err   error
	paths [][]string // per host, every entry below sys/, relative to the host root, sorted
	// per host, a Scanner of the working copy that has scanned it before
	// each corruption: its rescans reuse the memory of the last scan
	rescanners []*nic.Scanner
	mu         sync.Mutex // guards the working copies
}

func pristineRoot(h int) string { return filepath.Join(hosts.dir, "pristine", corruptHosts[h].name) }
func workingRoot(h int) string  { return filepath.Join(hosts.dir, "work", corruptHosts[h].name) }

func setUpHosts(t testing.TB) {
	hosts.once.Do(func() {
		hosts.dir, hosts.err = os.MkdirTemp("", "fastpath-corrupt-")
		for h, host := range corruptHosts {
			if hosts.err != nil {
				return
			}
			if hosts.err = host.write(pristineRoot(h)); hosts.err != nil {
				return
			}
			if hosts.err = host.write(workingRoot(h)); hosts.err != nil {
				return
			}
			var paths []string
			hosts.err = filepath.WalkDir(filepath.Join(pristineRoot(h), "sys"), func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				rel, _ := filepath.Rel(pristineRoot(h), p)
				if rel != "sys" {
					paths = append(paths, rel)
				}
				return nil
			})
			sort.Strings(paths)
			hosts.paths = append(hosts.paths, paths)
			hosts.rescanners = append(hosts.rescanners, nic.NewScanner(workingRoot(h)))
		}
	})
	require.NoError(t, hosts.err)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if hosts.dir != "" {
		os.RemoveAll(hosts.dir)
	}
	os.Exit(code)
}

// copyTree copies the entry src (a file, a symlink or a whole directory)
// to dst, symlinks as symlinks.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		to := filepath.Join(dst, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			return os.Symlink(target, to)
		case d.IsDir():
			return os.MkdirAll(to, 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(to, b, 0o644)
	})
}

// corrupt damages the entry rel below root: 0 garbage content, 1 gone, 2 a
// symlink to itself, 3 a directory where it was, 4 a symlink out of the
// root to the same path (for a link, to where it pointed) below
// <root>/../outside, with the tail the scan looks for.
func corrupt(root, rel string, action uint8, content []byte) {
	target := filepath.Join(root, rel)
	out := rel
	if t, err := os.Readlink(target); err == nil {
		out, _ = filepath.Rel(root, filepath.Join(filepath.Dir(target), t))
	}
	_ = os.RemoveAll(target)
	switch action % 5 {
	case 0:
		_ = os.WriteFile(target, content, 0o644)
	case 2:
		_ = os.Symlink(filepath.Base(target), target)
	case 3:
		_ = os.MkdirAll(filepath.Join(target, string(content)), 0o755)
	case 4:
		up := strings.Repeat("../", strings.Count(rel, "/")+1)
		_ = os.Symlink(up+"outside/"+out, target)
	}
}

// scanCorrupted damages one entry of host h's working copy, scans it,
// checks what a scan promises whatever sysfs holds, and repairs the copy.
func scanCorrupted(t *testing.T, h int, which int, action uint8, content []byte) {
	setUpHosts(t)
	hosts.mu.Lock()
	defer hosts.mu.Unlock()
	root := workingRoot(h)
	rel := hosts.paths[h][which%len(hosts.paths[h])]
	corrupt(root, rel, action, content)
	defer func() {
		require.NoError(t, os.RemoveAll(filepath.Join(root, rel)))
		require.NoError(t, copyTree(filepath.Join(pristineRoot(h), rel), filepath.Join(root, rel)))
	}()
	sc := nic.NewScanner(root)
	snap, err := sc.Scan()
	// A Scanner that scanned the host intact (and each damaged state
	// before) finds what a new one finds.
	re, reErr := hosts.rescanners[h].Scan()
	if err != nil {
		require.Error(t, reErr, "a rescan of what a new Scanner refuses (%v)", err)
		return // an error that names the problem is a fine answer
	}
	require.NoError(t, reErr, "a rescan of what a new Scanner reads")
	require.Equal(t, snap, re, "a rescan")
	checkSnapshot(t, root, snap)
	for _, d := range snap.Devices {
		one, err := sc.Device(d.PCIAddress)
		if err != nil {
			continue
		}
		require.Equal(t, d.PCIAddress, one.PCIAddress)
		require.Equal(t, d.PFAddress, one.PFAddress, "%s: the same physfn", d.PCIAddress)
		require.Equal(t, d.Driver, one.Driver, d.PCIAddress)
	}
}

// FuzzScanCorruptedSysfs damages one entry of a small host — garbage
// contents, a missing file, a symlink loop, a directory where a file
// should be — and scans it. Errors are fine; panics, hangs and a snapshot
// that breaks checkSnapshot's invariants are not.
func FuzzScanCorruptedSysfs(f *testing.F) {
	f.Add(uint8(0), uint16(0), uint8(0), []byte("0x15b3"))
	f.Add(uint8(0), uint16(7), uint8(1), []byte(""))
	f.Add(uint8(0), uint16(30), uint8(2), []byte("x"))
	f.Add(uint8(0), uint16(55), uint8(3), []byte("\x00\xff\n"))
	f.Add(uint8(0), uint16(80), uint8(0), []byte("PCI_ID=15B3:\nPCI_CLASS=zz"))
	f.Add(uint8(0), uint16(12), uint8(0), []byte("-99999999999999999999"))
	f.Add(uint8(1), uint16(300), uint8(0), []byte("../../../../../.."))
	f.Add(uint8(1), uint16(500), uint8(2), []byte(""))
	f.Add(uint8(0), uint16(290), uint8(4), []byte(""))
	f.Fuzz(func(t *testing.T, host uint8, which uint16, action uint8, content []byte) {
		scanCorrupted(t, int(host)%len(corruptHosts), int(which), action, content)
	})
}

// TestScanCorruptedEveryEntry damages every entry of both hosts once, the
// five kinds of damage in turn, and checks the invariants after each scan.
func TestScanCorruptedEveryEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("a scan per sysfs entry of two hosts; -short skips it")
	}
	setUpHosts(t)
	contents := [][]byte{[]byte("garbage\n"), nil, nil, []byte("x"), nil}
	for h := range corruptHosts {
		for i, rel := range hosts.paths[h] {
			action := uint8(i % len(contents))
			t.Run(fmt.Sprintf("%s/%d/%s", corruptHosts[h].name, action, rel), func(t *testing.T) {
				scanCorrupted(t, h, i, action, contents[action])
			})
		}
	}
}

// TestScanClassLinksOutOfRoot points each class entry a scan reads
// (net, infiniband, infiniband_verbs, infiniband_mad) out of the root, to
// a path with the tail that names the function: nothing is taken from it.
func TestScanClassLinksOutOfRoot(t *testing.T) {
	setUpHosts(t)
	n := 0
	for h := range corruptHosts {
		for i, rel := range hosts.paths[h] {
			class, name, ok := strings.Cut(strings.TrimPrefix(rel, "sys/class/"), "/")
			if !ok || rel == "sys/class/"+class || strings.Contains(name, "/") ||
				class != "net" && !strings.HasPrefix(class, "infiniband") {
				continue
			}
			n++
			t.Run(corruptHosts[h].name+"/"+rel, func(t *testing.T) { scanCorrupted(t, h, i, 4, nil) })
		}
	}
	require.Greater(t, n, 20)
}

// checkSnapshot asserts what a scan promises whatever sysfs holds:
// devices sorted and unique, Mellanox NIC functions only; every VF's PF in
// the snapshot or a warning about it; every host path a clean path below
// /dev/infiniband or /dev/vfio whose node exists under root; every netdev,
// RDMA device and char device of a device tied to that device's PCI
// function by sysfs links that stay inside <root>/sys/devices.
func checkSnapshot(t *testing.T, root string, snap *nic.Snapshot) {
	t.Helper()
	devices := filepath.Join(root, "sys", "devices") + string(filepath.Separator)
	// inside resolves the link at path lexically, as the kernel would
	// from its directory; "" when it is no link or leaves <root>/sys/devices.
	inside := func(path string) string {
		target, err := os.Readlink(path)
		if err != nil {
			return ""
		}
		p := filepath.Join(filepath.Dir(path), target)
		if !strings.HasPrefix(p, devices) {
			return ""
		}
		return p
	}
	hostPath := func(p, dir string) {
		require.True(t, strings.HasPrefix(p, dir+"/") && filepath.Clean(p) == p && !strings.Contains(p[len(dir)+1:], "/"),
			"%q is not a device node in %s", p, dir)
		_, err := os.Lstat(filepath.Join(root, p))
		require.NoError(t, err, "%s is not under the host root", p)
	}
	warned := func(addr, about string) bool {
		for _, w := range snap.Warnings {
			if strings.HasPrefix(w, addr+": ") && strings.Contains(w, about) {
				return true
			}
		}
		return false
	}
	if snap.RDMACM != "" {
		require.Equal(t, rdma.RDMACMPath, snap.RDMACM)
		hostPath(snap.RDMACM, rdma.DevDir)
	}
	prev := ""
	for i := range snap.Devices {
		d := &snap.Devices[i]
		a := d.PCIAddress
		require.True(t, pci.ValidAddress(a), "%q", a)
		require.Greater(t, a, prev, "sorted and unique")
		prev = a
		// Every ConnectX function, and of other vendors the SR-IOV PFs and
		// VFs and the functions with an RDMA device (nic's serves): the
		// DGX and edge hosts' E810s are served for their irdma devices.
		require.True(t, d.Vendor == pci.VendorMellanox || d.RDMADevice != "" || d.PFAddress != "" || d.VFIndex >= 0 || d.TotalVFs > 0,
			"%s: a %s function with neither SR-IOV nor an RDMA device", a, d.Vendor)
		require.True(t, strings.HasPrefix(d.Class, "0x0200") || strings.HasPrefix(d.Class, "0x0207"), "%s: class %s", a, d.Class)
		// The function's directory: where its netdev's class link says
		// (a scan takes it from there) or else its bus link.
		fn := inside(filepath.Join(root, "sys", "bus", "pci", "devices", a))
		if d.Netdev != "" {
			fn = filepath.Dir(filepath.Dir(inside(filepath.Join(root, "sys", "class", "net", d.Netdev))))
		}
		require.True(t, strings.HasPrefix(fn, devices) && filepath.Base(fn) == a, "%s: its directory %q is in the root", a, fn)

		if d.PFAddress == "" {
			require.Equal(t, -1, d.VFIndex, a)
		} else {
			require.True(t, pci.ValidAddress(d.PFAddress), a)
			require.GreaterOrEqual(t, d.VFIndex, -1, a)
			if pf, ok := snap.Device(d.PFAddress); ok {
				require.Equal(t, pf.Netdev, d.PFNetdev, "%s: its PF's netdev", a)
			} else {
				require.True(t, warned(a, d.PFAddress), "%s: its PF %s is neither in the snapshot nor warned about: %q", a, d.PFAddress, snap.Warnings)
				require.Empty(t, d.PFNetdev, "%s: no PF, no PF netdev", a)
			}
		}
		if d.Netdev != "" {
			require.Equal(t, filepath.Join(fn, "net", d.Netdev), inside(filepath.Join(root, "sys", "class", "net", d.Netdev)), "%s: netdev %s", a, d.Netdev)
		}
		for _, p := range d.VFIODevices {
			hostPath(p, "/dev/vfio")
		}
		if d.RDMADevice == "" {
			require.Empty(t, d.CharDevices, a)
			continue
		}
		require.Equal(t, filepath.Join(fn, "infiniband", d.RDMADevice), inside(filepath.Join(root, "sys", "class", "infiniband", d.RDMADevice)),
			"%s: RDMA device %s", a, d.RDMADevice)
		for _, c := range d.CharDevices {
			require.Equal(t, rdma.DevDir+"/"+c.Name, c.Path, a)
			require.True(t, strings.HasPrefix(c.Name, c.Kind), "%s: %s is no %s", a, c.Name, c.Kind)
			hostPath(c.Path, rdma.DevDir)
			class := "infiniband_mad"
			if c.Kind == rdma.KindUverbs {
				class = "infiniband_verbs"
			}
			// ib_umad makes umadN and issmN together, with one parent:
			// the umad's link speaks for both.
			linkName := c.Name
			if c.Kind == rdma.KindIssm {
				linkName = rdma.KindUmad + strings.TrimPrefix(c.Name, rdma.KindIssm)
			}
			own := inside(filepath.Join(root, "sys", "class", class, linkName)) == filepath.Join(fn, class, linkName)
			ibdev, _ := os.ReadFile(filepath.Join(root, "sys", "class", class, c.Name, "ibdev"))
			require.True(t, own || strings.TrimSpace(string(ibdev)) == d.RDMADevice,
				"%s: %s is not %s's: no link below the function, ibdev %q", a, c.Name, d.RDMADevice, ibdev)
		}
	}
}
