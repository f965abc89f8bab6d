package plugin

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

func TestMain(m *testing.M) {
	code := testnet.Main(m)
	testbin.Cleanup()
	os.Exit(code)
}

func requireRoot(t *testing.T) {
	t.Helper()
	testnet.RequireRoot(t, "creates network namespaces and veth links standing in for VFs")
}

func fixtureRoot(name string) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "..", "..", "testdata", "sysfs", name))
	if err != nil {
		panic(err)
	}
	return p
}

// env runs the plugin in-process against a fixture host, with veth links
// named as the fixture's VF netdevs standing in for the VFs, real network
// namespaces, the reference IPAM plugins, and fakes for the PF and RDMA
// netlink calls this kernel cannot do. The VFs' driver is played as igbvf
// (igbVF, the strictest about the netdev's own MAC); p.VFDriver nil is
// mlx5's behaviour.
type env struct {
	t        *testing.T
	p        *Plugin
	pf       *sriovtest.PFLink
	vfDriver *igbVF
	rdma     *fakeRDMA
	cniPath  string
	stateDir string
	ipamDir  string
	log      bytes.Buffer
	// vfOf is the VF each stand-in is, by an alternative name of the
	// stand-in's (standInPCI).
	vfOf map[string]string
}

func newEnv(t *testing.T, fixture string) *env {
	requireRoot(t)
	e := &env{t: t, pf: sriovtest.NewPFLink(), rdma: newFakeRDMA(RDMAModeExclusive)}
	e.cniPath = testbin.Build(t, testbin.HostLocal, testbin.Static)
	dir := t.TempDir()
	e.stateDir, e.ipamDir = filepath.Join(dir, "state"), filepath.Join(dir, "ipam")
	e.p = &Plugin{
		HostRoot:  fixtureRoot(fixture),
		Node:      testNode(e.stateDir, filepath.Join(dir, "devinfo")),
		NewPFLink: func(*netlink.Handle) sriov.PFLink { return e.pf },
		RDMA:      e.rdma,
		NewPodResources: func(string) PodResources {
			t.Fatal("PodResources asked though the conf has a deviceID")
			return nil
		},
		Stderr: &e.log,
	}
	e.vfDriver = newIgbVF(e.pf)
	e.p.VFDriver = e.vfDriver
	e.vfOf = map[string]string{}
	e.p.NetdevPCI = e.standInPCI
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", e.log.String())
		}
	})
	return e
}

func (e *env) store() *Store {
	s, err := NewStore(e.stateDir, nil)
	require.NoError(e.t, err)
	return s
}

// standIn creates a veth named as a fixture VF netdev (testnet.StandIn),
// which standInPCI then tells for that VF's; one of another name is no
// VF's.
func (e *env) standIn(name string) netlink.Link {
	e.t.Helper()
	l := testnet.StandIn(e.t, nil, name)
	vfs, err := filepath.Glob(filepath.Join(e.p.HostRoot, "sys/bus/pci/devices/*/net", name))
	require.NoError(e.t, err)
	if len(vfs) == 1 {
		alt := "fpvf" + testnet.RandHex(4)
		require.NoError(e.t, netlink.LinkAddAltName(l, alt))
		e.vfOf[alt] = filepath.Base(filepath.Dir(filepath.Dir(vfs[0])))
	}
	return l
}

// standInPCI plays the kernel's IFLA_PARENT_DEV_NAME (Plugin.NetdevPCI)
// for the stand-ins: a VF netdev's parent device is its VF under any name,
// in any netns, as the kernel reports it (rtnl_fill_ifinfo puts
// dev_name(dev->dev.parent), net/core/rtnetlink.c, since 5.15); the
// stand-in is told by an alternative name standIn gave it, which the
// kernel keeps across renames and moves to another netns (the netdev's
// name nodes move with it in __dev_change_net_namespace,
// net/core/dev.c). Every other link, the peers included, has no PCI
// parent, as a bridge or veth has none.
func (e *env) standInPCI(l netlink.Link) string {
	for _, alt := range l.Attrs().AltNames {
		if vf, ok := e.vfOf[alt]; ok {
			return vf
		}
	}
	return ""
}

