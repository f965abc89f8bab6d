package plugin

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// The real-kernel side of the journal: DEL finds the VF's netdev wherever a
// kill or the pod left it, and ADD killed at any step boundary is undone.

// vfCase is what each test here builds before its ADD: the roce-cx6dx host
// (newEnv), a stand-in for the VF's netdev and a pod netns.
type vfCase struct {
	*env
	vf    string       // the VF's PCI address
	orig  netlink.Link // its stand-in netdev as ADD finds it
	podNS string
}

func newVFCase(t *testing.T, netdev, vf string) *vfCase {
	e := newEnv(t, "roce-cx6dx")
	return &vfCase{env: e, vf: vf, orig: e.standIn(netdev), podNS: e.pod()}
}

// vfConf is a conf that attaches the VF by its deviceID, with extra JSON
// members after it.
func (c *vfCase) vfConf(extra string) string {
	if extra != "" {
		extra = "," + extra
	}
	return c.conf(`"deviceID":"` + c.vf + `"` + extra)
}

// A kill at every step boundary of an ADD that moves the netdev and its
// RDMA device: the runtime's DEL leaves the host as it was.
func TestKillAtEveryAddStepMovesBack(t *testing.T) {
	points := []string{"add:locked", "add:journal", "add:vf:vlan", "add:vf:mac", "add:link", "add:rdma", "add:ipam", "add:devinfo", "add:added"}
	for _, point := range points {
		t.Run(point, func(t *testing.T) {
			e := newVFCase(t, "ens1f0v0", "0000:3b:00.2")
			devinfo := filepath.Join(e.stateDir, "..", "devinfo", "c1.json")
			conf := e.vfConf(`"vlan":100,"mac":"02:fa:57:00:00:01","mtu":4000,` +
				`"runtimeConfig":{"CNIDeviceInfoFile":"` + devinfo + `"},` + e.hostLocal("10.86.0.0/24", ""))
			hit := false
			e.p.failpoint = func(at string) {
				if at == point {
					hit = true
					panic(killed{at})
				}
			}
			_, err := run(func() error { _, err := e.add(conf, e.podNS, "c1", "net1"); return err })
			require.NoError(t, err)
			require.True(t, hit, "reached %s", point)
			e.p.failpoint = nil
			require.NoError(t, e.del(conf, e.podNS, "c1", "net1"))
			e.requireRestored(e.orig, e.vf)
			require.Equal(t, sriovtest.Unconfigured, e.pf.Get("ens1f0np0", 0))
			require.True(t, e.rdma.InHost("mlx5_2"))
			require.Empty(t, e.ipamLeases())
			_, err = os.Stat(devinfo)
			require.ErrorIs(t, err, os.ErrNotExist)
			require.Empty(t, ls(t, e.stateDir))
		})
	}
}

// Before the one-request move (netns.MoveTo), the netdev went through a
// temporary netns pinned at <stateDir>/<pci>.netns, where a kill mid-move
// left it under its host name or its pod name: a node upgraded with one
// such leftover gets the VF back from there on DEL.
func TestDelFindsNetdevInTemporaryNetns(t *testing.T) {
	for _, renamed := range []bool{false, true} {
		t.Run(map[bool]string{false: "host name", true: "pod name"}[renamed], func(t *testing.T) {
			delFromTemporaryNetns(t, renamed)
		})
	}
}

func delFromTemporaryNetns(t *testing.T, renamed bool) {
	e := newVFCase(t, "ens1f0v1", "0000:3b:00.3")
	conf := e.vfConf(`"mtu":4000`)
	e.p.failpoint = func(at string) {
		if at == "add:rdma" {
			panic(killed{at})
		}
	}
	_, err := run(func() error { _, err := e.add(conf, e.podNS, "c1", "net1"); return err })
	require.NoError(t, err)
	e.p.failpoint = nil
	// Put the netdev where a kill inside an older version's move left it.
	pod := mustOpen(t, e.podNS)
	viaPath := filepath.Join(e.stateDir, "0000:3b:00.3.netns")
	testnet.PinnedNetns(t, viaPath)
	via, err := netns.Open(viaPath)
	require.NoError(t, err)
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetNsFd(l, via.Fd()))
	if !renamed {
		l, err = via.Handle().LinkByName("net1")
		require.NoError(t, err)
		require.NoError(t, via.Handle().LinkSetName(l, "ens1f0v1"))
	}
	via.Close()

	require.NoError(t, e.del(conf, e.podNS, "c1", "net1"))
	e.requireRestored(e.orig, e.vf)
	require.Empty(t, ls(t, e.stateDir), "the pinned netns is gone")
}

