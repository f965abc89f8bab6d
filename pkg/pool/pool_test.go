package pool_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

func seed(name string) string { return filepath.Join("..", "..", "testdata", "config", name) }

func scan(t *testing.T, host string) []nic.Device {
	t.Helper()
	snap, err := nic.NewScanner(filepath.Join("..", "..", "testdata", "sysfs", host)).Scan()
	require.NoError(t, err)
	return snap.Devices
}

func addrs(p pool.Pool) []string {
	out := []string{}
	for _, d := range p.Devices {
		out = append(out, d.PCIAddress)
	}
	return out
}

func TestLoadSeeds(t *testing.T) {
	shared, err := pool.Load(seed("rdma-shared.json"))
	require.NoError(t, err)
	require.Equal(t, 300*time.Second, shared.PeriodicUpdateInterval)
	require.Len(t, shared.Resources, 1)
	r := shared.Resources[0]
	// k8s-rdma-shared-dev-plugin's default prefix: what pods written for
	// it ask for.
	require.Equal(t, "rdma/hca_shared_devices_a", r.ResourceName())
	require.True(t, r.NCCLEnv, "the only pool sets the NCCL env")
	require.Equal(t, pool.Shared, r.Kind)
	require.Equal(t, 63, r.RdmaHcaMax)
	require.Equal(t, []pool.Selector{{Vendors: []string{"15b3"}, Devices: []string{"1021"}, LinkTypes: []string{"InfiniBand"}}}, r.Selectors)

	excl, err := pool.Load(seed("sriov-dp.json"))
	require.NoError(t, err)
	require.Equal(t, pool.DefaultPeriodicUpdateInterval, excl.PeriodicUpdateInterval)
	require.Len(t, excl.Resources, 1)
	r = excl.Resources[0]
	require.Equal(t, "mellanox.com/mlnx_sriov_rdma", r.ResourceName())
	require.True(t, r.NCCLEnv)
	require.Equal(t, pool.Exclusive, r.Kind)
	require.Equal(t, "netDevice", r.DeviceType)
	require.Equal(t, []pool.Selector{{Vendors: []string{"15b3"}, Devices: []string{"101e"}, Drivers: []string{"mlx5_core"}, IsRdma: true}}, r.Selectors)

	both, err := pool.Load(seed("combined.json"))
	require.NoError(t, err)
	require.Len(t, both.Resources, 2)
	require.Equal(t, "rdma/hca_shared_devices_a", both.Resources[0].ResourceName())
	require.Equal(t, "mellanox.com/mlnx_sriov_rdma", both.Resources[1].ResourceName())
	require.False(t, both.Resources[0].NCCLEnv, "the exclusive pool sets the NCCL env, the shared one not")
	require.True(t, both.Resources[1].NCCLEnv)
	require.Equal(t, pool.PolicySpread, both.Resources[1].AllocationPolicy)
	require.Empty(t, both.Warnings)

	_, err = pool.Load(seed("rail-spread.json"))
	require.NoError(t, err)
}

func TestLoadMissingFile(t *testing.T) {
	_, err := pool.Load(filepath.Join(t.TempDir(), "nope.json"))
	require.ErrorIs(t, err, pool.ErrNoConfig)
	require.ErrorContains(t, err, "nope.json")
}

// The SR-IOV operator writes "IsRdma"; people write "ResourceName".
func TestKeysMatchCaseInsensitively(t *testing.T) {
	cfg, err := pool.Parse([]byte(`{"ResourceList":[{"ResourceName":"x","Selectors":{"Vendors":["15B3"],"IsRdma":true,"PFNAMES":["ens2f0#0-1"]}}]}`))
	require.NoError(t, err)
	sel := cfg.Resources[0].Selectors[0]
	require.True(t, sel.IsRdma)
	require.Equal(t, []string{"15b3"}, sel.Vendors)
	require.Equal(t, []pool.VFSet{{PF: "ens2f0", Ranges: [][2]int{{0, 1}}}}, sel.PFNames)
}

