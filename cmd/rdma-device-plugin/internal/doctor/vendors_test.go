package doctor

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Hosts of other vendors' SR-IOV NICs, built here with the fixture
// builder, laid out as docs/vendors.md reads Linux 6.12: irdma and
// bnxt_re parent their RDMA device on the PCI function (so it is
// <function>/infiniband/<name>), E810 VFs (iavf) have none, a bnxt_en VF
// has one where the firmware gives it RoCE, igb and igbvf have no RDMA
// driver at all.
var vendorHosts = map[string]func(*fixture.Builder) error{
	"built-e810": e810Host,
	"built-bnxt": bnxtHost,
	"built-igb":  igbHost,
}

// rdmaCore are the RDMA core modules with rdmaDriver holding ib_core and
// ib_uverbs.
func rdmaCore(rdmaDriver string) []fixture.Module {
	return []fixture.Module{
		{Name: rdmaDriver},
		{Name: "ib_core", Holders: []string{rdmaDriver, "ib_umad", "ib_uverbs", "rdma_ucm"}, Params: map[string]string{"netns_mode": "Y"}},
		{Name: "ib_uverbs", Holders: []string{rdmaDriver, "rdma_ucm"}},
		{Name: "ib_umad"},
		{Name: "rdma_ucm"},
	}
}

// e810Host: an Intel E810 (8086:159b, ice) with PF0 0000:3b:00.0
// (enp59s0f0np0, irdma0) and four VFs 8086:1889 at 0000:3b:01.0-3, three
// on iavf (enp59s0f0v0-2) and one on vfio-pci, none with an RDMA device;
// PF1 0000:3b:00.1 (enp59s0f1np1, irdma1) without VFs.
func e810Host(b *fixture.Builder) error {
	parent, err := b.Bridge("pci0000:3a", "0000:3a:00.0", "8086", "347a", 0)
	if err != nil {
		return err
	}
	for fn := 0; fn < 2; fn++ {
		pf := fixture.Function{
			Address: fixture.PCIAddress(0, 0x3b, 0, fn), Vendor: "8086", Device: "159b", Class: "0x020000",
			Driver: "ice", IOMMUGroup: 30 + fn, Parent: parent, TotalVFs: 128,
			Netdevs: []fixture.Netdev{{Name: fmt.Sprintf("enp59s0f%dnp%d", fn, fn), MAC: fixture.MAC(0x3b, fn), PhysPortName: fmt.Sprintf("p%d", fn)}},
			RDMA:    []fixture.RDMADevice{{Name: fmt.Sprintf("irdma%d", fn), LinkLayer: "Ethernet", Uverbs: fn, Umad: fn}},
		}
		for k := 0; fn == 0 && k < 4; k++ {
			vf := fixture.Function{Address: fixture.PCIAddress(0, 0x3b, 1, k), Vendor: "8086", Device: "1889", Class: "0x020000",
				Driver: "iavf", IOMMUGroup: 32 + k}
			if k == 3 {
				vf.Driver = "vfio-pci"
			} else {
				vf.Netdevs = []fixture.Netdev{{Name: fmt.Sprintf("enp59s0f0v%d", k), MAC: fixture.MAC(0x3b00, k+1)}}
			}
			pf.VFs = append(pf.VFs, vf)
		}
		if err := b.Add(pf); err != nil {
			return err
		}
	}
	return b.Modules(append([]fixture.Module{{Name: "ice", Holders: []string{"irdma"}}, {Name: "iavf"}}, rdmaCore("irdma")...)...)
}

