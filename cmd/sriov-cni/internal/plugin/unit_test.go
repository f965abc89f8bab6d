package plugin

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// The tests in this file need no privilege: they drive the whole plugin
// on the edge fixture's vfio-pci VF (no netdev to move, so no netns to
// enter), with the real IPAM plugins and a fake PF. The netdev moves are
// proven as root, on real namespaces, in plugin_linux_test.go.

// vfioVF is the edge fixture's VF bound to vfio-pci, on PF ibp134s0.
const (
	vfioVF = "0000:86:00.1"
	vfioPF = "ibp134s0"
)

// unit runs the plugin in-process without privileges.
type unit struct {
	t                          *testing.T
	p                          *Plugin
	pf                         *sriovtest.PFLink
	rdma                       *fakeRDMA
	cniPath, stateDir, ipamDir string
	devinfoDir                 string
	// netns stands for the pod's netns: a plain file, never the plugin's own.
	netns string
	log   bytes.Buffer
}

func newUnit(t *testing.T) *unit {
	t.Helper()
	dir := t.TempDir()
	u := &unit{t: t, pf: sriovtest.NewPFLink(), rdma: newFakeRDMA(RDMAModeExclusive),
		cniPath:  testbin.Build(t, testbin.HostLocal, testbin.Static),
		stateDir: filepath.Join(dir, "state"), ipamDir: filepath.Join(dir, "ipam"), devinfoDir: filepath.Join(dir, "devinfo"),
		netns: filepath.Join(dir, "pod-netns")}
	require.NoError(t, os.WriteFile(u.netns, nil, 0o600))
	u.p = &Plugin{
		HostRoot:        fixtureRoot("edge"),
		Node:            testNode(u.stateDir, u.devinfoDir),
		NewPFLink:       func(*netlink.Handle) sriov.PFLink { return u.pf },
		RDMA:            u.rdma,
		NewPodResources: func(string) PodResources { t.Fatal("PodResources asked"); return nil },
		Stderr:          &u.log,
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("plugin log:\n%s", u.log.String())
		}
	})
	return u
}

// testNode is the node config of a test: its state dir and device-info
// dir, no log dir, no DRA driver, the kubelet's default PodResources
// socket (a test that serves one sets its own) and deviceID trusted, as
// before the node had a config.
func testNode(stateDir, devinfoDir string) NodeConfig {
	return NodeConfig{StateDir: stateDir, DeviceInfoDir: devinfoDir, PodResourcesSocket: DefaultPodResourcesSocket,
		DeviceIDCheck: DeviceIDCheckOff}
}

// conf is a network conf on the vfio VF with host-local IPAM and a
// device-info file, plus extra JSON members.
func (u *unit) conf(extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rdma-net","type":"sriov","stateDir":%q,"deviceID":%q,`+
		`"ipam":{"type":"host-local","ranges":[[{"subnet":"10.60.0.0/24"}]],"dataDir":%q},`+
		`"runtimeConfig":{"CNIDeviceInfoFile":%q}%s}`,
		u.stateDir, vfioVF, u.ipamDir, filepath.Join(u.devinfoDir, "c1-net1.json"), extra)
}

// allSettings asks for every VF setting the vfio VF takes: it is on an
// InfiniBand PF (no VLAN, no MAC) and has no RDMA device to read its GUID
// from (no GUID either).
const allSettings = `"spoofchk":"off","trust":"on","link_state":"disable","min_tx_rate":10,"max_tx_rate":100`

func (u *unit) args(conf, cid string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: cid, Netns: u.netns, IfName: "net1", Path: u.cniPath, StdinData: []byte(conf)}
}

func (u *unit) add(conf, cid string) (*current.Result, error) {
	var out bytes.Buffer
	u.p.Stdout = &out
	if err := u.p.Add(u.args(conf, cid)); err != nil {
		require.Empty(u.t, out.String(), "nothing on stdout after a failure")
		return nil, err
	}
	r, err := current.NewResult(out.Bytes())
	require.NoError(u.t, err, "result: %s", out.String())
	return r.(*current.Result), nil
}