// The pod renamed the VF's netdev: DEL finds it by the alias ADD set.
func TestDelFindsRenamedNetdevInPod(t *testing.T) {
	e := newVFCase(t, "ens1f0v2", "0000:3b:00.4")
	conf := e.vfConf("")
	_, err := e.add(conf, e.podNS, "c1", "net1")
	require.NoError(t, err)
	pod := mustOpen(t, e.podNS)
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetDown(l))
	require.NoError(t, pod.Handle().LinkSetName(l, "rail0"))
	require.NoError(t, e.del(conf, e.podNS, "c1", "net1"))
	e.requireRestored(e.orig, e.vf)
}

// The pod netns died and the kernel returned the VF to the host under a
// name of its own (dev<ifindex>, when its pod name was taken): DEL finds
// it by the alias ADD set.
func TestDelFindsReturnedNetdevByAlias(t *testing.T) {
	e := newVFCase(t, "ens1f0v3", "0000:3b:00.5")
	conf := e.vfConf("")
	_, err := e.add(conf, e.podNS, "c1", "net1")
	require.NoError(t, err)
	pod := mustOpen(t, e.podNS)
	host, err := netns.Current()
	require.NoError(t, err)
	defer host.Close()
	l, err := pod.Handle().LinkByName("net1")
	require.NoError(t, err)
	require.NoError(t, pod.Handle().LinkSetName(l, "dev4242"))
	require.NoError(t, pod.Handle().LinkSetNsFd(l, host.Fd()))
	e.rdma.where = map[string]string{}
	_, err = netlink.LinkByName("dev4242")
	require.NoError(t, err)
	require.NoError(t, e.del(conf, e.podNS, "c1", "net1"))
	e.requireRestored(e.orig, e.vf)
}

// A state file destroyed while the VF is in the pod: DEL sets it aside and
// brings the netdev back by what sysfs and the pod say (its name from the
// alias); what only the state knew (MTU before ADD) stays as it is.
func TestDelRecoversNetdevWithoutState(t *testing.T) {
	e := newVFCase(t, "ens1f1v0", "0000:3b:01.2")
	conf := e.vfConf(e.hostLocal("10.87.0.0/24", ""))
	_, err := e.add(conf, e.podNS, "c1", "net1")
	require.NoError(t, err)
	require.Len(t, e.ipamLeases(), 1)
	require.NoError(t, os.WriteFile(filepath.Join(e.stateDir, "0000:3b:01.2.json"), []byte(`{"version":2,"phase":`), 0o600))

	require.NoError(t, e.del(conf, e.podNS, "c1", "net1"))
	l, err := netlink.LinkByName("ens1f1v0")
	require.NoError(t, err, "back on the host under its own name")
	require.Empty(t, l.Attrs().Alias)
	_, err = linkIn(t, e.podNS, "net1")
	require.Error(t, err)
	require.True(t, e.rdma.InHost("mlx5_6"))
	require.Empty(t, e.ipamLeases())
	require.Equal(t, []string{"0000:3b:01.2.json.bad"}, ls(t, e.stateDir))
	require.Contains(t, e.log.String(), "set aside")
}

// The plugin's own netns as CNI_NETNS: refused, the VF untouched.
func TestHostNetnsRefusedWithNetdev(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	orig := e.standIn("ens1f1v1")
	_, err := e.add(e.conf(`"deviceID":"0000:3b:01.3","vlan":5,"mtu":9000`), "/proc/self/ns/net", "c1", "net1")
	require.Equal(t, uint(8), CNIError(err).Code)
	require.Empty(t, e.pf.Calls())
	e.requireRestored(orig, "0000:3b:01.3")
}

