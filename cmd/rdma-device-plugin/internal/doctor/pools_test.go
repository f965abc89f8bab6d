package doctor

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
)

func TestPoolsAndVFs(t *testing.T) {
	disable := func(pf string) func(string) error {
		return func(root string) error { return fixture.DisableVFs(root, pf) }
	}
	for _, tc := range []struct {
		name   string
		host   string
		faults []func(string) error
		config string
		check  string
		st     Status
		want   []string
	}{
		{name: "healthy", host: "generate", config: genConfig, check: "pool", st: OK, want: []string{"mellanox.com/rails", "exclusive pool: 4 VFs"}},
		{name: "numvfs 0 on one rail", host: "generate", faults: []func(string) error{disable("0000:10:00.0")}, config: genConfig,
			check: "sriov", st: Warn, want: []string{"0000:10:00.0 (ibp16s0)", "sriov_numvfs is 0 (of 2)", "mellanox.com/rails", "/sys/bus/pci/devices/0000:10:00.0/sriov_numvfs"}},
		{name: "numvfs 0 everywhere", host: "generate", faults: []func(string) error{disable("0000:10:00.0"), disable("0000:11:00.0")}, config: genConfig,
			check: "sriov", st: Fail, want: []string{"0000:11:00.0", "sriov_numvfs is 0"}},
		{name: "numvfs 0 on a PF the pool names", host: "generate", faults: []func(string) error{disable("0000:10:00.0")},
			config: `{"resourceList":[{"resourceName":"r","selectors":[{"pfNames":["ibp16s0"]},{"rootDevices":["0000:11:00.0"]}]}]}`,
			check:  "sriov", st: Fail, want: []string{"0000:10:00.0 (ibp16s0)", "sriov_numvfs is 0"}},
		{name: "storage NICs without VFs are not rails", host: "dgx-h100", config: `{"resourceList":[{"resourceName":"r","selectors":{"devices":["101e"],"isRdma":true}}]}`,
			check: "pool", st: OK, want: []string{"32 VFs"}},
		{name: "a named PF without SR-IOV", host: "generate-novfs", config: `{"resourceList":[{"resourceName":"r","selectors":{"pfNames":["ibp16s0"]}}]}`,
			check: "sriov", st: Fail, want: []string{"SR-IOV is off in its firmware", "mlxconfig"}},
		{name: "unbound VF", host: "edge", config: edgeConfig, check: "sriov", st: Warn, want: []string{"0000:86:00.2", "bound to no driver", "mlx5_core/bind"}},
		{name: "VF without RDMA device", host: "edge", config: edgeConfig, check: "sriov", st: Warn, want: []string{"0000:86:00.4", "no RDMA device", "enable_rdma"}},
		{name: "VF bound to vfio-pci", host: "edge", config: edgeConfig, check: "sriov", st: Warn, want: []string{"0000:86:00.1", "bound to vfio-pci", "driverctl"}},
		{name: "VF bound to vfio-pci, selected without a driver", host: "edge", config: `{"resourceList":[{"resourceName":"r","selectors":{"devices":["101c"],"isRdma":true}}]}`,
			check: "sriov", st: Warn, want: []string{"0000:86:00.1 | 1 function: bound to vfio-pci, which gives no RDMA device", "mlx5_core/bind"}},
		{name: "unbound VF, selected without a driver", host: "edge", config: `{"resourceList":[{"resourceName":"r","selectors":{"devices":["101c"],"isRdma":true}}]}`,
			check: "sriov", st: Warn, want: []string{"0000:86:00.2 | 1 function: bound to no driver", "mlx5_core/bind"}},
		{name: "pool VF without RDMA device", host: "edge", config: `{"resourceList":[{"resourceName":"r","selectors":{"devices":["101c"],"drivers":["mlx5_core"]}}]}`,
			check: "sriov", st: Warn, want: []string{"0000:86:00.4", "without an RDMA device", "isRdma"}},
		{name: "VF range beyond numvfs", host: "edge", config: `{"resourceList":[{"resourceName":"r","selectors":{"pfNames":["ibp134s0#0-7"]}}]}`,
			check: "sriov", st: Warn, want: []string{"ibp134s0", "up to index 7", "sriov_numvfs 4", "to 8"}},
		{name: "selector matching nothing in an empty pool", host: "edge", config: `{"resourceList":[{"resourceName":"r","selectors":{"devices":["1021"]}}]}`,
			check: "pool", st: Fail, want: []string{"resourceList[0] selectors[0]", "devices [1021]", "101b, 101c"}},
		{name: "one selector of two matching nothing", host: "edge", config: `{"resourceList":[{"resourceName":"r","selectors":[{"devices":["101c"]},{"pciAddresses":["0000:99:00.1"]}]}]}`,
			check: "pool", st: Warn, want: []string{"selectors[1]", "pciAddresses [0000:99:00.1]"}},
		{name: "pool emptied by mlx5_ib missing is not a config mistake", host: "generate", faults: []func(string) error{unload("mlx5_ib")}, config: genConfig,
			check: "pool", st: Fail, want: []string{"isRdma true", "not a config mistake"}},
		{name: "pool starved by an earlier one", host: "generate",
			config: `{"resourceList":[{"resourceName":"a","selectors":{"devices":["101e"]}},{"resourceName":"b","selectors":{"pfNames":["ibp16s0"]}}]}`,
			check:  "pool", st: Fail, want: []string{"mellanox.com/b", "already in mellanox.com/a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := newHost(t, tc.host, tc.faults...)
			r := Run(Options{HostRoot: root, Config: config(t, tc.config)})
			requireCheck(t, r, tc.check, tc.st, tc.want...)
		})
	}
}

func TestHealthyHostsHaveNoPoolFindings(t *testing.T) {
	for _, tc := range []struct{ host, config string }{{"generate", genConfig}, {"roce-cx6dx", roceConfig}} {
		t.Run(tc.host, func(t *testing.T) {
			r := Run(Options{HostRoot: newHost(t, tc.host), Config: config(t, tc.config)})
			for _, c := range r.Checks {
				if c.Name == "pool" || c.Name == "sriov" {
					require.Equal(t, OK, c.Status, "%s: %s %s", c.Name, c.Subject, c.Message)
				}
			}
		})
	}
}

func TestConfigProblems(t *testing.T) {
	root := newHost(t, "generate")
	requireCheck(t, Run(Options{HostRoot: root, ConfigPath: "/etc/x.json", ConfigErr: errors.New("pool config /etc/x.json: bad")}), "config", Fail, "/etc/x.json", "bad")
	r := Run(Options{HostRoot: root})
	requireCheck(t, r, "config", Skip, "no pool config")
	requireCheck(t, r, "port", OK, "6 ports") // every Mellanox function is checked instead
}

func TestNoNICs(t *testing.T) {
	root := t.TempDir()
	b, err := fixture.NewBuilder(root)
	require.NoError(t, err)
	require.NoError(t, b.Add(fixture.Function{Address: "0000:01:00.0", Vendor: "8086", Device: "159b", Class: "0x020000", Driver: "ice", Parent: "pci0000:00", IOMMUGroup: -1}))
	r := Run(Options{HostRoot: root})
	requireCheck(t, r, "discovery", Fail, "no SR-IOV NIC function of any vendor", "no network function with an RDMA device", "sriov_totalvfs")
	require.NotContains(t, text(r), "Mellanox")
	require.NotContains(t, text(r), "15b3")
	require.Empty(t, find(r, "kernel-module"), "nothing else is said of a node without our NICs")
	requireCheck(t, Run(Options{HostRoot: t.TempDir()}), "discovery", Fail, "cannot scan")
}