func (u *unit) del(conf, cid string) error { return u.p.Del(u.args(conf, cid)) }

// leases lists host-local's allocations.
func (u *unit) leases() []string {
	ents, _ := os.ReadDir(filepath.Join(u.ipamDir, "rdma-net"))
	var ips []string
	for _, e := range ents {
		if net.ParseIP(e.Name()) != nil {
			ips = append(ips, e.Name())
		}
	}
	return ips
}

// ls lists dir, but for the tombstones a DEL that found no attachment
// leaves (attachlock.go): TestTombstonesSwept proves GC and age remove
// them, TestAddDelEveryOrder where they are written.
func ls(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if os.IsNotExist(err) {
		return nil
	}
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		if isTombstone(e.Name()) {
			continue
		}
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

// requireClean checks that nothing of an attachment is left: the VF's
// settings as they were, no address, no device-info file, an empty state
// dir (no state, lock, temporary or pinned netns).
func (u *unit) requireClean() {
	u.t.Helper()
	require.Equal(u.t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0), "VF settings restored")
	require.Empty(u.t, u.leases(), "address released")
	require.Empty(u.t, ls(u.t, u.devinfoDir), "device-info file removed")
	require.Empty(u.t, ls(u.t, u.stateDir), "state dir empty")
}

func TestVFIOAddCheckDel(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(allSettings)
	res, err := u.add(conf, "c1")
	require.NoError(t, err)
	require.Equal(t, []*current.Interface{{Name: "net1", Sandbox: u.netns, PciID: vfioVF}}, res.Interfaces)
	require.Equal(t, "10.60.0.2/24", res.IPs[0].Address.String())
	require.Equal(t, []string{"10.60.0.2"}, u.leases())
	got := u.pf.Get(vfioPF, 0)
	require.Equal(t, sriov.VFConfig{MAC: "00:00:00:00:00:00", Proto: sriov.VlanProto8021Q, Trust: true,
		LinkState: sriov.LinkStateDisable, MinTxRate: 10, MaxTxRate: 100}, got)
	di, err := os.ReadFile(filepath.Join(u.devinfoDir, "c1-net1.json"))
	require.NoError(t, err)
	require.JSONEq(t, `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:86:00.1","pf-pci-address":"0000:86:00.0"}}`, string(di))

	st, err := u.store().Load(vfioVF)
	require.NoError(t, err)
	require.Equal(t, PhaseAdded, st.Phase)
	require.True(t, st.IPAMAdded)
	require.Equal(t, []sriov.Setting{"spoofchk", "trust", "link_state", "tx_rate"}, st.VFApplied)
	require.Equal(t, []string{vfioVF + ".json", vfioVF + ".lock"}, ls(t, u.stateDir))

	// CHECK with the result as prevResult.
	require.NoError(t, u.p.Check(u.args(withPrev(t, conf, res), "c1")))
	err = u.p.Check(u.args(withPrev(t, conf, res), "c-other"))
	require.Equal(t, uint(3), CNIError(err).Code, "unknown container: %v", err)

	// STATUS and GC that keeps the attachment.
	require.NoError(t, u.p.Status(u.args(conf, "")))
	gc := u.conf(`"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net1"}]`)
	require.NoError(t, u.p.GC(u.args(gc, "")))
	require.Equal(t, []string{"10.60.0.2"}, u.leases())

	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
	require.NoError(t, u.del(conf, "c1"), "DEL twice")
	u.requireClean()
}

func (u *unit) store() *Store {
	s, err := NewStore(u.stateDir, nil)
	require.NoError(u.t, err)
	return s
}