// The VF's host name was taken on the host while it was in the pod: DEL
// brings it home under the name it had in the pod, with a warning naming
// both, rather than failing until it gives up with the VF in the pod.
func TestDelHostNameTakenMeanwhile(t *testing.T) {
	e := newVFCase(t, "ens1f1v2", "0000:3b:01.4")
	conf := e.vfConf("")
	_, err := e.add(conf, e.podNS, "c1", "net1")
	require.NoError(t, err)
	e.standIn("ens1f1v2") // another link takes the name meanwhile

	require.NoError(t, e.del(conf, e.podNS, "c1", "net1"))
	l, err := netlink.LinkByIndex(e.orig.Attrs().Index)
	require.NoError(t, err, "VF netdev on the host")
	require.Equal(t, "net1", l.Attrs().Name)
	require.Equal(t, e.orig.Attrs().HardwareAddr.String(), l.Attrs().HardwareAddr.String())
	require.Empty(t, ls(t, e.stateDir), "state, lock and pinned netns gone")
	log := e.log.String()
	require.Contains(t, log, "original name is taken")
	require.Contains(t, log, "hostName=ens1f1v2")
}

// An attachment with "mac" and "vlan" (no trust) is made and undone on
// igbvf (igbVF) as on mlx5 (no VFDriver), the PF holding no MAC for the
// VF before ADD (mlx5's zero) or one (igb reports the MAC the VF gave
// itself). ADD sets the PF's MAC, then the netdev's, which igbvf refuses
// until a reset makes it take the PF's. Teardown restores the PF's MAC
// before the netdev's, which igbvf then takes (zero: the PF lets it set
// its own), or takes after a reset (non-zero). Every way a DEL meets the
// attachment brings the VF back: a DEL; a DEL after the pod netns was
// deleted (the kernel hands the VF back under its pod name, closed, which
// resets an igbvf VF: it has the pod's MAC); a DEL killed at each of its
// steps and run again, which finds the restore half done; an ADD that
// fails after the move (its rollback) followed by the runtime's DEL.
func TestMACsComeBackOnIgbvfAndMlx5(t *testing.T) {
	type path struct {
		name string
		run  func(t *testing.T, e *env, conf, podNS string)
	}
	const podMAC = "02:fa:57:00:00:01"
	add := func(t *testing.T, e *env, conf, podNS string) {
		t.Helper()
		_, err := e.add(conf, podNS, "c1", "net1")
		require.NoError(t, err)
		require.Equal(t, podMAC, e.pf.Get("ens1f0np0", 0).MAC, "the PF's MAC for the VF")
		l, err := linkIn(t, podNS, "net1")
		require.NoError(t, err)
		require.Equal(t, podMAC, l.Attrs().HardwareAddr.String(), "the netdev's own MAC in the pod")
	}
	paths := []path{
		{"DEL", func(t *testing.T, e *env, conf, podNS string) {
			add(t, e, conf, podNS)
			require.NoError(t, e.del(conf, podNS, "c1", "net1"))
		}},
		{"pod netns deleted before DEL", func(t *testing.T, e *env, conf, podNS string) {
			add(t, e, conf, podNS)
			pod := mustOpen(t, podNS)
			l, err := pod.Handle().LinkByName("net1")
			require.NoError(t, err)
			host, err := netns.Current()
			require.NoError(t, err)
			defer host.Close()
			// As the kernel hands a physical VF back (a veth would die),
			// closed: igbvf resets.
			require.NoError(t, pod.Handle().LinkSetNsFd(l, host.Fd()))
			if e.p.VFDriver != nil {
				back, err := host.Handle().LinkByName("net1")
				require.NoError(t, err)
				require.NoError(t, e.p.VFDriver.Closed(&State{PFNetdev: "ens1f0np0", VFIndex: 0}, host.Handle(), back))
			}
			e.rdma.where = map[string]string{}
			out, err := exec.Command("ip", "netns", "del", filepath.Base(podNS)).CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.NoError(t, e.del(conf, podNS, "c1", "net1"))
		}},
		{"ADD fails after the move, then DEL", func(t *testing.T, e *env, _, podNS string) {
			// The node's device-info dir is a file: the write fails.
			notDir := filepath.Join(t.TempDir(), "file")
			require.NoError(t, os.WriteFile(notDir, nil, 0o600))
			e.p.Node.DeviceInfoDir = notDir
			conf := e.conf(`"deviceID":"0000:3b:00.2","vlan":100,"mac":"` + podMAC + `",` +
				`"runtimeConfig":{"CNIDeviceInfoFile":"` + filepath.Join(notDir, "c1.json") + `"},` + e.hostLocal("10.88.0.0/24", ""))
			_, err := e.add(conf, podNS, "c1", "net1")
			require.ErrorContains(t, err, "device-info")
			require.NotContains(t, err.Error(), "rollback", "the rollback restored everything")
			require.NoError(t, e.del(conf, podNS, "c1", "net1"))
		}},
	}
	for _, point := range []string{"del:locked", "teardown:ipam", "teardown:devinfo", "teardown:vf", "teardown:rdma", "teardown:link", "del:removed"} {
		paths = append(paths, path{"DEL killed at " + point + ", DEL again", func(t *testing.T, e *env, conf, podNS string) {
			add(t, e, conf, podNS)
			e.p.failpoint = func(at string) {
				if at == point {
					panic(killed{at})
				}
			}
			at, err := run(func() error { return e.del(conf, podNS, "c1", "net1") })
			require.NoError(t, err)
			require.Equal(t, point, at)
			e.p.failpoint = nil
			require.NoError(t, e.del(conf, podNS, "c1", "net1"))
		}})
	}
	for _, driver := range []string{"igbvf", "mlx5"} {
		for _, pfMAC := range []string{"none", "the VF's"} {
			for _, p := range paths {
				t.Run(driver+"/PF MAC "+pfMAC+"/"+p.name, func(t *testing.T) {
					e := newVFCase(t, "ens1f0v0", "0000:3b:00.2")
					if driver == "mlx5" {
						e.p.VFDriver = nil
					}
					before := sriovtest.Unconfigured
					if pfMAC != "none" {
						before.MAC = e.orig.Attrs().HardwareAddr.String()
						e.pf.Set("ens1f0np0", 0, before)
					}
					conf := e.vfConf(`"vlan":100,"mac":"` + podMAC + `",` + e.hostLocal("10.88.0.0/24", ""))
					p.run(t, e.env, conf, e.podNS)
					e.requireRestored(e.orig, e.vf)
					require.Equal(t, before, e.pf.Get("ens1f0np0", 0))
					require.True(t, e.rdma.InHost("mlx5_2"))
					require.Empty(t, e.ipamLeases())
					require.Empty(t, ls(t, e.stateDir))
				})
			}
		}
	}
}

