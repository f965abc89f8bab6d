package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

func TestJudge(t *testing.T) {
	mine := &State{Network: "n", ContainerID: "c1", IfName: "net1", BootID: "b"}
	other := &State{Network: "n", ContainerID: "c2", IfName: "net1", BootID: "b"}
	old := &State{Network: "n", ContainerID: "c2", IfName: "net1", BootID: "long-ago"}
	for _, tc := range []struct {
		name string
		st   *State
		err  error
		boot string
		want verdict
	}{
		{"no state", nil, fs.ErrNotExist, "b", vfFree},
		{"wrapped no state", nil, fmt.Errorf("x: %w", fs.ErrNotExist), "b", vfFree},
		{"bad state", nil, fmt.Errorf("state: %w: truncated", ErrBadState), "b", vfBadState},
		{"I/O error", nil, errors.New("input/output error"), "b", vfUnreadable},
		{"another attachment", other, nil, "b", vfBusy},
		{"this attachment", mine, nil, "b", vfOwn},
		{"earlier boot", old, nil, "b", vfStale},
		{"boot unknown: never stale", old, nil, "", vfBusy},
		{"state without boot: never stale", &State{Network: "n", ContainerID: "c2", IfName: "net1"}, nil, "b", vfBusy},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, judge(tc.st, tc.err, "n", "c1", "net1", tc.boot))
		})
	}
}

func TestJudgeOwner(t *testing.T) {
	ns := "/var/run/netns/pod-a"
	held := &State{Network: "n", ContainerID: "c2", IfName: "net1", BootID: "b", Netns: ns, HostName: "ens1f0v0"}
	gone := fmt.Errorf("lstat %s: %w", ns, fs.ErrNotExist)
	perm := fmt.Errorf("lstat %s: %w", ns, fs.ErrPermission)
	vfio, noNetns, oldBoot, noBoot := *held, *held, *held, *held
	vfio.VFIO, vfio.HostName = true, ""
	noNetns.Netns = ""
	oldBoot.BootID = "long-ago"
	noBoot.BootID = ""
	for _, tc := range []struct {
		name string
		st   *State
		boot string
		f    ownerFacts
		want ownerVerdict
		why  string
	}{
		{"netns there", held, "b", ownerFacts{}, ownerAlive, "is there"},
		{"netns there, netdev on the host", held, "b", ownerFacts{Netdev: "ens1f0v0"}, ownerAlive, "is there"},
		{"netns unreadable", held, "b", ownerFacts{NetnsErr: perm, Netdev: "ens1f0v0"}, ownerAlive, "cannot be checked"},
		{"netns path gone, netdev elsewhere", held, "b", ownerFacts{NetnsErr: gone}, ownerHeld, "a process or an open fd still holds that netns"},
		{"netns gone, netdev on the host", held, "b", ownerFacts{NetnsErr: gone, Netdev: "net1"}, ownerGone, "back in the host netns as net1"},
		{"netns gone, netdev in the temporary netns", held, "b", ownerFacts{NetnsErr: gone, Netdev: "net1", InTemp: true}, ownerGone, "temporary netns"},
		{"vfio-pci: no netdev to tell by", &vfio, "b", ownerFacts{NetnsErr: gone}, ownerAlive, "vfio-pci"},
		{"no netns recorded", &noNetns, "b", ownerFacts{NetnsErr: gone, Netdev: "ens1f0v0"}, ownerAlive, "no netns"},
		{"another boot", &oldBoot, "b", ownerFacts{NetnsErr: gone, Netdev: "ens1f0v0"}, ownerAlive, "boot"},
		{"state without boot", &noBoot, "b", ownerFacts{NetnsErr: gone, Netdev: "ens1f0v0"}, ownerAlive, "boot"},
		{"boot unknown", held, "", ownerFacts{NetnsErr: gone, Netdev: "ens1f0v0"}, ownerAlive, "boot"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := judgeOwner(tc.st, tc.boot, tc.f)
			require.Equal(t, tc.want, got, why)
			require.Contains(t, why, tc.why)
		})
	}
}

// A VF as the fixture scan reports it.
func ethVF() nic.Device {
	return nic.Device{PCIAddress: "0000:3b:00.2", Driver: "mlx5_core", PFAddress: "0000:3b:00.0", VFIndex: 0, Netdev: "ens1f0v0",
		PFNetdev: "ens1f0np0", LinkType: rdma.LinkLayerEthernet, RDMADevice: "mlx5_2"}
}

func hostLink(name string) *netlink.LinkAttrs {
	mac, _ := net.ParseMAC("0a:00:00:00:00:01")
	return &netlink.LinkAttrs{Name: name, HardwareAddr: mac, MTU: 1500, Alias: "", Flags: net.FlagUp}
}