// bnxtHost: a Broadcom BCM57508 (14e4:1750, bnxt_en) PF 0000:5e:00.0
// (ens2f0np0, bnxt_re0) with two VFs 14e4:1806 on bnxt_en: 0000:5e:00.1
// (ens2f0v0) with its own bnxt_re1, 0000:5e:00.2 (ens2f0v1) whose
// firmware gives it no RoCE, so no RDMA device.
func bnxtHost(b *fixture.Builder) error {
	parent, err := b.Bridge("pci0000:5d", "0000:5d:00.0", "8086", "347a", 0)
	if err != nil {
		return err
	}
	pf := fixture.Function{
		Address: "0000:5e:00.0", Vendor: "14e4", Device: "1750", Class: "0x020000", Driver: "bnxt_en",
		IOMMUGroup: 40, Parent: parent, TotalVFs: 16,
		Netdevs: []fixture.Netdev{{Name: "ens2f0np0", MAC: fixture.MAC(0x5e, 0), PhysPortName: "p0"}},
		RDMA:    []fixture.RDMADevice{{Name: "bnxt_re0", LinkLayer: "Ethernet", Uverbs: 0, Umad: 0}},
		VFs: []fixture.Function{
			{Address: "0000:5e:00.1", Vendor: "14e4", Device: "1806", Class: "0x020000", Driver: "bnxt_en", IOMMUGroup: 41,
				Netdevs: []fixture.Netdev{{Name: "ens2f0v0", MAC: fixture.MAC(0x5e00, 1)}},
				RDMA:    []fixture.RDMADevice{{Name: "bnxt_re1", LinkLayer: "Ethernet", Uverbs: 1, Umad: 1}}},
			{Address: "0000:5e:00.2", Vendor: "14e4", Device: "1806", Class: "0x020000", Driver: "bnxt_en", IOMMUGroup: 42,
				Netdevs: []fixture.Netdev{{Name: "ens2f0v1", MAC: fixture.MAC(0x5e00, 2)}}},
		},
	}
	if err := b.Add(pf); err != nil {
		return err
	}
	return b.Modules(append([]fixture.Module{{Name: "bnxt_en", Holders: []string{"bnxt_re"}}}, rdmaCore("bnxt_re")...)...)
}

// igbHost: the real-kernel guest's NIC, an emulated 82576 (8086:10c9,
// igb) PF 0000:00:04.0 (ens4) with three VFs 8086:10ca: two on igbvf
// (ens4v0, ens4v1), one bound to nothing (0000:00:10.4). No RDMA module
// is loaded and /dev/infiniband does not exist.
func igbHost(b *fixture.Builder) error {
	pf := fixture.Function{
		Address: "0000:00:04.0", Vendor: "8086", Device: "10c9", Class: "0x020000", Driver: "igb",
		IOMMUGroup: -1, Parent: "pci0000:00", TotalVFs: 7,
		Netdevs: []fixture.Netdev{{Name: "ens4", MAC: fixture.MAC(0, 4)}},
	}
	for k, drv := range []string{"igbvf", "igbvf", ""} {
		vf := fixture.Function{Address: fmt.Sprintf("0000:00:10.%d", 2*k), Vendor: "8086", Device: "10ca", Class: "0x020000",
			Driver: drv, IOMMUGroup: -1}
		if drv != "" {
			vf.Netdevs = []fixture.Netdev{{Name: fmt.Sprintf("ens4v%d", k), MAC: fixture.MAC(0x100, k)}}
		}
		pf.VFs = append(pf.VFs, vf)
	}
	if err := b.Add(pf); err != nil {
		return err
	}
	return b.Modules(fixture.Module{Name: "igb"}, fixture.Module{Name: "igbvf"})
}

// text is every check's subject, message and fix, for what must not be
// said anywhere.
func text(r *Report) string {
	var b strings.Builder
	for _, c := range r.Checks {
		b.WriteString(c.Subject + " | " + c.Message + " | " + c.Fix + "\n")
	}
	return b.String()
}

// mentions counts the checks whose subject or message names s.
func mentions(r *Report, s string) int {
	n := 0
	for _, c := range r.Checks {
		if strings.Contains(c.Subject+" "+c.Message, s) {
			n++
		}
	}
	return n
}

