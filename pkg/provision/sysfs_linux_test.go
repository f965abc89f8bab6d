package provision_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// writes watches dirs (label -> directory); drain returns what was
// written in them since the last drain, in order, as "label/file".
// (inotify merges two identical events in a row: drain between two writes
// of one file to see both.)
func writes(t *testing.T, dirs map[string]string) (drain func() []string) {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	require.NoError(t, err)
	labels := map[int32]string{}
	for label, dir := range dirs {
		wd, err := unix.InotifyAddWatch(fd, dir, unix.IN_CLOSE_WRITE)
		require.NoError(t, err, dir)
		labels[int32(wd)] = label
	}
	t.Cleanup(func() { unix.Close(fd) })
	return func() []string {
		var out []string
		buf := make([]byte, 64<<10)
		n, err := unix.Read(fd, buf)
		if err != nil {
			return nil
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := buf[off+unix.SizeofInotifyEvent : off+unix.SizeofInotifyEvent+int(ev.Len)]
			if i := indexZero(name); i >= 0 {
				name = name[:i]
			}
			out = append(out, labels[ev.Wd]+"/"+string(name))
			off += unix.SizeofInotifyEvent + int(ev.Len)
		}
		return out
	}
}

func indexZero(b []byte) int {
	for i, c := range b {
		if c == 0 {
			return i
		}
	}
	return -1
}

func touch(t *testing.T, path string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
	require.NoError(t, os.WriteFile(path, nil, 0o644))
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return string(b)
}

// The real Kernel on a tree of plain files: the files it writes, in the
// order it writes them, and what it writes there.
func TestSysfsKernelWrites(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, 1, 2))
	sys := filepath.Join(root, "sys")
	bus := filepath.Join(sys, "bus", "pci")
	drv := filepath.Join(bus, "drivers", "mlx5_core")
	touch(t, filepath.Join(bus, "drivers_probe"))
	touch(t, filepath.Join(drv, "unbind"))
	vf0, vf1 := fixture.VFAddress(0x10, 0), fixture.VFAddress(0x10, 1)
	resolve := func(p string) string {
		r, err := filepath.EvalSymlinks(p)
		require.NoError(t, err)
		return r
	}
	for _, vf := range []string{vf0, vf1} {
		touch(t, filepath.Join(resolve(filepath.Join(bus, "devices", vf)), "driver_override"))
	}

	// Same count, other GUIDs, an MTU: the VFs are unbound, given their
	// GUIDs and probed by their IDs (autoprobe is on; inotify merges the
	// two unbinds into one event).
	doc := `
metadata: {name: rails}
spec: {resourceName: r, numVfs: 2, mtu: 4000, isRdma: true, nicSelector: {rootDevices: ["0000:10:00.0"]}}
`
	plan := provision.NewPlan(policies(t, doc), node(t, root))
	require.NoError(t, plan.PFs[0].Refused)
	link := sriovtest.NewPFLink()
	k := provision.NewSysfsKernel(root, link)
	stop := writes(t, map[string]string{
		"bus":    bus,
		"driver": drv,
		"pf":     resolve(filepath.Join(bus, "devices", "0000:10:00.0")),
		"pfnet":  resolve(filepath.Join(sys, "class", "net", "ibp16s0")),
		"vf0":    resolve(filepath.Join(bus, "devices", vf0)),
		"vf1":    resolve(filepath.Join(bus, "devices", vf1)),
	})
	_, err := applier(root, k, "").Apply(context.Background(), plan)
	require.NoError(t, err)
	require.Equal(t, []string{
		"pfnet/mtu", "driver/unbind",
		"vf0/driver_override", "bus/drivers_probe", "vf1/driver_override", "bus/drivers_probe",
	}, stop())
	require.Equal(t, "4000", read(t, filepath.Join(sys, "class/net/ibp16s0/mtu")))
	require.Equal(t, vf1, read(t, filepath.Join(drv, "unbind")))
	require.Equal(t, vf1, read(t, filepath.Join(bus, "drivers_probe")))
	require.Equal(t, "\n", read(t, filepath.Join(bus, "devices", vf1, "driver_override")))
	want := provision.DeriveGUID(net.HardwareAddr{0xb8, 0x3f, 0xd2, 0x03, 0, 0x10, 0, 0}, 1)
	cfg, err := link.VF("ibp16s0", 1)
	require.NoError(t, err)
	require.Equal(t, want.String(), cfg.GUID)

	// A new count: autoprobe off, 0, the count, the binds, autoprobe on.
	doc = `
metadata: {name: rails}
spec: {resourceName: r, numVfs: 1, deviceType: vfio-pci, nicSelector: {rootDevices: ["0000:10:00.0"]}}
`
	plan = provision.NewPlan(policies(t, doc), node(t, root))
	stop = writes(t, map[string]string{
		"bus": bus,
		"pf":  resolve(filepath.Join(bus, "devices", "0000:10:00.0")),
		"vf0": resolve(filepath.Join(bus, "devices", vf0)),
	})
	var got []string
	for _, s := range plan.PFs[0].Steps {
		if s.Kind == provision.StepWait {
			continue // nothing binds a plain file to vfio-pci
		}
		require.NoError(t, runStep(k, &plan.PFs[0], s, vf0))
		got = append(got, stop()...)
	}
	require.Equal(t, []string{
		"pf/sriov_drivers_autoprobe", "pf/sriov_numvfs", "pf/sriov_numvfs",
		"vf0/driver_override", "bus/drivers_probe", "pf/sriov_drivers_autoprobe",
	}, got)
	require.Equal(t, "1", read(t, filepath.Join(bus, "devices/0000:10:00.0/sriov_numvfs")))
	require.Equal(t, "1", read(t, filepath.Join(bus, "devices/0000:10:00.0/sriov_drivers_autoprobe")))
	require.Equal(t, "vfio-pci", read(t, filepath.Join(bus, "devices", vf0, "driver_override")))
}

