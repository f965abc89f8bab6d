package plugin

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// Pods that upstream sriov-cni attached before the swap are deleted
// through fastpath: their DEL finds upstream's cache, not fastpath's
// state, and undoes upstream's attachment from it.

// upstreamVF is the roce-cx6dx fixture's first VF, as upstream attached it.
const (
	upstreamVF   = "0000:3b:00.2"
	upstreamHost = "ens1f0v0"
	upstreamPF   = "ens1f0np0"
	upstreamMAC  = "02:fa:57:00:00:09"
)

// upstreamSettings are the VF settings upstream's ADD made on the PF.
var upstreamSettings = sriov.VFConfig{Vlan: 100, QoS: 2, Proto: sriov.VlanProto8021Q, MAC: upstreamMAC, SpoofChk: false,
	Trust: true, LinkState: sriov.LinkStateEnable, MinTxRate: 10, MaxTxRate: 100}

// upstreamCacheOf is the cache upstream's ADD writes, every key as it
// writes them, for a VF whose netdev was hostName with MAC hostMAC.
func upstreamCacheOf(e *env, hostMAC string) string {
	return fmt.Sprintf(`{"cniVersion":"1.0.0","name":"rdma-net","type":"sriov","deviceID":%q,
"vlan":100,"vlanQoS":2,"vlanProto":"802.1q","mac":%q,"spoofchk":"off","trust":"on","link_state":"enable",
"min_tx_rate":10,"max_tx_rate":100,"logLevel":"info","logFile":"",
"ipam":{"type":"host-local","ranges":[[{"subnet":"10.91.0.0/24"}]],"dataDir":%q},
"DPDKMode":false,"Master":%q,"VFID":0,"ContIFNames":"net1",
"OrigVfState":{"HostIFName":%q,"SpoofChk":true,"Trust":false,"AdminMAC":"00:00:00:00:00:00","EffectiveMAC":%q,
"Vlan":0,"VlanQoS":0,"VlanProto":"802.1q","MinTxRate":0,"MaxTxRate":0,"LinkState":0}}`,
		upstreamVF, upstreamMAC, e.ipamDir, upstreamPF, upstreamHost, hostMAC)
}

// upstreamAttach leaves the node as upstream sriov-cni's ADD of
// (c1, net1) on upstreamVF does: the stand-in in the pod as net1 with
// upstream's MAC, up; the VF settings on the fake PF; an address; the
// cache. The fake says which stand-in is which VF (a veth has no PCI
// parent). It returns the stand-in as it was on the host.
func (e *env) upstreamAttach(podNS, conf string) netlink.Link {
	e.t.Helper()
	orig := e.standIn(upstreamHost)
	idx := orig.Attrs().Index
	e.p.NetdevPCI = func(l netlink.Link) string {
		if l.Attrs().Index == idx {
			return upstreamVF
		}
		return ""
	}
	host, err := netns.Current()
	require.NoError(e.t, err)
	defer host.Close()
	pod := mustOpen(e.t, podNS)
	mac, _ := net.ParseMAC(upstreamMAC)
	l, err := netns.MoveTo(upstreamHost, host, pod, netns.LinkConfig{Name: "net1"})
	require.NoError(e.t, err)
	require.NoError(e.t, pod.Handle().LinkSetHardwareAddr(l, mac))
	require.NoError(e.t, pod.Handle().LinkSetUp(l))
	e.pf.Set(upstreamPF, 0, upstreamSettings)
	c, err := parseConf([]byte(conf))
	require.NoError(e.t, err)
	require.NoError(e.t, e.p.ipamAdd(context.Background(), c, e.args(conf, podNS, "c1", "net1"), &current.Result{}, true, nil))
	require.Len(e.t, e.ipamLeases(), 1)
	require.NoError(e.t, os.MkdirAll(e.stateDir, 0o700))
	require.NoError(e.t, os.WriteFile(filepath.Join(e.stateDir, "c1-net1"), []byte(upstreamCacheOf(e, orig.Attrs().HardwareAddr.String())), 0o600))
	return orig
}

func (e *env) upstreamConf() string {
	return e.conf(`"deviceID":"` + upstreamVF + `",` + e.hostLocal("10.91.0.0/24", ""))
}

// requireUpstreamUndone checks the VF settings, the address and the state
// dir, and that the VF's netdev is on the host as name.
func (e *env) requireUpstreamUndone(orig netlink.Link, name string) {
	e.t.Helper()
	l, err := netlink.LinkByIndex(orig.Attrs().Index)
	require.NoError(e.t, err, "VF netdev on the host")
	require.Equal(e.t, name, l.Attrs().Name)
	require.Equal(e.t, orig.Attrs().HardwareAddr.String(), l.Attrs().HardwareAddr.String(), "MAC from EffectiveMAC")
	require.Equal(e.t, sriovtest.Unconfigured, e.pf.Get(upstreamPF, 0), "VF settings on the PF restored")
	require.Empty(e.t, e.ipamLeases(), "address released")
	require.Empty(e.t, ls(e.t, e.stateDir), "cache removed, nothing left")
}

