package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// A pod's netns deleted without a DEL (a runtime that lost the pod never
// sends one): the next ADD for the VF finds the netns gone and the VF back
// on the host, tears the dead attachment down as its DEL would, and takes
// the VF.

// kernelReclaims does what the kernel does to a physical VF when the last
// reference to its netns goes: every link but loopback returns to the
// initial netns (a veth would die with the netns instead), renamed
// dev<ifindex> when its name is taken there, and in exclusive mode the
// RDMA devices go back too.
func (e *env) kernelReclaims(n *netns.NS) {
	e.t.Helper()
	host, err := netns.Current()
	require.NoError(e.t, err)
	defer host.Close()
	ls, err := n.Handle().LinkList()
	require.NoError(e.t, err)
	for _, l := range ls {
		if l.Attrs().Name == "lo" {
			continue
		}
		if _, err := netlink.LinkByName(l.Attrs().Name); err == nil {
			require.NoError(e.t, n.Handle().LinkSetName(l, fmt.Sprintf("dev%d", l.Attrs().Index)))
		}
		require.NoError(e.t, n.Handle().LinkSetNsFd(l, host.Fd()))
	}
	e.rdma.mu.Lock()
	e.rdma.where = map[string]string{}
	e.rdma.mu.Unlock()
}

// deleteNetns removes the bind mount of a named netns (`ip netns del`).
func deleteNetns(t *testing.T, path string) {
	t.Helper()
	out, err := exec.Command("ip", "netns", "del", filepath.Base(path)).CombinedOutput()
	require.NoError(t, err, "%s", out)
	_, err = os.Lstat(path)
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// leaseOwners lists the containers that hold a host-local address on
// network, sorted.
func (e *env) leaseOwners(network string) []string {
	e.t.Helper()
	ents, _ := os.ReadDir(filepath.Join(e.ipamDir, network))
	var ids []string
	for _, x := range ents {
		if net.ParseIP(x.Name()) == nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(e.ipamDir, network, x.Name()))
		require.NoError(e.t, err)
		id, _, _ := strings.Cut(string(b), "\n")
		ids = append(ids, strings.TrimSpace(id))
	}
	sort.Strings(ids)
	return ids
}

func TestAddReclaimsVFOfPodGoneWithoutDel(t *testing.T) {
	for _, tc := range []struct{ name, networkA string }{
		{"same network", "rdma-net"},
		{"another network", "other-net"},
	} {
		t.Run(tc.name, func(t *testing.T) { reclaimVF(t, tc.networkA) })
	}
}