const (
	e810VFs      = `{"resourceList":[{"resourceName":"e810_vfs","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"devices":["1889"],"drivers":["iavf"]}}]}`
	e810RDMAVFs  = `{"resourceList":[{"resourceName":"e810_rdma","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"devices":["1889"],"isRdma":true}}]}`
	e810Shared   = `{"configList":[{"resourceName":"e810_hcas","rdmaHcaMax":8,"selectors":{"vendors":["8086"],"deviceIDs":["159b"]}}]}`
	bnxtRDMAVFs  = `{"resourceList":[{"resourceName":"bnxt_rdma","resourcePrefix":"broadcom.com","selectors":{"vendors":["14e4"],"devices":["1806"],"isRdma":true}}]}`
	bnxtVFs      = `{"resourceList":[{"resourceName":"bnxt_vfs","resourcePrefix":"broadcom.com","selectors":{"vendors":["14e4"],"devices":["1806"]}}]}`
	igbVFs       = `{"resourceList":[{"resourceName":"igb_vfs","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"devices":["10ca"]}}]}`
	igbRDMAVFs   = `{"resourceList":[{"resourceName":"igb_rdma","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"devices":["10ca"],"isRdma":true}}]}`
	igbShared    = `{"configList":[{"resourceName":"igb_hcas","rdmaHcaMax":4,"selectors":{"vendors":["8086"]}}]}`
	igbVFsDriver = `{"resourceList":[{"resourceName":"igb_vfs","resourcePrefix":"intel.com","selectors":{"drivers":["igbvf"]}}]}`
)