func mustConf(t *testing.T, extra string) *NetConf {
	t.Helper()
	if extra != "" {
		extra = "," + extra
	}
	c, err := parseConf([]byte(`{"cniVersion":"1.1.0","name":"n","type":"sriov","deviceID":"0000:3b:00.2"` + extra + `}`))
	require.NoError(t, err)
	return c
}

func TestPlanAdd(t *testing.T) {
	args := &skel.CmdArgs{ContainerID: "c1", IfName: "net1", Netns: "/var/run/netns/pod"}
	orig := sriov.VFConfig{MAC: "00:00:00:00:00:00", SpoofChk: true, Proto: sriov.VlanProto8021Q}
	facts := func(change func(*addFacts)) *addFacts {
		f := &addFacts{VF: "0000:3b:00.2", HostRoot: "/host", BootID: "boot", Device: ethVF(),
			RDMAMode: RDMAModeExclusive, HostLink: hostLink("ens1f0v0"), VFOrig: &orig}
		if change != nil {
			change(f)
		}
		return f
	}
	for _, tc := range []struct {
		name  string
		conf  string
		facts *addFacts
		check func(t *testing.T, p *addPlan)
		code  uint
		err   string
	}{
		{"plain: the netdev and its RDMA device move", "", facts(nil), func(t *testing.T, p *addPlan) {
			require.Equal(t, &State{Phase: PhaseAdding, BootID: "boot", Network: "n", ContainerID: "c1", IfName: "net1",
				Netns: "/var/run/netns/pod", PCIAddress: "0000:3b:00.2", PFAddress: "0000:3b:00.0", PFNetdev: "ens1f0np0",
				LinkType: "Ethernet", HostName: "ens1f0v0", HostMAC: "0a:00:00:00:00:01", HostMTU: 1500, HostUp: true,
				PodMTU: 1500, RDMADevice: "mlx5_2"}, p.State)
			require.Empty(t, p.Settings)
			require.Empty(t, p.Notes)
		}, 0, ""},
		{"settings, MTU and MAC", `"vlan":5,"trust":"on","mtu":9000,"mac":"02:00:00:00:00:09","ipam":{"type":"static"}`, facts(nil), func(t *testing.T, p *addPlan) {
			require.Equal(t, []sriov.Setting{sriov.SettingVlan, sriov.SettingMAC, sriov.SettingTrust}, p.Settings)
			require.Equal(t, &orig, p.State.VFOrig)
			require.Equal(t, 9000, p.State.PodMTU)
			require.Equal(t, "02:00:00:00:00:09", p.State.PodMAC)
			require.Equal(t, "static", p.State.IPAMType)
			require.False(t, p.State.IPAMAdded, "an intent, set when IPAM starts")
			require.Empty(t, p.State.VFApplied, "intents, set as each setting starts")
		}, 0, ""},
		{"shared RDMA mode: left in place", "", facts(func(f *addFacts) { f.RDMAMode = RDMAModeShared }), func(t *testing.T, p *addPlan) {
			require.Empty(t, p.State.RDMADevice)
			require.Len(t, p.Notes, 1)
			require.Equal(t, slog.LevelInfo, p.Notes[0].level)
			require.Contains(t, p.Notes[0].msg, "RDMA netns mode is shared")
		}, 0, ""},
		{"no RDMA netlink: warned", "", facts(func(f *addFacts) { f.RDMAMode, f.RDMAModeErr = "", ErrNoRDMANetlink }), func(t *testing.T, p *addPlan) {
			require.Empty(t, p.State.RDMADevice)
			require.Equal(t, slog.LevelWarn, p.Notes[0].level)
		}, 0, ""},
		{"GUID from sysfs is the original", `"guid":"02:00:00:00:00:00:00:01"`, facts(func(f *addFacts) {
			f.Device.LinkType = rdma.LinkLayerInfiniBand
			f.GUID = "00:11:22:33:44:55:66:77"
		}), func(t *testing.T, p *addPlan) {
			require.Equal(t, "00:11:22:33:44:55:66:77", p.State.VFOrig.GUID)
			require.Equal(t, []sriov.Setting{sriov.SettingGUID}, p.Settings)
		}, 0, ""},
		{"vfio: IPAM and settings only", `"vlan":5`, facts(func(f *addFacts) {
			f.Device.Driver, f.Device.Netdev, f.Device.RDMADevice, f.Device.LinkType = pci.DriverVFIO, "", "", ""
			f.HostLink = nil
		}), func(t *testing.T, p *addPlan) {
			require.True(t, p.State.VFIO)
			require.Empty(t, p.State.HostName)
		}, 0, ""},

		{"VF not in sysfs", "", facts(func(f *addFacts) { f.DeviceErr = fmt.Errorf("pci 0000:3b:00.2: %w", pci.ErrNotFound) }), nil,
			types.ErrInvalidNetworkConfig, "no such PCI function under /host/sys/bus/pci/devices"},
		{"sysfs unreadable", "", facts(func(f *addFacts) { f.DeviceErr = errors.New("permission denied") }), nil, 0, "read sysfs: permission denied"},
		{"a PF", "", facts(func(f *addFacts) { f.Device.PFAddress, f.Device.VFIndex = "", -1 }), nil,
			types.ErrInvalidNetworkConfig, "is a PF, not a VF"},
		{"MAC on InfiniBand", `"mac":"02:00:00:00:00:01"`, facts(func(f *addFacts) { f.Device.LinkType = rdma.LinkLayerInfiniBand }), nil,
			types.ErrInvalidNetworkConfig, "an InfiniBand VF has no Ethernet MAC"},
		{"VLAN on InfiniBand", `"vlan":3`, facts(func(f *addFacts) { f.Device.LinkType = rdma.LinkLayerInfiniBand }), nil,
			types.ErrInvalidNetworkConfig, "no VLAN"},
		{"GUID on Ethernet", `"guid":"02:00:00:00:00:00:00:01"`, facts(nil), nil, types.ErrInvalidNetworkConfig, "guid is for InfiniBand VFs"},
		{"GUID not readable", `"guid":"02:00:00:00:00:00:00:01"`, facts(func(f *addFacts) { f.Device.LinkType = rdma.LinkLayerInfiniBand }), nil,
			types.ErrInvalidNetworkConfig, "current GUID cannot be read"},
		{"settings without a PF netdev", `"trust":"on"`, facts(func(f *addFacts) { f.Device.PFNetdev = "" }), nil,
			types.ErrInvalidNetworkConfig, "VF settings need the PF's netdev"},
		{"isolation in shared mode", `"rdmaIsolation":true`, facts(func(f *addFacts) { f.RDMAMode = RDMAModeShared }), nil, 0,
			`RDMA subsystem is in "shared" netns mode`},
		{"isolation without RDMA netlink", `"rdmaIsolation":true`, facts(func(f *addFacts) { f.RDMAModeErr = ErrNoRDMANetlink }), nil, 0,
			"RDMA netns mode cannot be read: RDMA netlink unavailable"},
		{"isolation without an RDMA device", `"rdmaIsolation":true`, facts(func(f *addFacts) { f.Device.RDMADevice = "" }), nil, 0,
			"the VF (mlx5_core) has no RDMA device (is mlx5_ib loaded?)"},
		{"isolation on a NIC without RDMA", `"rdmaIsolation":true`, facts(func(f *addFacts) { f.Device.RDMADevice, f.Device.Driver = "", "igbvf" }), nil, 0,
			"the VF (igbvf) has no RDMA device (Intel 82576/I350 functions (igb, igbvf) have no RDMA in the kernel)"},
		{"isolation on an E810 VF", `"rdmaIsolation":true`, facts(func(f *addFacts) { f.Device.RDMADevice, f.Device.Driver = "", "iavf" }), nil, 0,
			"the VF (iavf) has no RDMA device (irdma gives RDMA devices to ice PFs only, not to their VFs (iavf))"},
		{"no netdev", "", facts(func(f *addFacts) { f.Device.Netdev = "" }), nil, 0, "no netdev under /host/sys/bus/pci/devices/0000:3b:00.2/net"},
		{"netdev not in the host netns", "", facts(func(f *addFacts) { f.HostLink, f.HostLinkErr = nil, netlink.LinkNotFoundError{} }), nil, 0,
			"ens1f0v0 is not in the host netns (attached to another pod?)"},
		{"PF unreadable", `"spoofchk":"off"`, facts(func(f *addFacts) { f.VFOrig, f.VFOrigErr = nil, errors.New("no VF 0") }), nil, 0,
			"read VF settings on PF ens1f0np0: no VF 0"},
		{"rate bound against the VF's", `"min_tx_rate":500`, facts(func(f *addFacts) { f.VFOrig = &sriov.VFConfig{MaxTxRate: 100} }), nil,
			types.ErrInvalidNetworkConfig, "min_tx_rate 500 would be above the VF's max_tx_rate 100"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := planAdd(mustConf(t, tc.conf), args, tc.facts)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				require.ErrorContains(t, err, "VF 0000:3b:00.2")
				require.Nil(t, p)
				want := tc.code
				if want == 0 {
					want = types.ErrInternal
				}
				require.Equal(t, want, CNIError(err).Code)
				return
			}
			require.NoError(t, err)
			tc.check(t, p)
		})
	}
}