// pod creates a named network namespace and returns its path.
func (e *env) pod() string {
	e.t.Helper()
	_, path := testnet.Netns(e.t, "fp-test-")
	return path
}

func (e *env) args(conf, netnsPath, cid, ifName string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: cid, Netns: netnsPath, IfName: ifName, Path: e.cniPath, StdinData: []byte(conf),
		Args: "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=trainer-0"}
}

func (e *env) add(conf, netnsPath, cid, ifName string) (*current.Result, error) {
	var out bytes.Buffer
	e.p.Stdout = &out
	if err := e.p.Add(e.args(conf, netnsPath, cid, ifName)); err != nil {
		return nil, err
	}
	r, err := current.NewResult(out.Bytes())
	require.NoError(e.t, err, "result: %s", out.String())
	return r.(*current.Result), nil
}

func (e *env) del(conf, netnsPath, cid, ifName string) error {
	return e.p.Del(e.args(conf, netnsPath, cid, ifName))
}

func (e *env) check(conf string, prev *current.Result, netnsPath, cid, ifName string) error {
	var c map[string]any
	require.NoError(e.t, json.Unmarshal([]byte(conf), &c))
	raw, err := json.Marshal(prev)
	require.NoError(e.t, err)
	var pr map[string]any
	require.NoError(e.t, json.Unmarshal(raw, &pr))
	c["prevResult"] = pr
	data, err := json.Marshal(c)
	require.NoError(e.t, err)
	return e.p.Check(e.args(string(data), netnsPath, cid, ifName))
}

// conf is a network conf for the env, with extra JSON members.
func (e *env) conf(extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rdma-net","type":"sriov","stateDir":%q%s}`, e.stateDir, extra)
}

func (e *env) hostLocal(subnet string, more string) string {
	if more != "" {
		more = "," + more
	}
	return fmt.Sprintf(`"ipam":{"type":"host-local","ranges":[[{"subnet":%q}]],"dataDir":%q%s}`, subnet, e.ipamDir, more)
}

func linkIn(t *testing.T, netnsPath, name string) (netlink.Link, error) {
	t.Helper()
	n, err := netns.Open(netnsPath)
	require.NoError(t, err)
	defer n.Close()
	return n.Handle().LinkByName(name)
}

// requireRestored checks the stand-in is back on the host as it was, and
// nothing of the attachment is left.
func (e *env) requireRestored(orig netlink.Link, vf string) {
	e.t.Helper()
	l, err := netlink.LinkByName(orig.Attrs().Name)
	require.NoError(e.t, err, "stand-in %s back on the host", orig.Attrs().Name)
	a := l.Attrs()
	require.Equal(e.t, orig.Attrs().HardwareAddr.String(), a.HardwareAddr.String(), "MAC restored")
	require.Equal(e.t, orig.Attrs().MTU, a.MTU, "MTU restored")
	require.Equal(e.t, orig.Attrs().Alias, a.Alias, "alias restored")
	require.Equal(e.t, orig.Attrs().Flags&net.FlagUp, a.Flags&net.FlagUp, "up state restored")
	_, err = os.Stat(filepath.Join(e.stateDir, vf+".json"))
	require.ErrorIs(e.t, err, fs.ErrNotExist, "state removed")
	_, err = os.Stat(filepath.Join(e.stateDir, vf+".lock"))
	require.ErrorIs(e.t, err, fs.ErrNotExist, "lock removed")
}

// ipamLeases lists host-local's allocations for the env's network.
func (e *env) ipamLeases() []string {
	ents, _ := os.ReadDir(filepath.Join(e.ipamDir, "rdma-net"))
	var ips []string
	for _, x := range ents {
		if net.ParseIP(x.Name()) != nil {
			ips = append(ips, x.Name())
		}
	}
	return ips
}