func reclaimVF(t *testing.T, networkA string) {
	const vf = "0000:3b:00.2"
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v0")
	devinfo := filepath.Join(e.stateDir, "..", "devinfo")
	confFor := func(network, cid string, vlan int, mac string) string {
		c := e.conf(fmt.Sprintf(`"deviceID":%q,"vlan":%d,"mac":%q,"mtu":4000,"spoofchk":"off",`, vf, vlan, mac) +
			`"runtimeConfig":{"CNIDeviceInfoFile":"` + filepath.Join(devinfo, cid+"-net1.json") + `"},` + e.hostLocal("10.88.0.0/24", ""))
		return strings.Replace(c, `"name":"rdma-net"`, fmt.Sprintf(`"name":%q`, network), 1)
	}
	confA := confFor(networkA, "cA", 100, "02:fa:57:00:00:0a")
	confB := confFor("rdma-net", "cB", 200, "02:fa:57:00:00:0b")
	podA, podB := e.pod(), e.pod()

	_, err := e.add(confA, podA, "cA", "net1")
	require.NoError(t, err)
	require.Equal(t, []string{"cA"}, e.leaseOwners(networkA))
	require.Equal(t, 100, e.pf.Get("ens1f0np0", 0).Vlan)

	// The netns goes without a DEL.
	a, err := netns.Open(podA)
	require.NoError(t, err)
	deleteNetns(t, podA)
	e.kernelReclaims(a)
	a.Close()
	_, err = netlink.LinkByName("net1")
	require.NoError(t, err, "the VF is back on the host under its pod name")

	// B's ADD takes the VF.
	res, err := e.add(confB, podB, "cB", "net1")
	require.NoError(t, err)
	require.Equal(t, "02:fa:57:00:00:0b", res.Interfaces[0].Mac)
	l, err := linkIn(t, podB, "net1")
	require.NoError(t, err)
	require.Equal(t, "ens1f0v0", l.Attrs().Alias)
	require.Equal(t, "02:fa:57:00:00:0b", l.Attrs().HardwareAddr.String())
	require.Equal(t, 4000, l.Attrs().MTU)
	for _, name := range []string{"net1", "ens1f0v0"} {
		_, err = netlink.LinkByName(name)
		require.Error(t, err, "%s not on the host", name)
	}
	present, err := e.rdma.Present("mlx5_2", mustOpen(t, podB))
	require.NoError(t, err)
	require.True(t, present, "mlx5_2 in B's netns")
	st, err := e.store().Load(vf)
	require.NoError(t, err)
	require.Equal(t, "cB", st.ContainerID)
	require.Equal(t, PhaseAdded, st.Phase)
	require.Equal(t, sriovtest.Unconfigured, *st.VFOrig, "A's VF settings were restored before B read them")
	require.Equal(t, "ens1f0v0", st.HostName)
	require.Equal(t, orig.Attrs().HardwareAddr.String(), st.HostMAC, "A's MAC was restored before B read it")
	require.Equal(t, 200, e.pf.Get("ens1f0np0", 0).Vlan)
	require.Equal(t, []string{"cB-net1.json"}, ls(t, devinfo), "A's device-info file removed")
	log := e.log.String()
	require.Contains(t, log, `level=WARN msg="pod gone without a DEL: reclaiming its VF as its DEL would"`)
	require.Contains(t, log, "container cA interface net1")
	require.Contains(t, log, "its netns "+podA+" is gone and the VF's netdev is back in the host netns as net1")
	if networkA == "rdma-net" {
		require.Equal(t, []string{"cB"}, e.leaseOwners("rdma-net"), "A's address released")
	} else {
		require.Equal(t, []string{"cA"}, e.leaseOwners(networkA), "another network's address is its runtime's to release")
		require.Equal(t, []string{"cB"}, e.leaseOwners("rdma-net"))
		require.Contains(t, log, "its address is left for its own runtime's DEL or GC")
	}

	// A's DEL, should its runtime still send one, with the deviceID and
	// without: a success that leaves B's attachment alone.
	var c map[string]any
	require.NoError(t, json.Unmarshal([]byte(confA), &c))
	delete(c, "deviceID")
	noID, err := json.Marshal(c)
	require.NoError(t, err)
	e.pf.ResetCalls()
	require.NoError(t, e.del(confA, podA, "cA", "net1"))
	require.NoError(t, e.del(string(noID), podA, "cA", "net1"))
	require.Empty(t, pfChanges(e.pf))
	l, err = linkIn(t, podB, "net1")
	require.NoError(t, err, "B keeps the VF")
	require.Equal(t, "02:fa:57:00:00:0b", l.Attrs().HardwareAddr.String())
	st, err = e.store().Load(vf)
	require.NoError(t, err)
	require.Equal(t, "cB", st.ContainerID)
	require.Equal(t, []string{"cB"}, e.leaseOwners("rdma-net"))
	require.Empty(t, e.leaseOwners("other-net"))
	require.Equal(t, []string{"cB-net1.json"}, ls(t, devinfo))
	require.NoError(t, e.check(confB, res, podB, "cB", "net1"))

	require.NoError(t, e.del(confB, podB, "cB", "net1"))
	e.requireRestored(orig, vf)
	require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 0))
	require.True(t, e.rdma.InHost("mlx5_2"))
	require.Empty(t, e.leaseOwners("rdma-net"))
	require.Empty(t, ls(t, devinfo))
	require.Empty(t, ls(t, e.stateDir))
}