// TestVendorHosts runs doctor on a host of each vendor: each check named
// must be there, and no check may give a mlx5 hint for a function that
// is not ConnectX's.
func TestVendorHosts(t *testing.T) {
	type want struct {
		check string
		st    Status
		has   []string
	}
	for _, tc := range []struct {
		name, host, config string
		faults             []func(string) error
		want               []want
		// once are strings that exactly one check may name (per cause,
		// never per VF); never are checks that must not be there.
		once  []string
		never []want
		exit  *int // the report's exit code, where it is checked
	}{
		{name: "E810 without a config", host: "built-e810",
			want: []want{
				{"kernel-module", OK, []string{"ice, iavf, irdma, ib_uverbs, ib_umad, rdma_ucm"}},
				{"config", Skip, []string{"every function with an RDMA device"}},
				{"port", OK, []string{"2 ports ACTIVE"}},
			},
			never: []want{{"kernel-module", Fail, nil}, {"port", Fail, nil}}},
		{name: "E810 Ethernet VFs", host: "built-e810", config: e810VFs,
			want: []want{
				{"pool", OK, []string{"intel.com/e810_vfs", "exclusive pool: 3 VFs"}},
				{"kernel-module", OK, []string{"ice, iavf | loaded"}},
				{"kernel-module", Skip, []string{"RDMA modules not checked", "no pool asks for an RDMA device"}},
				{"sriov", Warn, []string{"0000:3b:01.3", "bound to vfio-pci", "drivers/vfio-pci/unbind", "drivers/iavf/bind"}},
			},
			never: []want{{"pool", Fail, nil}, {"kernel-module", Fail, nil}, {"char-device", Fail, nil}}},
		{name: "E810 VFs in an isRdma pool can never be served", host: "built-e810", config: e810RDMAVFs,
			want: []want{{"pool", Fail, []string{"intel.com/e810_rdma", "4 Intel E810 VFs", "0000:3b:01.0, 0000:3b:01.1, 0000:3b:01.2, 0000:3b:01.3",
				"irdma gives RDMA devices to ice PFs only, not to their VFs (iavf)", "can never be served", "shared pool"}}},
			once:  []string{"0000:3b:01.1"},
			never: []want{{"sriov", Warn, nil}}},
		{name: "E810 shared pool without irdma", host: "built-e810", config: e810Shared, faults: []func(string) error{unload("irdma")},
			want: []want{
				{"kernel-module", Fail, []string{"irdma", "not loaded", "modprobe irdma", "Intel E810 functions (ice, iavf)"}},
			},
			never: []want{{"pool", OK, nil}}},
		{name: "E810 shared pool", host: "built-e810", config: e810Shared,
			want: []want{{"pool", OK, []string{"rdma/e810_hcas", "shared pool: 2 HCAs"}}, {"port", OK, []string{"2 ports ACTIVE"}}}},
		{name: "E810 PF link down", host: "built-e810", faults: []func(string) error{func(root string) error {
			return fixture.SetPortState(root, "irdma0", 1, "1: DOWN", "2: Polling")
		}},
			want: []want{{"port", Fail, []string{"irdma0 port 1 (0000:3b:00.0 enp59s0f0np0)", "Polling", "ethtool enp59s0f0np0"}}}},
		{name: "Broadcom without a config", host: "built-bnxt",
			want:  []want{{"kernel-module", OK, []string{"bnxt_en, bnxt_re, ib_uverbs, ib_umad, rdma_ucm"}}, {"port", OK, []string{"2 ports ACTIVE"}}},
			never: []want{{"kernel-module", Fail, nil}}},
		{name: "Broadcom VF without RoCE in an isRdma pool", host: "built-bnxt", config: bnxtRDMAVFs,
			want: []want{
				{"sriov", Warn, []string{"0000:5e:00.2", "no RDMA device", "broadcom.com/bnxt_rdma", "modprobe bnxt_re", "firmware"}},
				{"pool", OK, []string{"exclusive pool: 1 VF"}},
			},
			once: []string{"0000:5e:00.2"}},
		{name: "Broadcom Ethernet pool with a VF without RoCE", host: "built-bnxt", config: bnxtVFs,
			want: []want{{"sriov", Warn, []string{"0000:5e:00.2", "without an RDMA device", "isRdma", "load bnxt_re"}}}},
		{name: "igb without a config", host: "built-igb",
			want: []want{
				{"kernel-module", OK, []string{"igb, igbvf"}},
				{"kernel-module", Skip, []string{"RDMA modules not checked", "Intel 82576/I350 (igb, igbvf) have no RDMA"}},
			},
			never: []want{{"char-device", Fail, nil}, {"kernel-module", Fail, nil}, {"discovery", Fail, nil}},
			exit:  ptr(0)},
		{name: "igb Ethernet pool", host: "built-igb", config: igbVFsDriver,
			want: []want{
				{"pool", OK, []string{"intel.com/igb_vfs", "exclusive pool: 2 VFs"}},
				{"sriov", Warn, []string{"0000:00:10.4", "bound to no driver", "/sys/bus/pci/drivers/igbvf/bind"}},
			},
			never: []want{{"char-device", Fail, nil}, {"kernel-module", Fail, nil}},
			exit:  ptr(1)},
		{name: "igb Ethernet pool by vendor and device", host: "built-igb", config: igbVFs,
			want:  []want{{"pool", OK, []string{"intel.com/igb_vfs", "exclusive pool: 2 VFs"}}},
			never: []want{{"char-device", Fail, nil}, {"kernel-module", Fail, nil}, {"pool", Fail, nil}}},
		{name: "igb in an isRdma pool can never be served", host: "built-igb", config: igbRDMAVFs,
			want: []want{
				{"pool", Fail, []string{"intel.com/igb_rdma", "3 Intel 82576/I350 VFs", "have no RDMA in the kernel", "can never be served", "drop isRdma"}},
				{"kernel-module", Skip, []string{"no pool asks for an RDMA device", "Intel 82576/I350 (igb, igbvf)"}},
			},
			once:  []string{"igb_rdma"},
			never: []want{{"sriov", Warn, nil}, {"char-device", Fail, nil}, {"kernel-module", Fail, nil}}},
		{name: "igb in a shared pool can never be served", host: "built-igb", config: igbShared,
			want:  []want{{"pool", Fail, []string{"rdma/igb_hcas is a shared pool", "1 Intel 82576/I350 function it selects (0000:00:04.0)", "have no RDMA in the kernel", "exclusive pool (resourceList) without isRdma"}}},
			once:  []string{"igb_hcas"},
			never: []want{{"char-device", Fail, nil}, {"kernel-module", Fail, nil}}},
		// The igb host captured from make e2e-kernel's 6.12 guest: wire A
		// 0000:01:00.0 with 3 igbvf VFs, wire B 0000:02:00.0 with one on
		// igbvf and one on vfio-pci, the node's PF 0000:03:00.0 without.
		{name: "igb-qemu without a config", host: "igb-qemu",
			want: []want{
				{"kernel-module", OK, []string{"igb, igbvf | loaded"}},
				{"kernel-module", Skip, []string{"RDMA modules not checked", "Intel 82576/I350 (igb, igbvf) have no RDMA"}},
			},
			never: []want{{"char-device", Fail, nil}, {"kernel-module", Fail, nil}, {"discovery", Fail, nil}},
			exit:  ptr(0)},
		{name: "igb-qemu Ethernet pool", host: "igb-qemu", config: igbVFsDriver,
			want: []want{
				{"pool", OK, []string{"intel.com/igb_vfs", "exclusive pool: 4 VFs"}},
				{"sriov", Warn, []string{"0000:02:10.2 | 1 function: bound to vfio-pci", "drivers/vfio-pci/unbind", "drivers/igbvf/bind"}},
			},
			never: []want{{"char-device", Fail, nil}, {"kernel-module", Fail, nil}, {"pool", Fail, nil}}},
		{name: "igb-qemu in an isRdma pool can never be served", host: "igb-qemu", config: igbRDMAVFs,
			want:  []want{{"pool", Fail, []string{"intel.com/igb_rdma", "5 Intel 82576/I350 VFs", "have no RDMA in the kernel", "can never be served"}}},
			once:  []string{"igb_rdma", "0000:01:10.2"},
			never: []want{{"sriov", Warn, nil}, {"kernel-module", Fail, nil}}},
		// The committed hosts of the fixture (internal/testsupport/fixture/vendors.go).
		{name: "e810-irdma without a config", host: "e810-irdma",
			want:  []want{{"kernel-module", OK, []string{"ice, iavf, irdma, ib_uverbs, ib_umad, rdma_ucm | loaded"}}, {"port", OK, []string{"2 ports ACTIVE"}}},
			never: []want{{"kernel-module", Fail, nil}, {"sriov", Warn, nil}}},
		{name: "e810-irdma VFs in an isRdma pool", host: "e810-irdma", config: e810RDMAVFs,
			want: []want{{"pool", Fail, []string{"intel.com/e810_rdma", "4 Intel E810 VFs", "irdma gives RDMA devices to ice PFs only", "can never be served"}}},
			once: []string{"0000:3b:01.1"},
			// PF1 has no VFs: those it would have are iavf VFs too, with
			// no RDMA device, so the pool would not take them either.
			never: []want{{"sriov", Fail, nil}, {"sriov", Warn, nil}}},
		{name: "bnxt-re without a config", host: "bnxt-re",
			want:  []want{{"kernel-module", OK, []string{"bnxt_en, bnxt_re, ib_uverbs, ib_umad, rdma_ucm | loaded"}}, {"port", OK, []string{"5 ports ACTIVE"}}},
			never: []want{{"kernel-module", Fail, nil}}},
		{name: "bnxt-re VFs in an isRdma pool", host: "bnxt-re", config: bnxtRDMAVFs,
			want: []want{
				{"pool", OK, []string{"broadcom.com/bnxt_rdma", "exclusive pool: 3 VFs"}},
				{"sriov", Warn, []string{"0000:41:00.5 | 1 function: no RDMA device", "modprobe bnxt_re", "firmware"}},
				{"sriov", Warn, []string{"0000:41:10.2, 0000:41:10.3 | 2 functions: bound to vfio-pci, which gives no RDMA device", "drivers/bnxt_en/bind"}},
			},
			once: []string{"0000:41:00.5", "0000:41:10.3"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{HostRoot: newHost(t, tc.host, tc.faults...)}
			if tc.config != "" {
				o.Config = config(t, tc.config)
			}
			r := Run(o)
			for _, w := range tc.want {
				requireCheck(t, r, w.check, w.st, w.has...)
			}
			for _, w := range tc.never {
				requireNo(t, r, w.check, w.st)
			}
			for _, s := range tc.once {
				require.Equal(t, 1, mentions(r, s), "%q is one cause, said once:\n%s", s, dump(r))
			}
			require.NotContains(t, text(r), "mlx5", "a mlx5 hint on a node without ConnectX:\n%s", dump(r))
			require.NotContains(t, text(r), "mlxconfig")
			require.NotContains(t, text(r), "Mellanox")
			if tc.exit != nil {
				require.Equal(t, *tc.exit, r.ExitCode(), dump(r))
			}
		})
	}
}