func TestAddCheckDelRoCE(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v0")
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:00.2","vlan":100,"vlanQoS":2,"mac":"02:fa:57:00:00:01","mtu":4000,` +
		`"spoofchk":"off","trust":"on","runtimeConfig":{"CNIDeviceInfoFile":"` + filepath.Join(e.stateDir, "..", "devinfo", "x.json") + `"},` +
		e.hostLocal("10.77.0.0/24", ""))

	res, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)

	// The result.
	require.Len(t, res.Interfaces, 1)
	require.Equal(t, current.Interface{Name: "net1", Mac: "02:fa:57:00:00:01", Mtu: 4000, Sandbox: podNS, PciID: "0000:3b:00.2"}, *res.Interfaces[0])
	require.Len(t, res.IPs, 1)
	require.Equal(t, "10.77.0.2/24", res.IPs[0].Address.String())
	require.Equal(t, 0, *res.IPs[0].Interface)

	// The pod has the VF's netdev, renamed, configured and up.
	l, err := linkIn(t, podNS, "net1")
	require.NoError(t, err)
	require.Equal(t, "02:fa:57:00:00:01", l.Attrs().HardwareAddr.String())
	require.Equal(t, 4000, l.Attrs().MTU)
	require.Equal(t, "ens1f0v0", l.Attrs().Alias)
	require.NotZero(t, l.Attrs().Flags&net.FlagUp)
	n, err := netns.Open(podNS)
	require.NoError(t, err)
	addrs, err := n.Handle().AddrList(l, netlink.FAMILY_V4)
	n.Close()
	require.NoError(t, err)
	require.Len(t, addrs, 1)
	require.Equal(t, "10.77.0.2/24", addrs[0].IPNet.String())
	_, err = netlink.LinkByName("ens1f0v0")
	require.Error(t, err, "gone from the host")

	// The PF got the VF settings, in order; the RDMA device moved along.
	require.Equal(t, []string{
		"VF ens1f0np0 0",
		"SetVFVlan ens1f0np0 0 100 2 0x8100",
		"SetVFMAC ens1f0np0 0 02:fa:57:00:00:01",
		"SetVFSpoofChk ens1f0np0 0 false",
		"SetVFTrust ens1f0np0 0 true",
	}, e.pf.Calls())
	require.False(t, e.rdma.InHost("mlx5_2"))
	ok, err := e.rdma.Present("mlx5_2", mustOpen(t, podNS))
	require.NoError(t, err)
	require.True(t, ok, "mlx5_2 in the pod netns")

	// State: versioned, 0600, phase added.
	st, err := e.store().Load("0000:3b:00.2")
	require.NoError(t, err)
	require.Equal(t, PhaseAdded, st.Phase)
	require.Equal(t, "ens1f0v0", st.HostName)
	require.True(t, st.RDMAMoved)
	fi, err := os.Stat(filepath.Join(e.stateDir, "0000:3b:00.2.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())

	// The device-info file.
	di, err := os.ReadFile(filepath.Join(e.stateDir, "..", "devinfo", "x.json"))
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:3b:00.2","rdma-device":"mlx5_2","pf-pci-address":"0000:3b:00.0"}}`, string(di))

	require.NoError(t, e.check(conf, res, podNS, "c1", "net1"))

	// A second ADD of the same VF is refused, and changes nothing.
	_, err = e.add(conf, e.pod(), "c2", "net1")
	require.Error(t, err)
	require.Equal(t, types.ErrTryAgainLater, CNIError(err).Code)
	require.Contains(t, err.Error(), "0000:3b:00.2")
	require.Contains(t, err.Error(), "container c1")

	e.pf.ResetCalls()
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(orig, "0000:3b:00.2")
	require.Equal(t, []string{
		"SetVFTrust ens1f0np0 0 false",
		"SetVFSpoofChk ens1f0np0 0 true",
		"SetVFMAC ens1f0np0 0 00:00:00:00:00:00",
		"SetVFVlan ens1f0np0 0 0 0 0x8100",
	}, e.pf.Calls())
	require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 0))
	require.True(t, e.rdma.InHost("mlx5_2"))
	require.Empty(t, e.ipamLeases(), "address released")
	_, err = os.Stat(filepath.Join(e.stateDir, "..", "devinfo", "x.json"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	_, err = linkIn(t, podNS, "net1")
	require.Error(t, err)

	// DEL again is a no-op.
	e.pf.ResetCalls()
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	require.Empty(t, e.pf.Calls())
	e.requireRestored(orig, "0000:3b:00.2")
}

// pfChanges are the calls that changed a VF setting (reads left out).
func pfChanges(pf *sriovtest.PFLink) []string {
	var set []string
	for _, c := range pf.Calls() {
		if strings.HasPrefix(c, "Set") {
			set = append(set, c)
		}
	}
	return set
}

func mustOpen(t *testing.T, path string) *netns.NS {
	t.Helper()
	n, err := netns.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	return n
}

// The pod netns is destroyed before DEL: the kernel hands a physical VF
// back to the host netns under its pod name. A veth would die with the
// netns, so the test moves it out first, as the kernel would.
func TestDelAfterNetnsDeleted(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	orig := e.standIn("ibp220s0v0")
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:dc:00.1","mtu":2044,` + e.hostLocal("10.78.0.0/24", ""))
	_, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)

	pod := mustOpen(t, podNS)
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	host, err := netns.Current()
	require.NoError(t, err)
	defer host.Close()
	require.NoError(t, pod.Handle().LinkSetNsFd(l, host.Fd()))
	e.rdma.where = map[string]string{} // the kernel returns the RDMA device too
	out, err := exec.Command("ip", "netns", "del", filepath.Base(podNS)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = netlink.LinkByName("net1")
	require.NoError(t, err, "returned under its pod name")

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(orig, "0000:dc:00.1")
	require.Empty(t, e.ipamLeases())
	require.NoError(t, e.del(conf, podNS, "c1", "net1"), "and again")
}

// A failure at any step of ADD leaves the node as it was.
func TestAddRollsBack(t *testing.T) {
	for _, tc := range []struct {
		name   string
		extra  string
		inject func(e *env, podNS string)
		want   string
	}{
		{"PF refuses trust", `"trust":"on","spoofchk":"off","vlan":7`,
			func(e *env, _ string) { e.pf.FailNext("SetVFTrust", errors.New("operation not supported")) },
			"VF settings on PF ens1f0np0: set trust: operation not supported"},
		{"pod already has net1", `"vlan":7`,
			func(e *env, podNS string) {
				require.NoError(e.t, exec.Command("ip", "-n", filepath.Base(podNS), "link", "add", "net1", "type", "veth", "peer", "name", "other").Run())
			},
			"an interface named net1 is already there"},
		{"RDMA move fails", `"vlan":7`,
			func(e *env, _ string) { e.rdma.failMove = errors.New("device busy") },
			"move RDMA device mlx5_2 into the pod: device busy"},
		{"IPAM plugin missing", `"ipam":{"type":"no-such-ipam"}`, nil, `IPAM no-such-ipam ADD: IPAM plugin "no-such-ipam"`},
		{"routes cannot be configured", `"vlan":7,` + `"ipam":{"type":"host-local","ranges":[[{"subnet":"10.79.0.0/24"}]],"routes":[{"dst":"10.200.0.0/16","gw":"10.99.99.1"}],"dataDir":"IPAMDIR"}`, nil,
			"configure addresses and routes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "roce-cx6dx")
			orig := e.standIn("ens1f0v0")
			podNS := e.pod()
			extra := strings.ReplaceAll(tc.extra, "IPAMDIR", e.ipamDir)
			if !strings.Contains(extra, "ipam") {
				extra += "," + e.hostLocal("10.79.0.0/24", "")
			}
			conf := e.conf(`"deviceID":"0000:3b:00.2","mtu":4000,"mac":"02:fa:57:00:00:09",` + extra)
			if tc.inject != nil {
				tc.inject(e, podNS)
			}
			_, err := e.add(conf, podNS, "c1", "net1")
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "VF 0000:3b:00.2")
			e.requireRestored(orig, "0000:3b:00.2")
			require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 0))
			require.True(t, e.rdma.InHost("mlx5_2"))
			require.Empty(t, e.ipamLeases(), "no address leaked")
			// The runtime's DEL after a failed ADD is fine too.
			require.NoError(t, e.del(conf, podNS, "c1", "net1"))
		})
	}
}

