package plugin

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// A state is evidence, not instructions (evidence.go): the review's
// reproductions of issue 44 and the cases around them. Each plants what a
// stale, damaged or forged file leaves in the state dir and checks that
// nothing but the VF the file is filed under is touched.

// hostLinkOf is a link in the test's (the plugin's host) netns with what
// teardown could change on it.
type hostLinkOf struct {
	name, mac, alias string
	index, mtu       int
}

func hostLinkSnapshot(t *testing.T, name string) hostLinkOf {
	t.Helper()
	l, err := netlink.LinkByName(name)
	require.NoError(t, err, "host link %s", name)
	a := l.Attrs()
	return hostLinkOf{name: a.Name, mac: a.HardwareAddr.String(), alias: a.Alias, index: a.Index, mtu: a.MTU}
}

// requireUnchanged checks the host link is still there as snapshot saw it.
func requireUnchanged(t *testing.T, was hostLinkOf) {
	t.Helper()
	l, err := netlink.LinkByIndex(was.index)
	require.NoError(t, err, "host link %s", was.name)
	a := l.Attrs()
	require.Equal(t, was, hostLinkOf{name: a.Name, mac: a.HardwareAddr.String(), alias: a.Alias, index: a.Index, mtu: a.MTU})
}

// bridge makes a bridge in the test's netns, with an address of its own.
func bridge(t *testing.T, name string) hostLinkOf {
	t.Helper()
	mac, _ := net.ParseMAC("0a:00:00:00:00:" + testnet.RandHex(1))
	require.NoError(t, netlink.LinkAdd(&netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1500, HardwareAddr: mac}}))
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	return hostLinkSnapshot(t, name)
}

// (a) A garbage <pci>.json and a <pci>.netns that leads to the plugin's own
// netns: the DEL after a refused ADD renamed a host link (eth0p -> dev7).
// Now the pin is not followed nor taken for a temporary netns, the host's
// links are left alone, and the pin is removed without being followed.
func TestDelGarbageStateAndForeignPin(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(t *testing.T, path string)
	}{
		{"symlink to the own netns", func(t *testing.T, path string) {
			require.NoError(t, os.Symlink("/proc/self/ns/net", path))
		}},
		{"regular file", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, []byte("not a namespace"), 0o600))
		}},
		{"own netns bind-mounted", func(t *testing.T, path string) {
			require.NoError(t, os.WriteFile(path, nil, 0o600))
			require.NoError(t, unix.Mount("/proc/self/ns/net", path, "", unix.MS_BIND, ""))
			t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "roce-cx6dx")
			testnet.Veth(t, nil, "eth0p", "eth0pp")
			eth0p, peer := hostLinkSnapshot(t, "eth0p"), hostLinkSnapshot(t, "eth0pp")
			vf := "0000:3b:00.2"
			conf := e.conf(`"deviceID":"` + vf + `"`)
			require.NoError(t, os.MkdirAll(e.stateDir, 0o700))
			require.NoError(t, os.WriteFile(filepath.Join(e.stateDir, vf+".json"), []byte("\x00garbage{"), 0o600))
			tc.plant(t, filepath.Join(e.stateDir, vf+".netns"))

			_, err := e.add(conf, "/proc/self/ns/net", "c1", "net1")
			require.Error(t, err, "ADD into the host netns is refused")
			require.NoError(t, e.del(conf, e.pod(), "c1", "net1"))

			requireUnchanged(t, eth0p)
			requireUnchanged(t, peer)
			require.Empty(t, pfChanges(e.pf))
			require.Contains(t, e.log.String(), "not one this plugin made")
			_, err = os.Lstat(filepath.Join(e.stateDir, vf+".netns"))
			require.ErrorIs(t, err, os.ErrNotExist, "the foreign pin is removed, not followed")
			require.Contains(t, ls(t, e.stateDir), vf+".json.bad")
		})
	}
}