// runStep runs one step on the kernel as the Applier does, with the VF at
// addr.
func runStep(k provision.Kernel, pf *provision.PF, s provision.Step, addr string) error {
	switch s.Kind {
	case provision.StepAutoprobe:
		return k.SetAutoprobe(pf.Address, s.N != 0)
	case provision.StepNumVFs:
		return k.SetNumVFs(pf.Address, s.N)
	case provision.StepBind:
		return k.Bind(addr, s.Drv)
	case provision.StepUnbind:
		return k.Unbind(addr)
	}
	return nil
}

// A GUID goes through netlink on the PF's netdev; where netlink refuses
// and the PF has MLNX_OFED's sriov/<vf>/node and port, through them.
func TestSysfsKernelGUIDFallsBackToMLNXOFED(t *testing.T) {
	guid := net.HardwareAddr{0x02, 0, 0, 0, 0, 0x18, 0, 0x03}
	refused := errors.New("operation not supported")
	for _, tc := range []struct {
		name       string
		netlinkErr error // nil: netlink takes it
		ofedFiles  bool
		wantErr    string // "" : no error
		wantFiles  string // what node and port then hold
	}{
		{name: "netlink takes it", ofedFiles: true, wantFiles: "00:00:00:00:00:00:00:00\n"},
		{name: "netlink refuses, MLNX_OFED files", netlinkErr: refused, ofedFiles: true, wantFiles: guid.String()},
		{name: "netlink refuses, no MLNX_OFED files", netlinkErr: refused,
			wantErr: "pci 0000:10:00.0: set VF 3 node/port GUID 02:00:00:00:00:18:00:03 on ibp16s0: operation not supported"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			dir := filepath.Join(root, "sys/bus/pci/devices/0000:10:00.0/sriov/3")
			if tc.ofedFiles {
				for _, f := range []string{"node", "port"} {
					touch(t, filepath.Join(dir, f))
					require.NoError(t, os.WriteFile(filepath.Join(dir, f), []byte("00:00:00:00:00:00:00:00\n"), 0o644))
				}
			}
			link := sriovtest.NewPFLink()
			if tc.netlinkErr != nil {
				link.FailNext("SetVFGUID", tc.netlinkErr)
			}
			err := provision.NewSysfsKernel(root, link).SetVFGUID("0000:10:00.0", "ibp16s0", 3, guid)
			if tc.wantErr != "" {
				require.EqualError(t, err, tc.wantErr)
				require.ErrorIs(t, err, refused)
				return
			}
			require.NoError(t, err)
			for _, f := range []string{"node", "port"} {
				require.Equal(t, tc.wantFiles, read(t, filepath.Join(dir, f)))
			}
			if tc.netlinkErr == nil {
				require.Equal(t, guid.String(), link.PortGUID("ibp16s0", 3))
			}
		})
	}
}