func TestRDMAModes(t *testing.T) {
	t.Run("shared: left in place", func(t *testing.T) {
		e := newEnv(t, "roce-cx6dx")
		orig := e.standIn("ens1f0v1")
		podNS := e.pod()
		e.rdma.mode = RDMAModeShared
		conf := e.conf(`"deviceID":"0000:3b:00.3"`)
		_, err := e.add(conf, podNS, "c1", "net1")
		require.NoError(t, err)
		require.True(t, e.rdma.InHost("mlx5_3"))
		require.Contains(t, e.log.String(), "RDMA netns mode is shared")
		require.NoError(t, e.del(conf, podNS, "c1", "net1"))
		e.requireRestored(orig, "0000:3b:00.3")
	})
	for _, tc := range []struct {
		name    string
		mode    string
		modeErr error
		want    string
	}{
		{"isolation needs exclusive", RDMAModeShared, nil, `RDMA subsystem is in "shared" netns mode`},
		{"isolation needs RDMA netlink", "", ErrNoRDMANetlink, "RDMA netns mode cannot be read: RDMA netlink unavailable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "roce-cx6dx")
			orig := e.standIn("ens1f0v1")
			podNS := e.pod()
			e.rdma.mode, e.rdma.modeErr = tc.mode, tc.modeErr
			_, err := e.add(e.conf(`"deviceID":"0000:3b:00.3","rdmaIsolation":true,"vlan":3`), podNS, "c1", "net1")
			require.ErrorContains(t, err, tc.want)
			require.Empty(t, pfChanges(e.pf), "refused before anything changed")
			e.requireRestored(orig, "0000:3b:00.3")
		})
	}
	t.Run("no RDMA netlink, no isolation: warned, attached", func(t *testing.T) {
		e := newEnv(t, "roce-cx6dx")
		e.standIn("ens1f0v1")
		e.rdma.mode, e.rdma.modeErr = "", ErrNoRDMANetlink
		_, err := e.add(e.conf(`"deviceID":"0000:3b:00.3"`), e.pod(), "c1", "net1")
		require.NoError(t, err)
		require.Contains(t, e.log.String(), "RDMA device not moved")
	})
}