func withPrev(t *testing.T, conf string, prev *current.Result) string {
	t.Helper()
	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(conf), &c))
	raw, err := json.Marshal(prev)
	require.NoError(t, err)
	var pr map[string]any
	require.NoError(t, json.Unmarshal(raw, &pr))
	c["prevResult"] = pr
	out, err := json.Marshal(c)
	require.NoError(t, err)
	return string(out)
}

// GC collects what is not in valid-attachments: the VF's settings, the
// address, the device-info file, the state.
func TestVFIOGC(t *testing.T) {
	u := newUnit(t)
	_, err := u.add(u.conf(`"trust":"on"`), "gone")
	require.NoError(t, err)
	require.NoError(t, u.p.GC(u.args(u.conf(`"cni.dev/valid-attachments":[]`), "")))
	u.requireClean()
}

// A second ADD of the same VF, by another container, is busy; by the same
// attachment, a mistake: both change nothing.
func TestVFIOBusy(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(`"trust":"on"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	u.pf.ResetCalls()
	_, err = u.add(conf, "c2")
	require.ErrorIs(t, err, ErrBusy)
	require.Equal(t, uint(11), CNIError(err).Code)
	_, err = u.add(conf, "c1")
	require.ErrorContains(t, err, "already attached as container c1")
	require.Empty(t, u.pf.Calls())
	require.NoError(t, u.del(conf, "c2"), "DEL of the refused one leaves the attachment")
	require.True(t, u.pf.Get(vfioPF, 0).Trust)
	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
}

// A vfio-pci VF has no netdev to show that its pod is gone: with the
// attachment's netns path deleted, another ADD still finds it busy, and
// changes nothing.
func TestVFIOStaysBusyWhenNetnsGone(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(`"trust":"on"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	require.NoError(t, os.Remove(u.netns))
	u.netns = filepath.Join(t.TempDir(), "pod-netns-2")
	require.NoError(t, os.WriteFile(u.netns, nil, 0o600))
	u.pf.ResetCalls()
	_, err = u.add(conf, "c2")
	require.ErrorIs(t, err, ErrBusy)
	require.Empty(t, u.pf.Calls())
	require.Len(t, u.leases(), 1)
	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
}

// The plugin's own netns as CNI_NETNS is refused before anything changes,
// with the invalid-netns code, and nothing goes to stdout.
func TestHostNetnsRefused(t *testing.T) {
	u := newUnit(t)
	for _, ns := range []string{"/proc/self/ns/net", "/proc/thread-self/ns/net", fmt.Sprintf("/proc/%d/ns/net", os.Getpid())} {
		u.netns = ns
		_, err := u.add(u.conf(`"trust":"on"`), "c1")
		require.ErrorContains(t, err, "the plugin's own network namespace")
		require.Equal(t, uint(8), CNIError(err).Code)
		require.Empty(t, u.pf.Calls())
		u.requireClean()
		require.NoError(t, u.del(u.conf(`"trust":"on"`), "c1"), "and DEL succeeds")
	}
	u.netns = filepath.Join(t.TempDir(), "missing")
	_, err := u.add(u.conf(""), "c1")
	require.Equal(t, uint(8), CNIError(err).Code)
	require.ErrorContains(t, err, "CNI_NETNS")
}

func TestAddRefusesBadInterfaceNames(t *testing.T) {
	u := newUnit(t)
	for _, name := range []string{"", ".", "..", "a/b", "eth0:1", "has space", "sixteen-chars-xx"} {
		a := u.args(u.conf(""), "c1")
		a.IfName = name
		err := u.p.Add(a)
		require.ErrorContains(t, err, "CNI_IFNAME", "%q", name)
		require.Equal(t, uint(4), CNIError(err).Code)
	}
	u.requireClean()
}

// A VF setting the PF refuses rolls back exactly the settings applied
// before it, newest first, and leaves nothing behind.
func TestVFSettingRefusedRollsBack(t *testing.T) {
	methods := []string{"SetVFSpoofChk", "SetVFTrust", "SetVFLinkState", "SetVFRate"}
	names := []string{"spoofchk", "trust", "link_state", "min_tx_rate 10, max_tx_rate 100"}
	for i, m := range methods {
		t.Run(m, func(t *testing.T) {
			u := newUnit(t)
			u.pf.FailNext(m, fmt.Errorf("operation not supported"))
			_, err := u.add(u.conf(allSettings), "c1")
			require.ErrorContains(t, err, "VF 0000:86:00.1: VF settings on PF ibp134s0: set "+names[i]+": operation not supported")
			calls := pfChanges(u.pf)
			require.Len(t, calls, 2*i+1, "%d applied, one refused, %d restored: %v", i, i, calls)
			for j := 0; j < i; j++ {
				require.Contains(t, calls[i+1+j], methods[i-1-j], "restored newest first")
			}
			u.requireClean()
		})
	}
}

// A conf the VF cannot take is refused before anything changes.
func TestAddRefusesWhatTheVFCannotTake(t *testing.T) {
	u := newUnit(t)
	for _, tc := range []struct{ extra, want string }{
		{`"mtu":9000`, "bound to vfio-pci (no netdev): mtu cannot apply"},
		{`"vlan":7`, "an InfiniBand VF has no VLAN"},
		{`"guid":"02:00:00:00:00:00:00:01"`, "current GUID cannot be read"},
		{`"rdmaIsolation":true`, ""},
	} {
		_, err := u.add(u.conf(tc.extra), "c1")
		if tc.want == "" {
			require.NoError(t, err, "a vfio VF has no RDMA device to isolate: IPAM only")
			require.NoError(t, u.del(u.conf(tc.extra), "c1"))
			continue
		}
		require.ErrorContains(t, err, tc.want)
		require.Equal(t, uint(7), CNIError(err).Code)
	}
	u.pf.Set(vfioPF, 0, sriov.VFConfig{MaxTxRate: 50})
	_, err := u.add(u.conf(`"min_tx_rate":100`), "c1")
	require.ErrorContains(t, err, "min_tx_rate 100 would be above the VF's max_tx_rate 50")
	require.Empty(t, pfChanges(u.pf))
	u.pf.Set(vfioPF, 0, sriovtest.Unconfigured)
	u.requireClean()
}

// DEL on a state file that cannot be trusted sets it aside, restores what
// the PCI address finds (here: releases the address, removes the
// device-info file this VF's attachment wrote) and succeeds.
func TestDelSetsBadStateAside(t *testing.T) {
	for _, bad := range []string{"{trunc", "null", `{"version":9}`} {
		t.Run(bad, func(t *testing.T) {
			u := newUnit(t)
			conf := u.conf("")
			_, err := u.add(conf, "c1")
			require.NoError(t, err)
			require.NoError(t, os.WriteFile(filepath.Join(u.stateDir, vfioVF+".json"), []byte(bad), 0o600))
			require.NoError(t, u.del(conf, "c1"))
			require.Contains(t, u.log.String(), "set aside")
			require.Empty(t, u.leases())
			require.Empty(t, ls(t, u.devinfoDir))
			require.Equal(t, []string{vfioVF + ".json.bad"}, ls(t, u.stateDir))
			b, err := os.ReadFile(filepath.Join(u.stateDir, vfioVF+".json.bad"))
			require.NoError(t, err)
			require.Equal(t, bad, string(b), "kept for a post-mortem")
			// The VF is usable again.
			_, err = u.add(conf, "c2")
			require.NoError(t, err)
			require.NoError(t, u.del(conf, "c2"))
		})
	}
}

// ADD on a VF whose state cannot be trusted sets it aside and goes on.
func TestAddSetsBadStateAside(t *testing.T) {
	u := newUnit(t)
	require.NoError(t, os.MkdirAll(filepath.Join(u.stateDir, vfioVF+".json"), 0o700))
	_, err := u.add(u.conf(""), "c1")
	require.NoError(t, err)
	require.Contains(t, u.log.String(), "state file could not be trusted; set aside")
	require.NoError(t, u.del(u.conf(""), "c1"))
	require.Equal(t, []string{vfioVF + ".json.bad"}, ls(t, u.stateDir))
}

// A device-info file ADD never wrote survives its failure; one that does
// not name the VF survives DEL.
func TestDeviceInfoOnlyOwnRemoved(t *testing.T) {
	u := newUnit(t)
	path := filepath.Join(u.devinfoDir, "c1-net1.json")
	require.NoError(t, os.MkdirAll(u.devinfoDir, 0o755))
	require.NoError(t, os.WriteFile(path, []byte(`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:86:00.1"}}`), 0o444))

	// ADD fails at IPAM, before its device-info step.
	_, err := u.add(u.conf(`"trust":"on","ipam":{"type":"no-such-ipam"}`), "c1")
	require.ErrorContains(t, err, `IPAM plugin "no-such-ipam"`)
	_, err = os.Stat(path)
	require.NoError(t, err, "a file ADD never wrote is left alone")

	// A file rewritten for another VF since ADD is not DEL's to remove.
	conf := u.conf("")
	_, err = u.add(conf, "c1")
	require.NoError(t, err)
	require.NoError(t, os.Remove(path))
	require.NoError(t, os.WriteFile(path, []byte(`{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:af:00.2"}}`), 0o444))
	require.NoError(t, u.del(conf, "c1"))
	_, err = os.Stat(path)
	require.NoError(t, err)
	require.Contains(t, u.log.String(), "it does not name this VF")
}

// Without a deviceID DEL finds the attachment by container and interface;
// with no attachment it sweeps what killed calls left and releases the
// address anyway.
func TestDelWithoutDeviceID(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(`"trust":"on"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(conf), &c))
	delete(c, "deviceID")
	noID, err := json.Marshal(c)
	require.NoError(t, err)
	require.NoError(t, u.del(string(noID), "c1"))
	u.requireClean()

	for _, f := range []string{"0000:86:00.3.lock", ".0000:86:00.3.json.tmp-1"} {
		require.NoError(t, os.WriteFile(filepath.Join(u.stateDir, f), nil, 0o600))
	}
	require.NoError(t, u.del(string(noID), "c-never"))
	require.Empty(t, ls(t, u.stateDir), "stale lock and temporary swept")
	_, err = os.Stat(filepath.Join(u.stateDir, "unused"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// A DEL that finds no state removes the lock a killed ADD left.
func TestDelRemovesStaleLock(t *testing.T) {
	u := newUnit(t)
	require.NoError(t, os.MkdirAll(u.stateDir, 0o700))
	for _, f := range []string{vfioVF + ".lock", "." + vfioVF + ".json.tmp-42", vfioVF + ".netns"} {
		require.NoError(t, os.WriteFile(filepath.Join(u.stateDir, f), nil, 0o600))
	}
	require.NoError(t, u.del(u.conf(""), "c1"))
	require.Empty(t, ls(t, u.stateDir))
}

// A PF driver's refusal of the rate names the conf's keys (igb refuses any
// min_tx_rate with EINVAL, igb_ndo_set_vf_bw; seen in the real-kernel
// guest as "set tx_rate: invalid argument"), and nothing is left changed.
func TestRateRefusalNamesTheConfKeys(t *testing.T) {
	u := newUnit(t)
	u.pf.FailNext("SetVFRate", unix.EINVAL)
	_, err := u.add(u.conf(`"min_tx_rate":10,"max_tx_rate":100`), "c1")
	require.ErrorContains(t, err, "VF settings on PF "+vfioPF+": set min_tx_rate 10, max_tx_rate 100: invalid argument")
	require.ErrorIs(t, err, unix.EINVAL)
	require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0), "nothing changed on the PF")
	u.requireClean()
}