// The netns's path is gone but the netns is not: something (here an open
// fd; a process in it does the same) holds it, with the VF inside. The VF
// stays busy and untouched; once the holder lets go and the kernel returns
// the VF, the next ADD reclaims it.
func TestAddLeavesVFOfNetnsStillHeld(t *testing.T) {
	const vf = "0000:3b:00.3"
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v1")
	podA := e.pod()
	conf := e.conf(`"deviceID":"` + vf + `","vlan":7,` + e.hostLocal("10.89.0.0/24", ""))
	_, err := e.add(conf, podA, "cA", "net1")
	require.NoError(t, err)
	held, err := netns.Open(podA)
	require.NoError(t, err)
	closed := false
	defer func() {
		if !closed {
			held.Close()
		}
	}()
	deleteNetns(t, podA)

	e.pf.ResetCalls()
	_, err = e.add(conf, e.pod(), "cB", "net1")
	require.ErrorIs(t, err, ErrBusy)
	require.Equal(t, types.ErrTryAgainLater, CNIError(err).Code)
	require.ErrorContains(t, err, "attached to "+vf+" (container cA interface net1")
	require.ErrorContains(t, err, "its netns "+podA+" is gone, but the VF's netdev is not back in the host netns: a process or an open fd still holds that netns")
	require.Contains(t, e.log.String(), "VF held by a netns that has no path any more")
	require.Empty(t, pfChanges(e.pf), "nothing restored")
	l, err := held.Handle().LinkByName("net1")
	require.NoError(t, err, "A keeps the VF")
	require.Equal(t, "ens1f0v1", l.Attrs().Alias)
	present, err := e.rdma.Present("mlx5_3", held)
	require.NoError(t, err)
	require.True(t, present)
	require.Equal(t, 7, e.pf.Get("ens1f0np0", 1).Vlan)
	require.Equal(t, []string{"cA"}, e.leaseOwners("rdma-net"))
	st, err := e.store().Load(vf)
	require.NoError(t, err)
	require.Equal(t, "cA", st.ContainerID)

	// The holder lets go.
	e.kernelReclaims(held)
	held.Close()
	closed = true
	podB := e.pod()
	_, err = e.add(conf, podB, "cB", "net1")
	require.NoError(t, err)
	require.Equal(t, []string{"cB"}, e.leaseOwners("rdma-net"))
	require.NoError(t, e.del(conf, podB, "cB", "net1"))
	e.requireRestored(orig, vf)
	require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 1))
	require.Empty(t, e.leaseOwners("rdma-net"))
}

// A reclaim whose teardown fails (here the PF refuses to put the VLAN
// back) keeps the VF busy, says why, and counts the try in the state; the
// next ADD tries again and, when the undo works, takes the VF.
func TestReclaimThatFailsIsTriedAgain(t *testing.T) {
	const vf = "0000:3b:00.4"
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f0v2")
	podA := e.pod()
	conf := e.conf(`"deviceID":"` + vf + `","vlan":9,` + e.hostLocal("10.90.0.0/24", ""))
	_, err := e.add(conf, podA, "cA", "net1")
	require.NoError(t, err)
	a, err := netns.Open(podA)
	require.NoError(t, err)
	deleteNetns(t, podA)
	e.kernelReclaims(a)
	a.Close()

	e.pf.FailNext("SetVFVlan", errors.New("operation not permitted"))
	_, err = e.add(conf, e.pod(), "cB", "net1")
	require.ErrorIs(t, err, ErrBusy)
	require.ErrorContains(t, err, "but restoring the VF failed")
	require.ErrorContains(t, err, "operation not permitted")
	st, err := e.store().Load(vf)
	require.NoError(t, err)
	require.Equal(t, "cA", st.ContainerID)
	require.Equal(t, 1, st.DelAttempts)
	require.Equal(t, 9, e.pf.Get("ens1f0np0", 2).Vlan, "not restored yet")

	podB := e.pod()
	_, err = e.add(conf, podB, "cB", "net1")
	require.NoError(t, err)
	require.Equal(t, []string{"cB"}, e.leaseOwners("rdma-net"))
	require.NoError(t, e.del(conf, podB, "cB", "net1"))
	e.requireRestored(orig, vf)
	require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 2))
}