// (b) A forged state of this boot (it needs only the boot ID) for a VF
// whose pod is gone, naming a bridge as the VF's netdev and another PF's
// VF 3: ADD's reclaim changed the bridge's MTU, MAC and alias and sent
// vlan, trust and spoofchk to that VF. Now the kernel does not confirm the
// state, which is set aside; the bridge and the other PF are untouched.
func TestAddForgedStateTouchesNothingElse(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	br := bridge(t, "fpbr0")
	vf := "0000:3b:00.2"
	forged := &State{Phase: PhaseAdded, BootID: BootID(), Network: "other-net", ContainerID: "gone", IfName: "net1",
		Netns: filepath.Join(t.TempDir(), "no-such-netns"), PCIAddress: vf,
		PFAddress: "0000:3b:00.1", PFNetdev: "ens1f1np1", VFIndex: 3,
		HostName: "fpbr0", HostMAC: "02:66:6f:72:67:64", HostMTU: 9000, HostAlias: "forged", HostUp: true, PodMAC: "02:00:00:00:00:01",
		LinkMoved: true, VFApplied: []sriov.Setting{sriov.SettingVlan, sriov.SettingTrust, sriov.SettingSpoofChk},
		VFOrig: &sriov.VFConfig{Vlan: 42, Proto: sriov.VlanProto8021Q, Trust: true, SpoofChk: false, MAC: "00:00:00:00:00:00"}}
	require.NoError(t, e.store().Save(forged))
	require.NotEmpty(t, forged.BootID, "the forgery needs this boot's ID")

	// No stand-in for the VF: the ADD fails once past the state.
	_, err := e.add(e.conf(`"deviceID":"`+vf+`"`), e.pod(), "c1", "net1")
	require.Error(t, err)

	requireUnchanged(t, br)
	require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f1np1", 3), "the other PF's VF 3")
	require.Empty(t, pfChanges(e.pf))
	require.Contains(t, e.log.String(), "does not match the kernel")
	require.Contains(t, ls(t, e.stateDir), vf+".json.bad")
}

// A state ADD wrote, then changed (a restored backup, another node's file,
// a forgery): DEL sets it aside, acts on nothing it names that the kernel
// does not confirm, and still brings the VF's netdev home by its PCI
// address; CHECK reports it.
func TestDelStateNotTheKernels(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(st *State)
		want   string // in the log; "" for a state the kernel confirms
	}{
		{"right VF, another PF", func(st *State) { st.PFAddress, st.PFNetdev = "0000:3b:00.1", "ens1f1np1" },
			"pfAddress 0000:3b:00.1 does not match the kernel's 0000:3b:00.0"},
		{"PF netdev of another PF", func(st *State) { st.PFNetdev = "ens1f1np1" },
			"pfNetdev ens1f1np1 does not match the kernel's"},
		{"wrong VF index", func(st *State) { st.VFIndex = 3 }, "vfIndex 3 does not match the kernel's 1"},
		{"RDMA device of another VF", func(st *State) { st.RDMADevice = "mlx5_9" }, "rdmaDevice mlx5_9 does not match"},
		{"host name of another device", func(st *State) { st.HostName = "fpbr0" }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "roce-cx6dx")
			br := bridge(t, "fpbr0")
			orig := e.standIn("ens1f0v1")
			vf := "0000:3b:00.3"
			podNS := e.pod()
			conf := e.conf(`"deviceID":"` + vf + `","vlan":100,"mtu":4000`)
			res, err := e.add(conf, podNS, "c1", "net1")
			require.NoError(t, err)
			require.Equal(t, 100, e.pf.Get("ens1f0np0", 1).Vlan)
			st, err := e.store().Load(vf)
			require.NoError(t, err)
			tc.change(st)
			require.NoError(t, e.store().Save(st))
			e.pf.ResetCalls()

			checkErr := e.check(conf, res, podNS, "c1", "net1")
			require.NoError(t, e.del(conf, podNS, "c1", "net1"))

			requireUnchanged(t, br)
			require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f1np1", 3))
			require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f1np1", 1))
			_, err = linkIn(t, podNS, "net1")
			require.Error(t, err, "the VF's netdev left the pod")
			if tc.want == "" {
				// Confirmed: the whole journal is undone, but the host
				// name taken by the bridge is not the VF's to take.
				require.ErrorContains(t, checkErr, "is not the VF's netdev fpbr0", "CHECK finds the drift")
				require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 1))
				require.Contains(t, e.log.String(), "original name is taken")
				return
			}
			require.ErrorContains(t, checkErr, tc.want)
			require.Contains(t, e.log.String(), tc.want)
			require.Empty(t, pfChanges(e.pf), "nothing sent to any PF from the state")
			require.Contains(t, ls(t, e.stateDir), vf+".json.bad")
			l, err := netlink.LinkByName(orig.Attrs().Name)
			require.NoError(t, err, "the VF's netdev is home under its own name, found by its PCI address")
			require.Equal(t, orig.Attrs().HardwareAddr.String(), l.Attrs().HardwareAddr.String())
		})
	}
}