// TestVendorProvisionFixes: SR-IOV off in firmware is fixed with
// mlxconfig on ConnectX only.
func TestVendorProvisionFixes(t *testing.T) {
	for _, tc := range []struct {
		host, pf, want, not string
	}{
		{"built-e810", "0000:3b:00.1", "BIOS", "mlxconfig"},
		{"edge", "0000:86:00.0", "mlxconfig -d 0000:86:00.0", "BIOS"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			plan := &provision.Plan{PFs: []provision.PF{{Address: tc.pf, Policy: "p", Want: 8,
				Refused: fmt.Errorf("%s: %w", tc.pf, provision.ErrFirmware)}}}
			r := Run(Options{HostRoot: newHost(t, tc.host), Plan: plan})
			c := requireCheck(t, r, "provision", Fail, tc.pf, "SR-IOV is off", tc.want)
			require.NotContains(t, c.Fix, tc.not)
		})
	}
}

// TestOneLinePerCause: a cause shared by the VFs of one PF is one line,
// not one a VF.
func TestOneLinePerCause(t *testing.T) {
	t.Run("VF ports down behind an up PF", func(t *testing.T) {
		// generate: PF 0000:10:00.0 is mlx5_0, its VFs mlx5_1 and mlx5_2.
		root := newHost(t, "generate", func(root string) error {
			for _, dev := range []string{"mlx5_1", "mlx5_2"} {
				if err := fixture.SetPortState(root, dev, 1, "1: DOWN", "3: Disabled"); err != nil {
					return err
				}
			}
			return nil
		})
		r := Run(Options{HostRoot: root, Config: config(t, genConfig)})
		c := requireCheck(t, r, "port", Fail, "mlx5_1 port 1", "mlx5_2 port 1", "2 VFs of 0000:10:00.0", "Disabled")
		require.Len(t, find(r, "port"), 1, dump(r))
		require.NotContains(t, c.Fix, "0000:10:00.1", "the fix names each VF, not the first one only")
	})
	t.Run("RoCE v2 GIDs missing on two VFs of a PF", func(t *testing.T) {
		// roce-cx6dx: ens1f0v0 (mlx5_2) has 192.168.1.20 with its v2 GID
		// at 3; the kernel gives ens1f0v1 10.9.9.9 that its table lacks.
		root := newHost(t, "roce-cx6dx", func(root string) error { return fixture.DropGID(root, "mlx5_2", 1, 3) })
		k := fakeKernel{addrs: map[string][]string{"ens1f0v1": {"10.9.9.9"}}}
		r := Run(Options{HostRoot: root, Config: config(t, roceConfig), Kernel: k})
		requireCheck(t, r, "roce-gid", Fail, "mlx5_2 port 1 (ens1f0v0)", "ens1f0v1", "2 addresses", "ens1f0v0 192.168.1.20", "ens1f0v1 10.9.9.9")
		fails := 0
		for _, c := range find(r, "roce-gid") {
			if c.Status == Fail {
				fails++
			}
		}
		require.Equal(t, 1, fails, dump(r))
	})
}