// igbHost is a host with one Intel 82576 PF (igb, 8086:10c9, netdev ens3)
// that can have 7 VFs (8086:10ca, which igbvf's ID table lists) and has
// none; igbvf is loaded. Its sriov_drivers_autoprobe reads autoprobe.
func igbHost(t *testing.T, autoprobe string) (root, pf string) {
	t.Helper()
	root = t.TempDir()
	b, err := fixture.NewBuilder(root)
	require.NoError(t, err)
	parent, err := b.Bridge("pci0000:00", "0000:00:02.0", "8086", "29c0", 0)
	require.NoError(t, err)
	pf = "0000:01:00.0"
	require.NoError(t, b.Add(fixture.Function{Address: pf, Vendor: "8086", Device: "10c9", Class: "0x020000",
		Driver: "igb", IOMMUGroup: 1, Parent: parent, TotalVFs: 7,
		Netdevs: []fixture.Netdev{{Name: "ens3", MAC: "52:54:00:12:34:56"}}}))
	dev := filepath.Join(root, "sys/bus/pci/devices", pf)
	require.NoError(t, os.WriteFile(filepath.Join(dev, "sriov_vf_device"), []byte("10ca\n"), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dev, "sriov_drivers_autoprobe"), []byte(autoprobe+"\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(root, "sys/bus/pci/drivers/igbvf"), 0o755))
	return root, pf
}

// igbSnapshot is the igb host as discovery shows it (built from its sysfs
// here, so that the test does not depend on which vendors discovery
// serves): the PF and its VFs, with their drivers.
func igbSnapshot(t *testing.T, root, pf string) *nic.Snapshot {
	t.Helper()
	dev := func(addr, attr string) string { return filepath.Join(root, "sys/bus/pci/devices", addr, attr) }
	driver := func(addr string) string {
		l, err := os.Readlink(dev(addr, "driver"))
		if err != nil {
			return ""
		}
		return filepath.Base(l)
	}
	links, _ := filepath.Glob(dev(pf, "virtfn*"))
	snap := &nic.Snapshot{Devices: []nic.Device{{PCIAddress: pf, Vendor: "8086", DeviceID: "10c9", Class: "0x020000",
		Driver: driver(pf), Netdev: "ens3", TotalVFs: 7, NumVFs: len(links), LinkType: "Ethernet"}}}
	for _, l := range links {
		target, err := os.Readlink(l)
		require.NoError(t, err)
		var k int
		_, err = fmt.Sscanf(filepath.Base(l), "virtfn%d", &k)
		require.NoError(t, err)
		vf := filepath.Base(target)
		snap.Devices = append(snap.Devices, nic.Device{PCIAddress: vf, Vendor: "8086", DeviceID: "10ca", Class: "0x020000",
			Driver: driver(vf), PFAddress: pf, VFIndex: k, PFNetdev: "ens3", LinkType: "Ethernet"})
	}
	return snap
}

// A non-ConnectX PF (igb): the real SysfsKernel, under the kernel
// stand-in (which binds nothing on drivers_probe for a VF whose PF has
// autoprobe 0 and whose driver_override is empty, as the PCI core's
// pci_device_can_probe does), binds each netdevice VF to the driver its
// IDs match (igbvf, not the PF's igb and not mlx5_core) and each vfio-pci
// VF to vfio-pci, leaves autoprobe as it found it, and a second plan
// changes nothing.
func TestProvisionBindsEachVFToTheDriverItsIDsMatch(t *testing.T) {
	for _, autoprobe := range []string{"1", "0"} {
		t.Run("autoprobe "+autoprobe, func(t *testing.T) {
			root, pf := igbHost(t, autoprobe)
			standin(t, &provisiontest.Host{Root: root})
			ps := []provision.Policy{
				{Name: "net", ResourceName: "igb_net", NumVFs: 6, DeviceType: provision.DeviceTypeNetdevice,
					PFNames: []pool.VFSet{{PF: "ens3", Ranges: [][2]int{{0, 3}}}}},
				{Name: "dpdk", ResourceName: "igb_vfio", NumVFs: 6, DeviceType: provision.DeviceTypeVFIO,
					PFNames: []pool.VFSet{{PF: "ens3", Ranges: [][2]int{{4, 5}}}}},
			}
			plan := provision.NewPlan(ps, provision.Node{Root: root, Snapshot: igbSnapshot(t, root, pf)})
			require.Len(t, plan.PFs, 1)
			require.NoError(t, plan.PFs[0].Refused)
			a := &provision.Applier{Kernel: provision.NewSysfsKernel(root, nil), Root: root, Timeout: 5 * time.Second, Poll: time.Millisecond}
			_, err := a.Apply(context.Background(), plan)
			require.NoError(t, err)

			snap := igbSnapshot(t, root, pf)
			require.Len(t, snap.Devices, 7)
			for _, d := range snap.Devices[1:] {
				want := "igbvf"
				if d.VFIndex >= 4 {
					want = "vfio-pci"
				}
				require.Equal(t, want, d.Driver, "VF %d (%s)", d.VFIndex, d.PCIAddress)
			}
			require.Equal(t, autoprobe, strings.TrimSpace(read(t, filepath.Join(root, "sys/bus/pci/devices", pf, "sriov_drivers_autoprobe"))))
			// The policies' pools serve what was made: the igbvf VFs and
			// the vfio-pci ones, each in its own pool.
			pools, _ := pool.Build(provision.Merge(nil, provision.Resources(plan, "intel.com")), snap.Devices)
			require.Len(t, pools, 2)
			for _, p := range pools {
				var got []int
				for _, d := range p.Devices {
					got = append(got, d.VFIndex)
				}
				want := map[string][]int{"intel.com/igb_net": {0, 1, 2, 3}, "intel.com/igb_vfio": {4, 5}}[p.ResourceName()]
				require.Equal(t, want, got, p.ResourceName())
			}
			again := provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap})
			require.Zero(t, again.Changes(), "%v", again.PFs[0].Steps)
		})
	}
}