func TestParseVariants(t *testing.T) {
	cfg, err := pool.Parse([]byte(`{
		"periodicUpdateInterval": "0",
		"configList": [{"resourceName": "legacy", "rdmaHcaMax": 1000, "devices": ["ib0", "ib1"]},
		               {"resourceName": "other.example/hcas", "rdmaHcaMax": 1, "selectors": {"ifNames": ["ens1f0np0"]}}],
		"resourceList": [{"resourceName": "vfs", "resourcePrefix": "nvidia.com", "deviceType": "accelerator", "excludeTopology": true,
		                  "selectors": [{"rootDevices": ["0000:86:00.0#0,2-7"]}, {"pciAddresses": ["0000:3B:00.2"], "linkTypes": ["ether"]}]}]
	}`))
	require.NoError(t, err)
	require.Zero(t, cfg.PeriodicUpdateInterval)
	require.Equal(t, []string{"ib0", "ib1"}, cfg.Resources[0].Selectors[0].IfNames)
	require.Equal(t, "other.example/hcas", cfg.Resources[1].ResourceName())
	r := cfg.Resources[2]
	require.Equal(t, "nvidia.com/vfs", r.ResourceName())
	require.Equal(t, "accelerator", r.DeviceType)
	require.True(t, r.ExcludeTopology)
	require.Equal(t, []pool.VFSet{{PF: "0000:86:00.0", Ranges: [][2]int{{0, 0}, {2, 7}}}}, r.Selectors[0].RootDevices)
	require.Equal(t, []string{"0000:3b:00.2"}, r.Selectors[1].PCIAddresses)
	require.Equal(t, []string{"Ethernet"}, r.Selectors[1].LinkTypes)
}