func TestCheckFindsDrift(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	e.standIn("ens1f1v0")
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:01.2",` + e.hostLocal("10.80.0.0/24", ""))
	res, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.NoError(t, e.check(conf, res, podNS, "c1", "net1"))

	pod := mustOpen(t, podNS)
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetMTU(l, 1280))
	err = e.check(conf, res, podNS, "c1", "net1")
	require.ErrorContains(t, err, "MTU is 1280, want 1500")

	err = e.check(conf, res, podNS, "c-unknown", "net1")
	require.Equal(t, types.ErrUnknownContainer, CNIError(err).Code)
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
}

func TestVFIOBoundVF(t *testing.T) {
	e := newEnv(t, "edge")
	// Its PCI class (0x020700) says InfiniBand even with no RDMA device
	// to ask: no VLAN.
	_, err := e.add(e.conf(`"deviceID":"0000:86:00.1","vlan":12`), e.pod(), "c0", "net1")
	require.ErrorContains(t, err, "an InfiniBand VF has no VLAN")
	require.Empty(t, pfChanges(e.pf), "refused before anything changed")
	e.pf.ResetCalls()
	conf := e.conf(`"deviceID":"0000:86:00.1","trust":"on","ipam":{"type":"static","addresses":[{"address":"10.81.0.5/24"}]}`)
	podNS := e.pod()
	res, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.Equal(t, "10.81.0.5/24", res.IPs[0].Address.String())
	require.Equal(t, "0000:86:00.1", res.Interfaces[0].PciID)
	require.Equal(t, []string{"VF ibp134s0 0", "SetVFTrust ibp134s0 0 true"}, e.pf.Calls())
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	require.False(t, e.pf.Get("ibp134s0", 0).Trust)
	_, err = os.Stat(filepath.Join(e.stateDir, "0000:86:00.1.json"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

func TestConfAgainstDevice(t *testing.T) {
	e := newEnv(t, "dgx-h100")
	orig := e.standIn("ibp220s0v1")
	for _, tc := range []struct{ extra, want string }{
		{`"deviceID":"0000:dc:00.2","mac":"02:00:00:00:00:01"`, "an InfiniBand VF has no Ethernet MAC to set: set guid"},
		{`"deviceID":"0000:dc:00.2","vlan":5`, "an InfiniBand VF has no VLAN"},
		{`"deviceID":"0000:dc:00.0"`, "is a PF, not a VF"},
		{`"deviceID":"0000:ff:00.1"`, "no such PCI function"},
	} {
		_, err := e.add(e.conf(tc.extra), e.pod(), "c1", "net1")
		require.ErrorContains(t, err, tc.want)
		require.Equal(t, types.ErrInvalidNetworkConfig, CNIError(err).Code, "%v", err)
	}
	require.Empty(t, pfChanges(e.pf), "refused before anything changed")
	e.requireRestored(orig, "0000:dc:00.2")

	// An InfiniBand GUID goes to the PF; DEL puts the sysfs node_guid back.
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:dc:00.2","guid":"02:00:00:00:00:00:00:42"`)
	_, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.Equal(t, "02:00:00:00:00:00:00:42", e.pf.Get("ibp220s0", 1).GUID)
	guid, err := os.ReadFile(filepath.Join(e.p.HostRoot, "sys/bus/pci/devices/0000:dc:00.2/infiniband/mlx5_41/node_guid"))
	require.NoError(t, err)
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	require.Equal(t, strings.TrimSpace(string(guid)), guidToSysfs(e.pf.Get("ibp220s0", 1).GUID))
}

// A GUID is two calls on the PF, node GUID then port GUID. When the port
// GUID is refused, the node GUID is changed already: the rollback puts it
// (and the port GUID) back to the original. When the node GUID is refused,
// nothing changed and nothing is restored.
func TestGUIDPartlyAppliedRollsBack(t *testing.T) {
	const vf = "0000:dc:00.2"
	e := newEnv(t, "dgx-h100")
	orig := e.standIn("ibp220s0v1")
	guid, err := os.ReadFile(filepath.Join(e.p.HostRoot, "sys/bus/pci/devices", vf, "infiniband/mlx5_41/node_guid"))
	require.NoError(t, err)
	conf := e.conf(`"deviceID":"` + vf + `","trust":"on","guid":"02:00:00:00:00:00:00:42"`)

	e.pf.FailNext("SetVFPortGUID", errors.New("operation not permitted"))
	_, err = e.add(conf, e.pod(), "c1", "net1")
	require.ErrorContains(t, err, "set guid: port GUID (node GUID set already): setting partly applied: operation not permitted")
	require.ErrorIs(t, err, sriov.ErrPartlyApplied)
	require.Equal(t, strings.TrimSpace(string(guid)), guidToSysfs(e.pf.Get("ibp220s0", 1).GUID), "node GUID put back")
	require.Equal(t, e.pf.Get("ibp220s0", 1).GUID, e.pf.PortGUID("ibp220s0", 1), "port GUID set to the original too")
	require.False(t, e.pf.Get("ibp220s0", 1).Trust, "the settings before it rolled back")
	e.requireRestored(orig, vf)

	e.pf.ResetCalls()
	e.pf.FailNext("SetVFGUID", errors.New("operation not supported"))
	_, err = e.add(conf, e.pod(), "c1", "net1")
	require.ErrorContains(t, err, "set guid: operation not supported")
	require.Equal(t, []string{"SetVFTrust ibp220s0 1 true", "SetVFGUID ibp220s0 1 02:00:00:00:00:00:00:42", "SetVFTrust ibp220s0 1 false"},
		pfChanges(e.pf), "a refused node GUID changed nothing: only trust is restored")
	e.requireRestored(orig, vf)
}

func guidToSysfs(g string) string {
	h := strings.ReplaceAll(g, ":", "")
	return h[0:4] + ":" + h[4:8] + ":" + h[8:12] + ":" + h[12:16]
}

func TestGCCollectsStaleAttachments(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	a, b := e.standIn("ens1f0v2"), e.standIn("ens1f0v3")
	podA, podB := e.pod(), e.pod()
	confA := e.conf(`"deviceID":"0000:3b:00.4",` + e.hostLocal("10.82.0.0/24", ""))
	confB := e.conf(`"deviceID":"0000:3b:00.5",` + e.hostLocal("10.82.0.0/24", ""))
	_, err := e.add(confA, podA, "ca", "net1")
	require.NoError(t, err)
	_, err = e.add(confB, podB, "cb", "net1")
	require.NoError(t, err)
	require.Len(t, e.ipamLeases(), 2)

	gc := e.conf(`"cni.dev/valid-attachments":[{"containerID":"cb","ifname":"net1"}],` + e.hostLocal("10.82.0.0/24", ""))
	require.NoError(t, e.p.GC(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(gc)}))
	e.requireRestored(a, "0000:3b:00.4")
	_, err = linkIn(t, podB, "net1")
	require.NoError(t, err, "the valid attachment stays")
	require.Len(t, e.ipamLeases(), 1)

	require.NoError(t, e.del(confB, podB, "cb", "net1"))
	e.requireRestored(b, "0000:3b:00.5")
}

func TestStatus(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	require.NoError(t, e.p.Status(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(e.conf(e.hostLocal("10.83.0.0/24", "")))}))

	file := filepath.Join(t.TempDir(), "file")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	node := e.p.Node
	e.p.Node.StateDir = filepath.Join(file, "state")
	err := e.p.Status(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(`{"cniVersion":"1.1.0","name":"n","type":"sriov"}`)})
	require.Equal(t, types.ErrPluginNotAvailable, CNIError(err).Code)
	e.p.Node = node

	err = e.p.Status(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(e.conf(`"ipam":{"type":"no-such-ipam"}`))})
	require.Equal(t, types.ErrPluginNotAvailable, CNIError(err).Code)
	require.ErrorContains(t, err, `IPAM no-such-ipam STATUS: IPAM plugin "no-such-ipam"`)

	e.rdma.mode = RDMAModeShared
	err = e.p.Status(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(e.conf(`"rdmaIsolation":true`))})
	require.ErrorContains(t, err, `RDMA netns mode is "shared"`)
}