// standin runs a kernel stand-in over h until the test ends.
func standin(t *testing.T, h *provisiontest.Host) {
	t.Helper()
	s, err := provisiontest.NewStandin(h, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// Policies for an Intel E810 and a Broadcom PF, on the fixture hosts laid
// out as Linux 6.12 lays out ice/iavf/irdma and bnxt_en/bnxt_re, applied
// through the real SysfsKernel under the kernel stand-in: each netdevice
// VF is bound to the driver its IDs select (iavf, bnxt_en), discovery
// finds them with what their drivers give them (a netdev; for bnxt_en
// also its bnxt_re device), the policy's pool serves them, and a second
// plan changes nothing.
func TestProvisionVendorHosts(t *testing.T) {
	for _, tc := range []struct {
		host, pf   string
		numVFs     int
		wantDriver string
		wantRDMA   bool
	}{
		{"e810-irdma", "0000:3b:00.1", 3, "iavf", false}, // 0 VFs before
		{"bnxt-re", "0000:41:00.1", 3, "bnxt_en", true},  // 2 vfio-pci VFs before: through 0
	} {
		t.Run(tc.host, func(t *testing.T) {
			root := t.TempDir()
			require.NoError(t, fixture.Write(root, tc.host))
			standin(t, &provisiontest.Host{Root: root})
			ps := []provision.Policy{{Name: "net", ResourceName: "vfs", NumVFs: tc.numVFs, DeviceType: provision.DeviceTypeNetdevice,
				IsRdma: tc.wantRDMA, RootDevices: []pool.VFSet{{PF: tc.pf}}}}
			scan := func() *nic.Snapshot {
				s, err := nic.NewScanner(root).Scan()
				require.NoError(t, err)
				return s
			}
			plan := provision.NewPlan(ps, provision.Node{Root: root, Snapshot: scan()})
			require.Len(t, plan.PFs, 1)
			require.NoError(t, plan.PFs[0].Refused)
			a := &provision.Applier{Kernel: provision.NewSysfsKernel(root, nil), Root: root, Timeout: 5 * time.Second, Poll: time.Millisecond}
			_, err := a.Apply(context.Background(), plan)
			require.NoError(t, err)

			// The stand-in adds a netdev's or RDMA device's directory
			// below the VF (what the applier waits for) a moment before
			// its /sys/class link (what discovery joins by).
			var snap *nic.Snapshot
			require.Eventually(t, func() bool {
				snap = scan()
				n := 0
				for _, d := range snap.Devices {
					if d.PFAddress == tc.pf && d.Netdev != "" && (d.RDMADevice != "") == tc.wantRDMA {
						n++
					}
				}
				return n == tc.numVFs
			}, 5*time.Second, 10*time.Millisecond)
			pools, _ := pool.Build(provision.Merge(nil, provision.Resources(plan, "example.com")), snap.Devices)
			require.Len(t, pools, 1)
			require.Len(t, pools[0].Devices, tc.numVFs, "the policy's pool serves every VF it made")
			for _, d := range pools[0].Devices {
				require.Equal(t, tc.pf, d.PFAddress)
				require.Equal(t, tc.wantDriver, d.Driver, d.PCIAddress)
				require.NotEmpty(t, d.Netdev, d.PCIAddress)
				require.Equal(t, tc.wantRDMA, d.RDMADevice != "", d.PCIAddress)
			}
			again := provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap})
			require.Zero(t, again.Changes(), "%v", again.PFs[0].Steps)
		})
	}
}
