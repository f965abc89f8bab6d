package plugin

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// upstreamDPDK is upstream sriov-cni's cache of a vfio-pci (DPDK mode)
// attachment of the edge fixture's VF, with every key it writes.
const upstreamDPDK = `{"cniVersion":"1.0.0","name":"rdma-net","type":"sriov","deviceID":"0000:86:00.1",
"spoofchk":"off","trust":"on","link_state":"disable","min_tx_rate":10,"max_tx_rate":100,"vlan":null,
"ipam":{"type":"host-local"},
"DPDKMode":true,"Master":"ibp134s0","VFID":0,"ContIFNames":"net1",
"OrigVfState":{"HostIFName":"","SpoofChk":true,"Trust":false,"AdminMAC":"00:00:00:00:00:00","EffectiveMAC":"",
"Vlan":0,"VlanQoS":0,"VlanProto":"802.1q","MinTxRate":0,"MaxTxRate":0,"LinkState":0}}`

func TestParseUpstreamCache(t *testing.T) {
	uc, err := parseUpstreamCache([]byte(upstreamDPDK))
	require.NoError(t, err)
	require.Equal(t, "0000:86:00.1", uc.DeviceID)
	require.True(t, uc.DPDKMode)
	settings, orig := uc.restorePlan(sriov.VFConfig{MAC: "aa:bb:cc:dd:ee:ff", Proto: sriov.VlanProto8021Q})
	require.Equal(t, []sriov.Setting{"spoofchk", "trust", "link_state", "tx_rate"}, settings)
	require.Equal(t, sriov.VFConfig{MAC: "aa:bb:cc:dd:ee:ff", Proto: sriov.VlanProto8021Q, SpoofChk: true}, *orig)

	t.Run("older upstream: no Trust, no VlanProto", func(t *testing.T) {
		uc, err := parseUpstreamCache([]byte(`{"deviceID":"0000:3b:00.2","vlan":7,"trust":"on","mac":"02:00:00:00:00:01",
			"Master":"ens1f0np0","VFID":0,"OrigVfState":{"HostIFName":"ens1f0v0","AdminMAC":"00:00:00:00:00:00","Vlan":3,"VlanQoS":1}}`))
		require.NoError(t, err)
		settings, orig := uc.restorePlan(sriov.VFConfig{Proto: sriov.VlanProto8021AD, Trust: true})
		require.Equal(t, []sriov.Setting{"vlan", "mac"}, settings, "trust left: its value before is not in the cache")
		require.Equal(t, sriov.VFConfig{Vlan: 3, QoS: 1, Proto: sriov.VlanProto8021Q, MAC: "00:00:00:00:00:00", Trust: true}, *orig)
	})
	t.Run("what upstream did not change is left", func(t *testing.T) {
		uc, err := parseUpstreamCache([]byte(`{"deviceID":"0000:3b:00.2","OrigVfState":{"SpoofChk":false,"Vlan":4,"LinkState":2}}`))
		require.NoError(t, err)
		settings, _ := uc.restorePlan(sriov.VFConfig{})
		require.Empty(t, settings)
	})
	for name, data := range map[string]string{
		"not JSON":             `{"deviceID":"0000:3b:00.2","OrigVfState":`,
		"no deviceID":          `{"OrigVfState":{"HostIFName":"ens1f0v0"}}`,
		"deviceID not PCI":     `{"deviceID":"../../etc"}`,
		"bad HostIFName":       `{"deviceID":"0000:3b:00.2","OrigVfState":{"HostIFName":"a/b"}}`,
		"wrong type":           `{"deviceID":"0000:3b:00.2","OrigVfState":{"Vlan":"x"}}`,
		"unknown vlan proto":   `{"deviceID":"0000:3b:00.2","OrigVfState":{"VlanProto":"802.1x"}}`,
		"negative VFID":        `{"deviceID":"0000:3b:00.2","VFID":-1}`,
		"JSON, not an object":  `[1]`,
		"Master not a netdev":  `{"deviceID":"0000:3b:00.2","Master":"a b"}`,
		"uppercase PCI digits": `{"deviceID":"0000:3B:00.2"}`,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := parseUpstreamCache([]byte(data))
			require.ErrorIs(t, err, ErrBadState)
		})
	}
}

// upstreamAdd gives the upstream attachment c1/net1 its address, as
// upstream's ADD did, and writes upstream's cache.
func (u *unit) upstreamAdd(conf, cache string) {
	u.t.Helper()
	c, err := parseConf([]byte(conf))
	require.NoError(u.t, err)
	require.NoError(u.t, u.p.ipamAdd(context.Background(), c, u.args(conf, "c1"), &current.Result{}, true, nil))
	require.Len(u.t, u.leases(), 1)
	require.NoError(u.t, os.MkdirAll(u.stateDir, 0o700))
	require.NoError(u.t, os.WriteFile(filepath.Join(u.stateDir, "c1-net1"), []byte(cache), 0o600))
}