// The pod's addresses are announced on the wire: a gratuitous ARP for the
// IPv4 address and, once DAD has passed, an unsolicited neighbour
// advertisement for the IPv6 one, both seen on the stand-in's peer.
func TestAddAnnouncesAddresses(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	e.standIn("ens1f1v2")
	peer := testnet.PeerOf(t, nil, "ens1f1v2")
	require.NoError(t, netlink.LinkSetUp(peer))
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW, int(htons(unix.ETH_P_ALL)))
	require.NoError(t, err)
	defer unix.Close(fd)
	require.NoError(t, unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: peer.Attrs().Index}))
	require.NoError(t, unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &unix.Timeval{Sec: 0, Usec: 200000}))

	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:01.4","ipam":{"type":"host-local","ranges":[[{"subnet":"10.84.0.0/24"}],[{"subnet":"fd00:84::/64"}]],"dataDir":"` + e.ipamDir + `"}`)
	res, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.Len(t, res.IPs, 2)
	v4, v6 := res.IPs[0].Address.IP.To4(), res.IPs[1].Address.IP.To16()
	mac := res.Interfaces[0].Mac

	var garp, na bool
	buf := make([]byte, 2048)
	for deadline := time.Now().Add(8 * time.Second); time.Now().Before(deadline) && !(garp && na); {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil || n < 14 {
			continue
		}
		f := buf[:n]
		src := net.HardwareAddr(f[6:12]).String()
		switch binary.BigEndian.Uint16(f[12:14]) {
		case unix.ETH_P_ARP:
			// sender hw at 8, sender IP at 14, target IP at 24 (of the ARP payload)
			a := f[14:]
			if len(a) >= 28 && binary.BigEndian.Uint16(a[6:8]) == 1 && net.IP(a[14:18]).Equal(v4) && net.IP(a[24:28]).Equal(v4) && src == mac {
				garp = true
			}
		case unix.ETH_P_IPV6:
			ip6 := f[14:]
			if len(ip6) >= 40+24 && ip6[6] == unix.IPPROTO_ICMPV6 && ip6[40] == 136 && net.IP(ip6[48:64]).Equal(v6) && src == mac {
				na = true
			}
		}
	}
	require.True(t, garp, "gratuitous ARP for %s from %s", v4, mac)
	require.True(t, na, "unsolicited NA for %s from %s", v6, mac)
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }

// State written before the node rebooted does not hold a VF hostage.
func TestAddDropsStateFromEarlierBoot(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f1v3")
	store, err := NewStore(e.stateDir, nil)
	require.NoError(t, err)
	require.NoError(t, store.Save(&State{Phase: PhaseAdded, BootID: "a-boot-long-ago", Network: "rdma-net", ContainerID: "before-reboot",
		IfName: "net1", PCIAddress: "0000:3b:01.5", PFAddress: "0000:3b:00.1", PFNetdev: "ens1f1np1", VFIndex: 3, HostName: "ens1f1v3"}))
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:01.5"`)
	_, err = e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.Contains(t, e.log.String(), "state from before the last boot dropped")
	st, err := store.Load("0000:3b:01.5")
	require.NoError(t, err)
	require.Equal(t, "c1", st.ContainerID)
	require.Equal(t, BootID(), st.BootID)
	require.NotEmpty(t, st.BootID)

	// A state of this boot still holds it.
	_, err = e.add(conf, e.pod(), "c2", "net1")
	require.ErrorIs(t, err, ErrBusy)
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(orig, "0000:3b:01.5")
}

// When ADD's own rollback fails, the state stays for the runtime's DEL,
// which finishes the restore.
func TestFailedRollbackIsFinishedByDel(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v1")
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:00.3","vlan":42`)
	e.rdma.failMove = errors.New("device busy")
	e.pf.FailCall("SetVFVlan", 2) // the rollback's restore
	_, err := e.add(conf, podNS, "c1", "net1")
	require.ErrorContains(t, err, "move RDMA device mlx5_3 into the pod: device busy")
	require.ErrorContains(t, err, "rollback")
	require.Contains(t, e.log.String(), "state kept for DEL")
	st, err := e.store().Load("0000:3b:00.3")
	require.NoError(t, err)
	require.Equal(t, PhaseAdding, st.Phase)
	require.Equal(t, 42, e.pf.Get("ens1f0np0", 1).Vlan, "not restored yet")

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	require.Equal(t, 0, e.pf.Get("ens1f0np0", 1).Vlan)
	e.requireRestored(orig, "0000:3b:00.3")
}

// runtimeConfig.ips and runtimeConfig.mac (Multus' "ips" and "mac"
// capabilities) reach the static IPAM plugin and the VF.
func TestRuntimeConfigIPsAndMAC(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v3")
	podNS := e.pod()
	conf := e.conf(`"deviceID":"0000:3b:00.5","runtimeConfig":{"ips":["10.85.0.7/24"],"mac":"02:fa:57:00:00:77"},"ipam":{"type":"static"}`)
	res, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.Equal(t, "10.85.0.7/24", res.IPs[0].Address.String())
	require.Equal(t, "02:fa:57:00:00:77", res.Interfaces[0].Mac)
	require.Contains(t, e.pf.Calls(), "SetVFMAC ens1f0np0 3 02:fa:57:00:00:77")
	l, err := linkIn(t, podNS, "net1")
	require.NoError(t, err)
	require.Equal(t, "02:fa:57:00:00:77", l.Attrs().HardwareAddr.String())
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(orig, "0000:3b:00.5")
}