// What the SR-IOV Network Operator writes into the device plugin's
// ConfigMap: json.Marshal of sriov-network-device-plugin's
// ResourceConfList, with each entry's selectors json.Marshal of its
// NetDeviceSelectors. Their untagged fields come out under their Go
// names whether set or not: "IsRdma", "NeedVhostNet" (untagged in the
// version the operator vendors, a5a7395, and until v3.11.0) and the
// entry's "SelectorObj" (later "SelectorObjs"), null. Those that ask for
// nothing load; one that asks for what fastpath does not do stays an
// error (TestUnsupportedKeysRefusedWhenOn).
func TestOperatorRenderedConfig(t *testing.T) {
	want := []pool.Selector{{Vendors: []string{"15b3"}, Devices: []string{"101e"},
		PFNames: []pool.VFSet{{PF: "ibp24s0"}}, LinkTypes: []string{"InfiniBand"}, IsRdma: true}}
	tests := []struct{ name, config string }{
		{"operator vendoring sriov-network-device-plugin a5a7395",
			`{"resourceList":[{"resourceName":"mlnx_sriov_rdma","selectors":{"vendors":["15b3"],"devices":["101e"],"pfNames":["ibp24s0"],"linkTypes":["infiniband"],"IsRdma":true,"NeedVhostNet":false},"SelectorObj":null}]}`},
		{"operator vendoring sriov-network-device-plugin v3.6-v3.10",
			`{"resourceList":[{"resourceName":"mlnx_sriov_rdma","selectors":{"vendors":["15b3"],"devices":["101e"],"pfNames":["ibp24s0"],"linkTypes":["infiniband"],"IsRdma":true,"NeedVhostNet":false},"SelectorObjs":null}]}`},
		{"every unsupported key off",
			`{"resourceList":[{"resourceName":"mlnx_sriov_rdma","rdmaHcaMax":0,"additionalInfo":{},"SelectorObj":[],
			  "selectors":{"vendors":["15b3"],"devices":["101e"],"pfNames":["ibp24s0"],"linkTypes":["infiniband"],"isRdma":true,
			               "needVhostNet":false,"ddpProfiles":[],"vdpaType":"","pKeys":[],"acpiIndexes":null,"auxTypes":[]}}]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := pool.Parse([]byte(tt.config))
			require.NoError(t, err)
			require.Empty(t, cfg.Warnings)
			require.Len(t, cfg.Resources, 1)
			require.Equal(t, "mellanox.com/mlnx_sriov_rdma", cfg.Resources[0].ResourceName())
			require.Equal(t, want, cfg.Resources[0].Selectors)
		})
	}
	// A configList entry's options of resourceList pools, off.
	cfg, err := pool.Parse([]byte(`{"configList":[{"resourceName":"a","rdmaHcaMax":2,"deviceType":"","allocationPolicy":"","servedBy":"",
		"selectors":{"vendors":["15b3"],"needVhostNet":false,"pKeys":[]}}]}`))
	require.NoError(t, err)
	require.Equal(t, []pool.Selector{{Vendors: []string{"15b3"}}}, cfg.Resources[0].Selectors)
}

// Every key fastpath refuses as unsupported is still refused, with its
// explanation and what to do, when its value asks for something.
func TestUnsupportedKeysRefusedWhenOn(t *testing.T) {
	sel := func(kv string) string {
		return `{"resourceList":[{"resourceName":"vfs","selectors":{"vendors":["15b3"],"IsRdma":true,` + kv + `}}]}`
	}
	entry := func(kv string) string {
		return `{"resourceList":[{"resourceName":"vfs",` + kv + `,"selectors":{"vendors":["15b3"]}}]}`
	}
	shared := func(kv string) string {
		return `{"configList":[{"resourceName":"hcas","rdmaHcaMax":2,` + kv + `,"selectors":{"vendors":["15b3"]}}]}`
	}
	tests := []struct{ name, config, want string }{
		{"needVhostNet", sel(`"NeedVhostNet":true`),
			"resourceList[0].selectors.NeedVhostNet: needVhostNet is not supported: fastpath does not hand out /dev/vhost-net (remove the key, or set it to false)"},
		{"vdpaType", sel(`"vdpaType":"virtio"`),
			`resourceList[0].selectors.vdpaType: vdpaType is not supported: fastpath does not hand out vDPA devices (remove the key, or set it to "")`},
		{"pKeys", sel(`"pKeys":["0x7fff"]`),
			"resourceList[0].selectors.pKeys: pKeys is not supported: partition keys are not read during discovery (remove the key, or set it to [])"},
		{"ddpProfiles", sel(`"ddpProfiles":["GTPv1-U"]`),
			"resourceList[0].selectors.ddpProfiles: ddpProfiles is not supported: fastpath does not read Intel DDP profiles (remove the key, or set it to [])"},
		{"acpiIndexes", sel(`"acpiIndexes":["101"]`),
			"resourceList[0].selectors.acpiIndexes: acpiIndexes is not supported (remove the key, or set it to [])"},
		{"auxTypes", sel(`"auxTypes":["eth"]`),
			"resourceList[0].selectors.auxTypes: auxTypes is not supported: scalable functions are not discovered (remove the key, or set it to [])"},
		{"needVhostNet not a bool", sel(`"needVhostNet":"false"`),
			`resourceList[0].selectors.needVhostNet: needVhostNet is not supported: fastpath does not hand out /dev/vhost-net (remove the key, or set it to false)`},
		{"rdmaHcaMax", entry(`"rdmaHcaMax":3`),
			"resourceList[0].rdmaHcaMax: rdmaHcaMax applies to configList (shared) pools; a resourceList pool hands out whole VFs (remove the key, or set it to 0)"},
		{"additionalInfo", entry(`"additionalInfo":{"*":{"k":"v"}}`),
			"resourceList[0].additionalInfo: additionalInfo is not supported: fastpath puts each device's details in PCIDEVICE_<RESOURCE>_INFO (remove the key, or set it to {})"},
		{"SelectorObj", entry(`"SelectorObj":{"vendors":["15b3"]}`),
			"resourceList[0].SelectorObj: SelectorObj is sriov-network-device-plugin's internal field, not configuration; give the selectors in selectors (remove the key, or set it to null)"},
		{"SelectorObjs", entry(`"SelectorObjs":[{"vendors":["15b3"]}]`),
			"resourceList[0].SelectorObjs: SelectorObjs is sriov-network-device-plugin's internal field"},
		{"shared deviceType", shared(`"deviceType":"netDevice"`),
			`configList[0].deviceType: deviceType applies to resourceList (exclusive) pools (remove the key, or set it to "")`},
		{"shared allocationPolicy", shared(`"allocationPolicy":"spread"`), "configList[0].allocationPolicy: allocationPolicy applies to resourceList"},
		{"shared servedBy", shared(`"servedBy":"dra"`), "configList[0].servedBy: servedBy applies to resourceList"},
		{"shared selector", `{"configList":[{"resourceName":"hcas","rdmaHcaMax":2,"selectors":{"vendors":["15b3"],"needVhostNet":true}}]}`,
			"configList[0].selectors.needVhostNet: needVhostNet is not supported"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pool.Parse([]byte(tt.config))
			require.ErrorContains(t, err, tt.want)
		})
	}
}

func TestParseErrors(t *testing.T) {
	excl := func(sel string) string {
		return `{"resourceList":[{"resourceName":"vfs","selectors":` + sel + `}]}`
	}
	tests := []struct {
		name, config string
		want         []string // substrings of the error
	}{
		{"not json", `{"resourceList": [`, []string{"invalid JSON"}},
		{"trailing data", `{"resourceList":[]} {}`, []string{"after the top-level"}},
		{"top not object", `[]`, []string{"config: want an object, got a list"}},
		{"no pools", `{}`, []string{"no pools"}},
		{"unknown top key", `{"resourcelists": []}`, []string{`unknown key "resourcelists"`, "resourceList"}},
		{"duplicate key by case", `{"resourceList":[{"resourceName":"a","ResourceName":"b","selectors":{"isRdma":true}}]}`,
			[]string{"resourceList[0].ResourceName: duplicate key", `"resourceName"`}},
		{"unknown resource key", `{"resourceList":[{"resourceName":"a","selector":{}}]}`, []string{`resourceList[0]: unknown key "selector"`}},
		{"unknown selector key", excl(`{"vendor":["15b3"]}`), []string{`resourceList[0].selectors: unknown key "vendor"`, "vendors"}},
		{"missing name", `{"resourceList":[{"selectors":{"isRdma":true}}]}`, []string{"resourceList[0]: resourceName is required"}},
		{"invalid name", `{"resourceList":[{"resourceName":"my pool","selectors":{"isRdma":true}}]}`, []string{`resourceList[0].resourceName: "my pool" is not a valid resource name`}},
		{"invalid prefix", `{"resourceList":[{"resourceName":"a","resourcePrefix":"Mellanox_com","selectors":{"isRdma":true}}]}`, []string{`prefix "Mellanox_com" is not a DNS subdomain`}},
		{"reserved prefix", `{"resourceList":[{"resourceName":"a","resourcePrefix":"kubernetes.io","selectors":{"isRdma":true}}]}`, []string{"reserved"}},
		{"prefix twice", `{"resourceList":[{"resourceName":"x.io/a","resourcePrefix":"y.io","selectors":{"isRdma":true}}]}`, []string{"give one"}},
		{"duplicate resource", `{"configList":[{"resourceName":"a","resourcePrefix":"mellanox.com","rdmaHcaMax":1,"selectors":{"vendors":["15b3"]}}],"resourceList":[{"resourceName":"a","selectors":{"isRdma":true}}]}`,
			[]string{`resourceList[0]: duplicate resource "mellanox.com/a" (already defined by configList[0])`}},
		{"duplicate resource by default prefix", `{"configList":[{"resourceName":"a","rdmaHcaMax":1,"selectors":{"vendors":["15b3"]}},{"resourceName":"rdma/a","rdmaHcaMax":1,"selectors":{"vendors":["15b3"]}}]}`,
			[]string{`configList[1]: duplicate resource "rdma/a" (already defined by configList[0])`}},
		{"two ncclEnv", `{"configList":[{"resourceName":"a","rdmaHcaMax":1,"ncclEnv":true,"selectors":{"vendors":["15b3"]}}],"resourceList":[{"resourceName":"b","ncclEnv":true,"selectors":{"isRdma":true}}]}`,
			[]string{`configList[0] and resourceList[0] both say "ncclEnv": true: only one pool may set NCCL_IB_HCA and UCX_NET_DEVICES`}},
		{"ncclEnv not a bool", `{"resourceList":[{"resourceName":"b","ncclEnv":"yes","selectors":{"isRdma":true}}]}`,
			[]string{`resourceList[0].ncclEnv: want true or false, got a string`}},
		{"rdmaHcaMax zero", `{"configList":[{"resourceName":"a","rdmaHcaMax":0,"selectors":{"vendors":["15b3"]}}]}`, []string{"configList[0].rdmaHcaMax: 0: want 1 to"}},
		{"rdmaHcaMax missing", `{"configList":[{"resourceName":"a","selectors":{"vendors":["15b3"]}}]}`, []string{"configList[0]: rdmaHcaMax is required"}},
		{"rdmaHcaMax not int", `{"configList":[{"resourceName":"a","rdmaHcaMax":1.5,"selectors":{"vendors":["15b3"]}}]}`, []string{`configList[0].rdmaHcaMax: "1.5" is not an integer`}},
		{"rdmaHcaMax on exclusive", `{"resourceList":[{"resourceName":"a","rdmaHcaMax":3,"selectors":{"isRdma":true}}]}`, []string{"resourceList[0].rdmaHcaMax: rdmaHcaMax applies to configList"}},
		{"policy on shared", `{"configList":[{"resourceName":"a","rdmaHcaMax":3,"allocationPolicy":"spread","selectors":{"vendors":["15b3"]}}]}`, []string{"configList[0].allocationPolicy"}},
		{"bad policy", `{"resourceList":[{"resourceName":"a","allocationPolicy":"random","selectors":{"isRdma":true}}]}`, []string{`resourceList[0].allocationPolicy: "random"`}},
		{"shared without selectors", `{"configList":[{"resourceName":"a","rdmaHcaMax":3}]}`, []string{"configList[0]: no selectors"}},
		{"exclusive without selectors", `{"resourceList":[{"resourceName":"a"}]}`, []string{"resourceList[0]: selectors are required"}},
		{"empty selector", excl(`{}`), []string{"resourceList[0].selectors: empty selector"}},
		{"empty selector list", excl(`[]`), []string{"resourceList[0].selectors: empty list"}},
		{"selector wrong type", excl(`"15b3"`), []string{"resourceList[0].selectors: want a selector object or a list"}},
		{"bad vendor", excl(`{"vendors":["15b"]}`), []string{`resourceList[0].selectors.vendors[0]: "15b" is not a PCI ID`}},
		{"reserved vendor", excl(`{"vendors":["15b3","FFFF"]}`), []string{`resourceList[0].selectors.vendors[1]: "ffff" can never match`, "8086 Intel"}},
		{"mlx5_ib driver", excl(`{"drivers":["mlx5_core","mlx5_ib"]}`), []string{`resourceList[0].selectors.drivers[1]: "mlx5_ib" can never match`, "mlx5_core"}},
		{"bad pci address", excl(`{"pciAddresses":["18:00.1"]}`), []string{`pciAddresses[0]: "18:00.1" is not a PCI address`}},
		{"reversed range", excl(`{"pfNames":["ens2f0#5-2"]}`), []string{`resourceList[0].selectors.pfNames[0]: "ens2f0#5-2"`, "reversed"}},
		{"empty range", excl(`{"pfNames":["ens2f0#"]}`), []string{"empty VF range"}},
		{"garbage range", excl(`{"pfNames":["ens2f0#0-x"]}`), []string{`"x" is not a VF index`}},
		{"open range", excl(`{"pfNames":["ens2f0#3-"]}`), []string{`"" is not a VF index`}},
		{"huge index", excl(`{"pfNames":["ens2f0#0-99999"]}`), []string{"not a VF index"}},
		{"pci address in pfNames", excl(`{"pfNames":["0000:86:00.0#0-3"]}`), []string{"put it in rootDevices"}},
		{"netdev in rootDevices", excl(`{"rootDevices":["ens2f0#0-3"]}`), []string{"is not a PCI address", "pfNames"}},
		{"bad link type", excl(`{"linkTypes":["rocev2"]}`), []string{`linkTypes[0]: "rocev2": want ether or infiniband`}},
		{"isRdma string", excl(`{"isRdma":"true"}`), []string{"selectors.isRdma: want true or false, got a string"}},
		{"unsupported selector", excl(`{"ddpProfiles":["x"]}`), []string{"ddpProfiles", "not supported"}},
		{"aux devices", `{"resourceList":[{"resourceName":"a","deviceType":"auxNetDevice","selectors":{"isRdma":true}}]}`, []string{"not supported"}},
		{"negative interval", `{"periodicUpdateInterval":-1,"resourceList":[{"resourceName":"a","selectors":{"isRdma":true}}]}`, []string{"periodicUpdateInterval: -1 seconds"}},
		{"legacy devices and ifNames", `{"configList":[{"resourceName":"a","rdmaHcaMax":1,"devices":["ib0"],"selectors":{"ifNames":["ib1"]}}]}`, []string{"not both"}},
		{"bad ifname", `{"configList":[{"resourceName":"a","rdmaHcaMax":1,"devices":["a/b"]}]}`, []string{`configList[0].devices[0]: "a/b" is not an interface name`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := pool.Parse([]byte(tt.config))
			require.Error(t, err)
			for _, w := range tt.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestBuildDGX(t *testing.T) {
	devs := scan(t, "dgx-h100")
	cfg, err := pool.Load(seed("combined.json"))
	require.NoError(t, err)
	pools, warns := pool.Build(cfg, devs)
	require.Empty(t, warns)
	require.Len(t, pools, 2)

	shared := pools[0]
	require.Equal(t, pool.Shared, shared.Kind)
	require.Equal(t, []string{"0000:18:00.0", "0000:40:00.0", "0000:4f:00.0", "0000:5e:00.0",
		"0000:9a:00.0", "0000:c0:00.0", "0000:ce:00.0", "0000:dc:00.0"}, addrs(shared),
		"the IB PFs, not the Ethernet storage NICs with the same device ID")
	require.Equal(t, 63, shared.Capacity())

	excl := pools[1]
	require.Equal(t, pool.Exclusive, excl.Kind)
	require.Len(t, excl.Devices, 32)
	require.Equal(t, 32, excl.Capacity())
	for _, d := range excl.Devices {
		require.True(t, d.IsVF(), d.PCIAddress)
		require.NotEmpty(t, d.RDMADevice, d.PCIAddress)
	}
	require.Equal(t, "0000:18:00.1", excl.Devices[0].PCIAddress)
}

// The Network Operator's common hostdev config selects every Mellanox
// function with RDMA: the DGX's storage ports too, one of which may be the
// node's own network. A function whose netdev carries the default route is
// left out of exclusive pools, with a warning; a shared pool may still
// share its RDMA device.
func TestBuildLeavesOutTheNodesOwnNetwork(t *testing.T) {
	devs := scan(t, "dgx-h100")
	cfg, err := pool.Parse([]byte(`{"resourceList": [{"resourceName": "hostdev", "resourcePrefix": "nvidia.com", "selectors": {"vendors": ["15b3"], "isRdma": true}}],
		"configList": [{"resourceName": "storage", "rdmaHcaMax": 10, "selectors": {"ifNames": ["enp41s0f0np0", "enp41s0f1np1"]}}]}`))
	require.NoError(t, err)
	pools, _ := pool.Build(cfg, devs)
	require.Contains(t, addrs(pools[1]), "0000:29:00.0", "without the option, enp41s0f0np0's function is taken")
	require.Empty(t, pools[0].Devices, "so the shared pool cannot share it")
	all := len(pools[1].Devices)

	pools, warns := pool.Build(cfg, devs, pool.WithDefaultRoutes("enp41s0f0np0", "eth0"))
	require.Equal(t, all-1, len(pools[1].Devices))
	require.NotContains(t, addrs(pools[1]), "0000:29:00.0")
	require.Contains(t, warns, "nvidia.com/hostdev: 0000:29:00.0 is selected but its netdev enp41s0f0np0 carries the node's default route: left out (a pod given it would take the node's own network)")
	require.Equal(t, []string{"0000:29:00.0"}, addrs(pools[0]), "the shared pool shares it")
}

func TestBuildRanges(t *testing.T) {
	devs := scan(t, "dgx-h100")
	cfg, err := pool.Load(seed("rail-spread.json"))
	require.NoError(t, err)
	pools, warns := pool.Build(cfg, devs)
	require.Len(t, pools, 2)
	var rails []string
	for _, pf := range []string{"18", "40", "4f", "5e", "9a", "c0", "ce", "dc"} {
		rails = append(rails, "0000:"+pf+":00.1", "0000:"+pf+":00.2")
	}
	require.Equal(t, rails, addrs(pools[0]))
	require.Len(t, pools[1].Devices, 16, "VF 2 and 3 of each rail; 0 and 1 went to the first pool")
	for _, d := range pools[1].Devices {
		require.Contains(t, []int{2, 3}, d.VFIndex, d.PCIAddress)
	}
	require.Len(t, warns, 1)
	require.Contains(t, warns[0], "16 selected functions are already in mellanox.com/rail_vfs")
}

func TestBuildEdge(t *testing.T) {
	devs := scan(t, "edge")
	cfg, err := pool.Parse([]byte(`{
		"configList": [{"resourceName": "edge_hcas", "rdmaHcaMax": 4, "selectors": {"vendors": ["15b3"]}}],
		"resourceList": [
			{"resourceName": "dpdk", "selectors": {"drivers": ["vfio-pci"]}},
			{"resourceName": "ib_vfs", "selectors": {"rootDevices": ["0000:86:00.0"]}},
			{"resourceName": "nothing", "selectors": {"pfNames": ["nosuch0"]}}
		]}`))
	require.NoError(t, err)
	pools, warns := pool.Build(cfg, devs)
	require.Len(t, pools, 4)
	require.Equal(t, []string{"0000:86:00.1"}, addrs(pools[1]), "the vfio-bound VF")
	require.Equal(t, []string{"0000:86:00.3", "0000:86:00.4"}, addrs(pools[2]),
		"bound VFs of the PF (the PF itself has VFs; .1 is taken; .2 is unbound)")
	require.Empty(t, pools[3].Devices)
	require.Zero(t, pools[3].Capacity())

	shared := addrs(pools[0])
	require.NotContains(t, shared, "0000:86:00.3", "held by an exclusive pool")
	require.NotContains(t, shared, "0000:86:00.2", "no RDMA device")
	require.Contains(t, shared, "0000:86:00.0")
	require.Contains(t, shared, "0000:af:00.2")
	require.Equal(t, 4, pools[0].Capacity())

	all := strings.Join(warns, "\n")
	require.Contains(t, all, "mellanox.com/ib_vfs: 0000:86:00.2 is selected but bound to no driver")
	require.Contains(t, all, "mellanox.com/ib_vfs: 1 selected functions are already in mellanox.com/dpdk")
	require.Contains(t, all, "mellanox.com/nothing (resourceList[2]): no device matches")
	require.Contains(t, all, "rdma/edge_hcas: 0000:86:00.3 is in exclusive pool mellanox.com/ib_vfs")
}

// Every seed config loads without a warning and, on the fixture host it
// is written for (the DGX, or the vendor host it is named after), gives
// pools that all have devices and no warning but the one rail-spread.json
// means to give.
func TestSeedsHaveNoSurprises(t *testing.T) {
	hosts := map[string]string{"bnxt-re.json": "bnxt-re", "e810-irdma.json": "e810-irdma", "igb-qemu.json": "../sysfs-captured/igb-qemu"}
	// rail-spread's second pool takes the VFs its first one left: the
	// first pool that selects a function gets it, and Build says so.
	meant := map[string][]string{
		"rail-spread.json": {"mellanox.com/spare_vfs: 16 selected functions are already in mellanox.com/rail_vfs "},
	}
	entries, err := os.ReadDir(filepath.Join("..", "..", "testdata", "config"))
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	for _, e := range entries {
		t.Run(e.Name(), func(t *testing.T) {
			cfg, err := pool.Load(seed(e.Name()))
			require.NoError(t, err)
			require.Empty(t, cfg.Warnings)
			host := hosts[e.Name()]
			if host == "" {
				host = "dgx-h100"
			}
			pools, warns := pool.Build(cfg, scan(t, host))
			require.NotEmpty(t, pools)
			for _, p := range pools {
				require.NotEmpty(t, p.Devices, p.ResourceName())
			}
			want := meant[e.Name()]
			require.Len(t, warns, len(want), "%q", warns)
			for i, w := range want {
				require.True(t, strings.HasPrefix(warns[i], w), "warning %d: %q, want it to start %q", i, warns[i], w)
			}
		})
	}
}

// Each format's own default prefix, and --resource-prefix for
// resourceList entries as sriov-network-device-plugin has it.
func TestResourcePrefixDefaults(t *testing.T) {
	const both = `{"configList": [{"resourceName": "hcas", "rdmaHcaMax": 2, "selectors": {"vendors": ["15b3"]}},
	                             {"resourceName": "own", "resourcePrefix": "example.com", "rdmaHcaMax": 2, "selectors": {"vendors": ["15b3"]}}],
	              "resourceList": [{"resourceName": "vfs", "selectors": {"isRdma": true}},
	                               {"resourceName": "nvidia.com/named", "selectors": {"isRdma": true}}]}`
	names := func(cfg *pool.Config) []string {
		var out []string
		for _, r := range cfg.Resources {
			out = append(out, r.ResourceName())
		}
		return out
	}
	cfg, err := pool.Parse([]byte(both))
	require.NoError(t, err)
	require.Equal(t, []string{"rdma/hcas", "example.com/own", "mellanox.com/vfs", "nvidia.com/named"}, names(cfg))
	cfg, err = pool.Parse([]byte(both), pool.WithResourcePrefix("nvidia.com"))
	require.NoError(t, err)
	require.Equal(t, []string{"rdma/hcas", "example.com/own", "nvidia.com/vfs", "nvidia.com/named"}, names(cfg))
	_, err = pool.Parse([]byte(both), pool.WithResourcePrefix("Not_A_Domain"))
	require.ErrorContains(t, err, `default for resourceList entries: resource prefix "Not_A_Domain" is not a DNS subdomain`)
	cfg, err = pool.Load(seed("sriov-dp.json"), pool.WithResourcePrefix("nvidia.com"))
	require.NoError(t, err)
	require.Equal(t, []string{"mellanox.com/mlnx_sriov_rdma"}, names(cfg), "an entry's own resourcePrefix wins")
}

// One pool per config sets NCCL_IB_HCA and UCX_NET_DEVICES.
func TestNCCLEnvRule(t *testing.T) {
	shared := func(name, extra string) string {
		return `{"resourceName": "` + name + `", "rdmaHcaMax": 2, ` + extra + `"selectors": {"vendors": ["15b3"]}}`
	}
	excl := func(name, extra string) string {
		return `{"resourceName": "` + name + `", ` + extra + `"selectors": {"isRdma": true}}`
	}
	for _, tc := range []struct {
		name       string
		configList []string
		resList    []string
		want       []string // resources with NCCLEnv
		warn       string   // a warning that must be there ("" none)
	}{
		{"only shared", []string{shared("a", ""), shared("b", "")}, nil, []string{"rdma/a"}, ""},
		{"exclusive before shared", []string{shared("a", "")}, []string{excl("x", "")}, []string{"mellanox.com/x"}, ""},
		{"first exclusive", nil, []string{excl("x", ""), excl("y", "")}, []string{"mellanox.com/x"},
			`resourceList[1] (mellanox.com/y) does not set NCCL_IB_HCA and UCX_NET_DEVICES: one pool per node does, resourceList[0] (mellanox.com/x)`},
		{"second silenced", nil, []string{excl("x", ""), excl("y", `"ncclEnv": false, `)}, []string{"mellanox.com/x"}, ""},
		{"picked", []string{shared("a", `"ncclEnv": true, `)}, []string{excl("x", ""), excl("y", `"ncclEnv": false, `)}, []string{"rdma/a"},
			`resourceList[0] (mellanox.com/x) does not set NCCL_IB_HCA`},
		{"picked second", nil, []string{excl("x", `"ncclEnv": false, `), excl("y", `"ncclEnv": true, `)}, []string{"mellanox.com/y"}, ""},
		{"none", nil, []string{excl("x", `"ncclEnv": false, `)}, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc := `{"configList": [` + strings.Join(tc.configList, ",") + `], "resourceList": [` + strings.Join(tc.resList, ",") + `]}`
			cfg, err := pool.Parse([]byte(doc))
			require.NoError(t, err)
			var got []string
			for _, r := range cfg.Resources {
				if r.NCCLEnv {
					got = append(got, r.ResourceName())
				}
			}
			require.Equal(t, tc.want, got)
			if tc.warn == "" {
				require.Empty(t, cfg.Warnings)
			} else {
				require.Len(t, cfg.Warnings, 1)
				require.Contains(t, cfg.Warnings[0], tc.warn)
			}
		})
	}
}

// linkTypes select DPDK (vfio-pci) and unbound functions too: their link
// type comes from the PCI class.
func TestLinkTypesSelectVFIO(t *testing.T) {
	devs := scan(t, "edge")
	for _, tc := range []struct {
		linkTypes string
		want      []string
	}{
		{`["infiniband"]`, []string{"0000:86:00.1"}},
		{`["ether"]`, []string{}},
	} {
		cfg, err := pool.Parse([]byte(`{"resourceList": [{"resourceName": "dpdk", "selectors": {"drivers": ["vfio-pci"], "linkTypes": ` + tc.linkTypes + `}}]}`))
		require.NoError(t, err)
		pools, _ := pool.Build(cfg, devs)
		require.Len(t, pools, 1)
		require.Equal(t, tc.want, addrs(pools[0]), tc.linkTypes)
	}
}

// Invalid JSON is placed by line and column, as an editor shows them.
func TestParseSyntaxErrorLineColumn(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"stray comma", "{\n  \"resourceList\": [\n    {\"resourceName\": \"x\",, }\n  ]\n}\n", "invalid JSON at line 3, column 26: invalid character ','"},
		{"after the object", `{"resourceList": [{"resourceName": "x", "selectors": {"isRdma": true}}]} x`, "unexpected data after the top-level JSON object at line 1, column 74"},
		{"a multi-byte name before", "{\"resourceList\": [{\"resourceName\": \"ü\" \"x\"}]}", "invalid JSON at line 1, column 40"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := pool.Parse([]byte(tc.in))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// A prefix outside pool.VendorPrefixes loads with a warning naming the
// collision risk; a GPU plugin's resource name does not load.
func TestResourcePrefixWarningsAndGPUNames(t *testing.T) {
	entry := func(prefix, name string) string {
		return `{"resourceList": [{"resourceName": "` + name + `", "resourcePrefix": "` + prefix + `", "selectors": {"isRdma": true}}]}`
	}
	for _, tc := range []struct {
		prefix, name string
		warn         bool
		err          string
	}{
		{"mellanox.com", "vfs", false, ""},
		{"intel.com", "e810_vfs", false, ""},
		{"broadcom.com", "bnxt_rdma", false, ""},
		{"rdma", "hca", false, ""},
		{"example.com", "vfs", true, ""},
		{"nvidia.com", "hostdev", true, ""},
		{"nvidia.com", "gpu", false, `resource "nvidia.com/gpu" is a GPU device plugin's resource name`},
		{"nvidia.com", "mig-1g.10gb", false, "GPU device plugin's resource name"},
		{"amd.com", "gpu", false, "GPU device plugin's resource name"},
	} {
		t.Run(tc.prefix+"/"+tc.name, func(t *testing.T) {
			cfg, err := pool.Parse([]byte(entry(tc.prefix, tc.name)))
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			var warns []string
			for _, w := range cfg.Warnings {
				if strings.Contains(w, "resource prefix") {
					warns = append(warns, w)
				}
			}
			if !tc.warn {
				require.Empty(t, warns)
				return
			}
			require.Len(t, warns, 1)
			require.Contains(t, warns[0], `resource prefix "`+tc.prefix+`" is none of rdma, mellanox.com, intel.com, broadcom.com`)
			require.Contains(t, warns[0], "collide")
		})
	}
}