// The fake igbvf: a change of the netdev's own MAC is refused while the
// PF holds a non-zero MAC for the VF, unless it is the MAC of the VF's
// last reset; closing the netdev resets the VF, which then takes the PF's
// MAC.
func TestIgbVF(t *testing.T) {
	requireRoot(t)
	pf := sriovtest.NewPFLink()
	d := newIgbVF(pf)
	st := &State{PFNetdev: "enp1s0", VFIndex: 2}
	mac := func(s string) net.HardwareAddr { m, err := net.ParseMAC(s); require.NoError(t, err); return m }
	require.NoError(t, d.MACChange(st, mac("02:00:00:00:00:09")), "no MAC on the PF")
	require.NoError(t, pf.SetVFMAC("enp1s0", 2, mac("02:00:00:00:00:01")))
	require.ErrorIs(t, d.MACChange(st, mac("02:00:00:00:00:01")), unix.EADDRNOTAVAIL, "not reset since")
	require.ErrorIs(t, d.MACChange(st, mac("02:00:00:00:00:09")), unix.EADDRNOTAVAIL)
	require.NoError(t, d.MACChange(&State{PFNetdev: "enp1s0", VFIndex: 3}, mac("02:00:00:00:00:09")), "another VF")

	l := testnet.StandIn(t, nil, "fpigb"+testnet.RandHex(2))
	h := &netlink.Handle{}
	require.NoError(t, d.Closed(st, h, l))
	now, err := netlink.LinkByIndex(l.Attrs().Index)
	require.NoError(t, err)
	require.Equal(t, "02:00:00:00:00:01", now.Attrs().HardwareAddr.String(), "the reset gives it the PF's MAC")
	require.NoError(t, d.MACChange(st, mac("02:00:00:00:00:01")), "perm_addr since the reset")
	require.ErrorIs(t, d.MACChange(st, mac("02:00:00:00:00:09")), unix.EADDRNOTAVAIL)

	require.NoError(t, pf.SetVFMAC("enp1s0", 2, make(net.HardwareAddr, 6)))
	require.NoError(t, d.MACChange(st, mac("02:00:00:00:00:09")), "zero MAC: IGB_VF_FLAG_PF_SET_MAC cleared")
	require.NoError(t, d.Closed(st, h, now))
	again, err := netlink.LinkByIndex(l.Attrs().Index)
	require.NoError(t, err)
	require.Equal(t, "02:00:00:00:00:01", again.Attrs().HardwareAddr.String(), "no MAC on the PF: the VF keeps its own")
}