// TestVendorHostsLayout holds the built hosts to what discovery must see
// in them, so that the doctor tests above test what they say.
func TestVendorHostsLayout(t *testing.T) {
	for name, rdma := range map[string][]string{"built-e810": {"irdma0", "irdma1"}, "built-bnxt": {"bnxt_re0", "bnxt_re1"}, "built-igb": nil} {
		t.Run(name, func(t *testing.T) {
			root := newHost(t, name)
			for _, dev := range rdma {
				_, err := os.Stat(filepath.Join(root, "sys", "class", "infiniband", dev, "ports", "1", "state"))
				require.NoError(t, err)
			}
			h := &host{opts: Options{HostRoot: root}, root: root}
			require.True(t, h.scan(), dump(&Report{Checks: h.checks}))
			var got []string
			for _, d := range h.snap.Devices {
				if d.RDMADevice != "" {
					got = append(got, d.RDMADevice)
				}
			}
			require.Equal(t, rdma, got)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// e810PF adds an E810 PF with irdma0 (its uverbs and umad numbered past
// a ConnectX host's) and the ice and irdma modules to a written host.
func e810PF(root string) error {
	b, err := fixture.NewBuilder(root)
	if err != nil {
		return err
	}
	if err := b.Add(fixture.Function{Address: "0000:b1:00.0", Vendor: "8086", Device: "159b", Class: "0x020000", Driver: "ice",
		IOMMUGroup: -1, Parent: "pci0000:b0", TotalVFs: 128,
		Netdevs: []fixture.Netdev{{Name: "enp177s0f0np0", MAC: fixture.MAC(0xb1, 0), PhysPortName: "p0"}},
		RDMA:    []fixture.RDMADevice{{Name: "irdma0", LinkLayer: "Ethernet", Uverbs: 60, Umad: 60, State: "1: DOWN", PhysState: "2: Polling"}},
	}); err != nil {
		return err
	}
	return b.Modules(fixture.Module{Name: "ice", Holders: []string{"irdma"}}, fixture.Module{Name: "irdma"})
}

// TestMixedNode: a node with ConnectX and E810 functions gets each
// vendor's checks and hints, side by side.
func TestMixedNode(t *testing.T) {
	t.Run("both vendors' modules and fixes", func(t *testing.T) {
		r := Run(Options{HostRoot: newHost(t, "roce-cx6dx", e810PF)})
		requireCheck(t, r, "kernel-module", OK, "mlx5_core, mlx5_ib, ice, irdma, ib_uverbs, ib_umad, rdma_ucm | loaded")
		c := requireCheck(t, r, "port", Fail, "irdma0 port 1 (0000:b1:00.0 enp177s0f0np0)", "Polling", "ethtool enp177s0f0np0")
		require.NotContains(t, c.Fix, "mlxlink")
	})
	t.Run("Intel's RDMA driver missing has Intel's fix", func(t *testing.T) {
		r := Run(Options{HostRoot: newHost(t, "roce-cx6dx", e810PF, unload("irdma"))})
		c := requireCheck(t, r, "kernel-module", Fail, "irdma is not loaded", "Intel E810", "modprobe irdma")
		require.NotContains(t, c.Fix, "NVIDIA")
		requireCheck(t, r, "kernel-module", OK, "mlx5_core, mlx5_ib, ice, ib_uverbs")
	})
	t.Run("a ConnectX pool does not need Intel's RDMA driver", func(t *testing.T) {
		r := Run(Options{HostRoot: newHost(t, "roce-cx6dx", e810PF, unload("irdma")), Config: config(t, roceConfig)})
		requireNo(t, r, "kernel-module", Fail)
		require.NotContains(t, text(r), "irdma", "the E810 is in no pool:\n%s", dump(r))
	})
}

// TestVendorRDMABuiltIn: an RDMA driver built into the kernel has no
// /sys/module entry; its auxiliary driver shows it is there.
func TestVendorRDMABuiltIn(t *testing.T) {
	for _, tc := range []struct{ host, driver, want string }{
		{"e810-irdma", "irdma", "ice, iavf, irdma (built in), ib_uverbs"},
		{"bnxt-re", "bnxt_re", "bnxt_en, bnxt_re (built in), ib_uverbs"},
	} {
		t.Run(tc.host, func(t *testing.T) {
			root := newHost(t, tc.host, func(root string) error {
				return os.RemoveAll(filepath.Join(root, "sys", "module", tc.driver))
			})
			r := Run(Options{HostRoot: root})
			requireCheck(t, r, "kernel-module", OK, tc.want)
			requireNo(t, r, "kernel-module", Fail)
		})
	}
}