func TestDelUndoesUpstreamAttachment(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	podNS := e.pod()
	conf := e.upstreamConf()
	orig := e.upstreamAttach(podNS, conf)

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireUpstreamUndone(orig, upstreamHost)
	_, err := linkIn(t, podNS, "net1")
	require.Error(t, err, "gone from the pod")

	e.pf.ResetCalls()
	require.NoError(t, e.del(conf, podNS, "c1", "net1"), "DEL twice")
	require.Empty(t, pfChanges(e.pf), "the second DEL changes nothing")
	e.requireUpstreamUndone(orig, upstreamHost)

	// fastpath's next ADD records the VF's own name.
	_, err = e.add(conf, podNS, "c2", "net1")
	require.NoError(t, err)
	st, err := e.store().Load(upstreamVF)
	require.NoError(t, err)
	require.Equal(t, upstreamHost, st.HostName)
	require.NoError(t, e.del(conf, podNS, "c2", "net1"))
}

// The VF's original name is taken on the host: it comes back under the
// kernel's name, and a warning names both.
func TestDelUpstreamHostNameTaken(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	podNS := e.pod()
	conf := e.upstreamConf()
	orig := e.upstreamAttach(podNS, conf)
	e.standIn(upstreamHost) // another link took the name meanwhile

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireUpstreamUndone(orig, "net1")
	log := e.log.String()
	require.Contains(t, log, "level=WARN")
	require.Contains(t, log, "original name is taken")
	require.Contains(t, log, "hostName="+upstreamHost)
	require.Contains(t, log, "name=net1")
}

// The pod's netns is gone before DEL: the kernel returned the VF to the
// host under its pod name, where DEL renames it. A pod lost without a DEL
// leaves the same, and the runtime's GC, with the attachment no longer
// valid, undoes it as that DEL would.
func TestDelUpstreamAfterNetnsDeleted(t *testing.T) {
	for _, by := range []string{"DEL", "GC"} {
		t.Run(by, func(t *testing.T) {
			e := newEnv(t, "roce-cx6dx")
			podNS := e.pod()
			conf := e.upstreamConf()
			orig := e.upstreamAttach(podNS, conf)
			e.kernelReclaims(mustOpen(t, podNS))
			deleteNetns(t, podNS)
			_, err := netlink.LinkByName("net1")
			require.NoError(t, err, "returned under its pod name")

			if by == "DEL" {
				require.NoError(t, e.del(conf, podNS, "c1", "net1"))
			} else {
				gc := e.conf(`"deviceID":"` + upstreamVF + `",` + e.hostLocal("10.91.0.0/24", "") + `,"cni.dev/valid-attachments":[]`)
				require.NoError(t, e.p.GC(&skel.CmdArgs{Path: e.cniPath, StdinData: []byte(gc)}))
			}
			e.requireUpstreamUndone(orig, upstreamHost)
			_, err = netlink.LinkByName("net1")
			require.Error(t, err)
		})
	}
}

// A netdev named CNI_IFNAME that is not the VF's is not taken for it.
func TestDelUpstreamChecksTheNetdev(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	podNS := e.pod()
	conf := e.upstreamConf()
	orig := e.upstreamAttach(podNS, conf)
	pod := mustOpen(t, podNS)
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetName(l, "eth9"))
	impostor := e.standIn("fpimp0")
	host, err := netns.Current()
	require.NoError(t, err)
	defer host.Close()
	_, err = netns.MoveTo("fpimp0", host, pod, netns.LinkConfig{Name: "net1"})
	require.NoError(t, err)

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireUpstreamUndone(orig, upstreamHost)
	_, err = linkIn(t, podNS, "net1")
	require.NoError(t, err, "the other link stays in the pod")
	require.NotEqual(t, impostor.Attrs().Index, orig.Attrs().Index)
}

// A cache that cannot be trusted is set aside: DEL goes on as without it,
// and leaves the netdev and the PF alone.
func TestDelUpstreamBadCacheSetAside(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	podNS := e.pod()
	conf := e.upstreamConf()
	e.upstreamAttach(podNS, conf)
	path := filepath.Join(e.stateDir, "c1-net1")
	data, err := os.ReadFile(path)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(path, []byte(strings.Replace(string(data), upstreamVF, "0000:3b:00.2x", 1)), 0o600))

	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	require.Equal(t, []string{"c1-net1.bad"}, ls(t, e.stateDir))
	require.Contains(t, e.log.String(), "set aside")
	require.Empty(t, pfChanges(e.pf))
	require.Equal(t, upstreamSettings, e.pf.Get(upstreamPF, 0))
	require.Empty(t, e.ipamLeases(), "IPAM DEL as without the cache")
	_, err = linkIn(t, podNS, "net1")
	require.NoError(t, err, "the netdev is left as DEL left it before")
}

// Without the test's seam, a link is a VF's only by the kernel's word (its
// PCI parent device, or ethtool's bus-info): a veth is no VF's.
func TestNetdevPCIOfVirtualLink(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	l := e.standIn(upstreamHost)
	e.p.NetdevPCI = nil
	host, err := netns.Current()
	require.NoError(t, err)
	defer host.Close()
	require.Empty(t, e.p.netdevPCI(host, l, true))
	require.Empty(t, e.p.linkOf(host, upstreamVF, upstreamHost))
}