// A state naming a netdev in the host that is not the VF's (the VF's own
// is gone): teardown leaves that link as it is.
func TestTeardownLeavesOtherHostLinks(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	br := bridge(t, "fpbr0")
	testnet.Veth(t, nil, "eth0p", "eth0pp")
	eth0p := hostLinkSnapshot(t, "eth0p")
	vf := "0000:3b:00.4"
	// A state the kernel confirms, but for the host name and alias.
	st := &State{Version: StateVersion, Phase: PhaseAdded, BootID: BootID(), Network: "rdma-net", ContainerID: "c1", IfName: "eth0p",
		PCIAddress: vf, PFAddress: "0000:3b:00.0", PFNetdev: "ens1f0np0", VFIndex: 2,
		HostName: "fpbr0", HostMTU: 9000, HostAlias: "forged", HostMAC: "02:66:6f:72:67:64", PodMAC: "02:00:00:00:00:01", LinkMoved: true}
	require.NoError(t, e.store().Save(st))
	require.NoError(t, e.del(e.conf(`"deviceID":"`+vf+`"`), "", "c1", "eth0p"))
	requireUnchanged(t, br)
	requireUnchanged(t, eth0p)
	require.Contains(t, e.log.String(), "not the VF's own is never touched")
}

// GC skips a state the kernel does not confirm: the forged state of
// TestAddForgedStateTouchesNothingElse, of this network and not valid.
func TestGCSkipsStateNotTheKernels(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	br := bridge(t, "fpbr0")
	vf := "0000:3b:00.2"
	require.NoError(t, e.store().Save(&State{Phase: PhaseAdded, BootID: BootID(), Network: "rdma-net", ContainerID: "gone", IfName: "net1",
		PCIAddress: vf, PFAddress: "0000:3b:00.0", PFNetdev: "ens1f1np1", VFIndex: 3, HostName: "fpbr0", HostMTU: 9000, HostAlias: "forged",
		LinkMoved: true, VFApplied: []sriov.Setting{sriov.SettingVlan}, VFOrig: &sriov.VFConfig{Vlan: 42, Proto: sriov.VlanProto8021Q}}))
	require.NoError(t, e.p.GC(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(e.conf(`"cni.dev/valid-attachments":[]`))}))
	requireUnchanged(t, br)
	require.Empty(t, pfChanges(e.pf))
	require.Contains(t, e.log.String(), "vfIndex 3 does not match the kernel's 0")
}

// Upstream sriov-cni's cache naming a deviceID that is no VF in sysfs,
// with another PF's VF 3 as Master and VFID: set aside, that VF untouched.
func TestDelUpstreamCacheNotTheKernels(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	podNS := e.pod()
	const ghost = "0000:3b:07.7"
	cache := strings.NewReplacer(upstreamVF, ghost, `"Master":"`+upstreamPF+`"`, `"Master":"ens1f1np1"`, `"VFID":0`, `"VFID":3`).
		Replace(upstreamCacheOf(e, "0a:00:00:00:00:01"))
	require.Contains(t, cache, `"VFID":3`)
	require.NoError(t, os.MkdirAll(e.stateDir, 0o700))
	require.NoError(t, os.WriteFile(filepath.Join(e.stateDir, "c1-net1"), []byte(cache), 0o600))
	e.pf.Set("ens1f1np1", 3, upstreamSettings)
	e.pf.ResetCalls()

	require.NoError(t, e.del(e.conf(`"deviceID":"`+ghost+`"`), podNS, "c1", "net1"))
	require.Empty(t, pfChanges(e.pf))
	require.Equal(t, upstreamSettings, e.pf.Get("ens1f1np1", 3))
	require.Contains(t, ls(t, e.stateDir), "c1-net1.bad")
	require.Contains(t, e.log.String(), ghost)
}

// The pod renamed the VF's netdev and dressed a veth of its own as it
// (CNI_IFNAME, the alias ADD set): DEL takes the VF by its device and
// leaves the veth in the pod, rather than handing the pod a link into the
// host netns.
func TestDelTakesTheVFNotAnAliasedImpostor(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v1")
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:00.3"`)
	_, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	pod := mustOpen(t, podNS)
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetDown(l))
	require.NoError(t, pod.Handle().LinkSetName(l, "eth9"))
	require.NoError(t, pod.Handle().LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "net1"}, PeerName: "net1peer"}))
	imp, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetAlias(imp, "ens1f0v1"))
	vf, err := pod.Handle().LinkByName("eth9")
	require.NoError(t, err)
	require.Equal(t, "0000:3b:00.3", e.p.NetdevPCI(vf), "the stand-in is told for its VF in the pod, renamed")
	require.Empty(t, e.p.NetdevPCI(imp))

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(orig, "0000:3b:00.3")
	_, err = linkIn(t, podNS, "net1")
	require.NoError(t, err, "the pod's own veth stays in the pod")
	_, err = netlink.LinkByName("net1peer")
	require.Error(t, err, "nothing of the pod's reached the host")
}