func TestDelUndoesUpstreamDPDKAttachment(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
	}{{"conf with deviceID", ""}, {"conf without deviceID", `"deviceID":""`}} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			u.pf.Set(vfioPF, 0, sriov.VFConfig{MAC: "00:00:00:00:00:00", Proto: sriov.VlanProto8021Q, Trust: true,
				LinkState: sriov.LinkStateDisable, MinTxRate: 10, MaxTxRate: 100})
			conf := u.conf(allSettings)
			u.upstreamAdd(conf, upstreamDPDK)
			delConf := conf
			if tc.extra != "" {
				delConf = fmt.Sprintf(`{"cniVersion":"1.1.0","name":"rdma-net","type":"sriov","stateDir":%q,`+
					`"ipam":{"type":"host-local","ranges":[[{"subnet":"10.60.0.0/24"}]],"dataDir":%q}}`, u.stateDir, u.ipamDir)
			}
			require.NoError(t, u.del(delConf, "c1"))
			u.requireClean()
			require.Contains(t, u.log.String(), "upstream sriov-cni")

			u.pf.ResetCalls()
			require.NoError(t, u.del(delConf, "c1"), "DEL twice")
			require.Empty(t, pfChanges(u.pf))
			u.requireClean()
		})
	}
}

func TestDelSetsBadUpstreamCacheAside(t *testing.T) {
	for name, cache := range map[string]string{
		"truncated":        `{"deviceID":"0000:86:00.1","OrigVfState":{`,
		"deviceID not PCI": `{"deviceID":"eth0","DPDKMode":true}`,
		"another VF":       `{"deviceID":"0000:86:00.2","DPDKMode":true,"spoofchk":"off","OrigVfState":{"SpoofChk":true}}`,
	} {
		t.Run(name, func(t *testing.T) {
			u := newUnit(t)
			conf := u.conf("")
			u.upstreamAdd(conf, cache)
			require.NoError(t, u.del(conf, "c1"))
			require.Empty(t, u.leases(), "IPAM DEL as without the cache")
			require.Equal(t, []string{"c1-net1.bad"}, ls(t, u.stateDir))
			require.Empty(t, pfChanges(u.pf))
			require.Contains(t, u.log.String(), "set aside")
		})
	}
}

// A VF that fails to restore keeps upstream's cache for the runtime's next
// DEL, maxDelAttempts times; then DEL gives up.
func TestDelUpstreamRestoreFailureIsRetriedThenDropped(t *testing.T) {
	u := newUnit(t)
	conf := u.conf("")
	u.upstreamAdd(conf, upstreamDPDK)
	for i := 1; i < maxDelAttempts; i++ {
		u.pf.FailNext("SetVFTrust", errors.New("injected"))
		err := u.del(conf, "c1")
		require.Error(t, err, "attempt %d", i)
		require.Contains(t, err.Error(), "injected")
		require.FileExists(t, filepath.Join(u.stateDir, "c1-net1"))
		require.Len(t, u.leases(), 1, "address kept until the VF is restored")
	}
	u.pf.FailNext("SetVFTrust", errors.New("injected"))
	require.NoError(t, u.del(conf, "c1"))
	require.Contains(t, u.log.String(), "giving up")
	require.Empty(t, u.leases())
	require.Empty(t, ls(t, u.stateDir))
	require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0), "every other setting restored")
}

// GC undoes, as its DEL would, upstream's cache of an attachment the
// runtime no longer has (a pod lost without a DEL): the VF's settings,
// the address, the cache. The caches of a valid attachment, of another
// network, and a file that is no cache are left alone.
func TestGCUndoesUpstreamAttachmentOfLostPod(t *testing.T) {
	u := newUnit(t)
	u.pf.Set(vfioPF, 0, sriov.VFConfig{MAC: "00:00:00:00:00:00", Proto: sriov.VlanProto8021Q, Trust: true,
		LinkState: sriov.LinkStateDisable, MinTxRate: 10, MaxTxRate: 100})
	conf := u.conf(allSettings)
	u.upstreamAdd(conf, upstreamDPDK)
	kept := map[string]string{
		"c2-net1":    strings.Replace(upstreamDPDK, "0000:86:00.1", "0000:86:00.2", 1),
		"c3-net1":    strings.Replace(upstreamDPDK, `"name":"rdma-net"`, `"name":"other-net"`, 1),
		"notes-net1": "not a cache",
	}
	for name, data := range kept {
		require.NoError(t, os.WriteFile(filepath.Join(u.stateDir, name), []byte(data), 0o600))
	}

	gc := u.conf(`"cni.dev/valid-attachments":[{"containerID":"c2","ifname":"net1"}]`)
	require.NoError(t, u.p.GC(u.args(gc, "")))
	require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0), "VF settings restored")
	require.Empty(t, u.leases(), "address released")
	require.Equal(t, []string{"c2-net1", "c3-net1", "notes-net1"}, ls(t, u.stateDir), "the lost pod's cache removed, the rest left")
	require.Contains(t, u.log.String(), "collected upstream sriov-cni's stale attachment")

	u.pf.ResetCalls()
	require.NoError(t, u.p.GC(u.args(gc, "")), "GC twice")
	require.Empty(t, pfChanges(u.pf))
	require.Equal(t, []string{"c2-net1", "c3-net1", "notes-net1"}, ls(t, u.stateDir))
}
