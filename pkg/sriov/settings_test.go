package sriov_test

import (
	"errors"
	"net"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

func ptr[T any](v T) *T { return &v }

func mac(s string) net.HardwareAddr {
	m, err := net.ParseMAC(s)
	if err != nil {
		panic(err)
	}
	return m
}

func all() *sriov.Settings {
	return &sriov.Settings{
		Vlan: ptr(100), VlanQoS: ptr(3), VlanProto: ptr(sriov.VlanProto8021AD), MAC: mac("02:00:00:00:00:01"),
		SpoofChk: ptr(false), Trust: ptr(true), LinkState: ptr(uint32(sriov.LinkStateDisable)),
		MinTxRate: ptr(100), MaxTxRate: ptr(1000), GUID: mac("00:11:22:33:44:55:66:77"),
	}
}

var order = []sriov.Setting{sriov.SettingVlan, sriov.SettingMAC, sriov.SettingSpoofChk, sriov.SettingTrust,
	sriov.SettingLinkState, sriov.SettingTxRate, sriov.SettingGUID}

func TestApplyAndRestoreEverySetting(t *testing.T) {
	l := sriovtest.NewPFLink()
	orig, err := l.VF("ens1f0", 3)
	require.NoError(t, err)
	orig.GUID = "aa:bb:cc:dd:ee:ff:00:11"
	l.Set("ens1f0", 3, orig)
	w := all()
	require.True(t, w.Any())
	require.Equal(t, order, w.Changes())
	for _, s := range w.Changes() {
		require.True(t, s.Known())
		require.NoError(t, sriov.Apply(l, "ens1f0", 3, s, w, &orig))
	}
	require.Equal(t, []string{
		"VF ens1f0 3",
		"SetVFVlan ens1f0 3 100 3 0x88a8",
		"SetVFMAC ens1f0 3 02:00:00:00:00:01",
		"SetVFSpoofChk ens1f0 3 false",
		"SetVFTrust ens1f0 3 true",
		"SetVFLinkState ens1f0 3 2",
		"SetVFRate ens1f0 3 100 1000",
		"SetVFGUID ens1f0 3 00:11:22:33:44:55:66:77",
	}, l.Calls())

	// Restoring puts every original back, newest first.
	l.ResetCalls()
	require.NoError(t, sriov.RestoreAll(l, "ens1f0", 3, w.Changes(), &orig))
	require.Equal(t, []string{
		"SetVFGUID ens1f0 3 aa:bb:cc:dd:ee:ff:00:11",
		"SetVFRate ens1f0 3 0 0",
		"SetVFLinkState ens1f0 3 0",
		"SetVFTrust ens1f0 3 false",
		"SetVFSpoofChk ens1f0 3 true",
		"SetVFMAC ens1f0 3 00:00:00:00:00:00",
		"SetVFVlan ens1f0 3 0 0 0x8100",
	}, l.Calls())
	require.Equal(t, orig, l.Get("ens1f0", 3))
}

func TestChangesOnlyWhatIsAsked(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    sriov.Settings
		want []sriov.Setting
	}{
		{"nothing", sriov.Settings{}, nil},
		{"QoS alone needs a VLAN", sriov.Settings{VlanQoS: ptr(0)}, nil},
		{"max rate alone", sriov.Settings{MaxTxRate: ptr(10)}, []sriov.Setting{sriov.SettingTxRate}},
		{"trust and guid", sriov.Settings{GUID: mac("00:11:22:33:44:55:66:77"), Trust: ptr(false)}, []sriov.Setting{sriov.SettingTrust, sriov.SettingGUID}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, tc.w.Changes())
		})
	}
	require.False(t, (&sriov.Settings{}).Any())
	require.True(t, (&sriov.Settings{VlanQoS: ptr(0)}).Any(), "asked, though it changes nothing alone")
}

func TestRateKeepsTheOtherBound(t *testing.T) {
	l := sriovtest.NewPFLink()
	l.Set("p", 1, sriov.VFConfig{MaxTxRate: 5000})
	orig, _ := l.VF("p", 1)
	w := &sriov.Settings{MinTxRate: ptr(100)}
	require.NoError(t, sriov.Apply(l, "p", 1, sriov.SettingTxRate, w, &orig))
	require.Equal(t, 5000, l.Get("p", 1).MaxTxRate)
	require.Equal(t, 100, l.Get("p", 1).MinTxRate)

	// A min above the VF's current max is refused before any call.
	l.Set("p", 2, sriov.VFConfig{MaxTxRate: 50})
	orig, _ = l.VF("p", 2)
	_, _, err := w.TxRate(&orig)
	require.ErrorContains(t, err, "min_tx_rate 100 would be above the VF's max_tx_rate 50")
	l.ResetCalls()
	require.Error(t, sriov.Apply(l, "p", 2, sriov.SettingTxRate, w, &orig))
	require.Empty(t, l.Calls())
}

func TestFailuresNameTheSetting(t *testing.T) {
	l := sriovtest.NewPFLink()
	orig, _ := l.VF("p", 0)
	l.FailNext("SetVFTrust", errors.New("operation not supported"))
	require.ErrorContains(t, sriov.Apply(l, "p", 0, sriov.SettingTrust, all(), &orig), "operation not supported")
	require.ErrorContains(t, sriov.Apply(l, "p", 0, "speed", all(), &orig), `unknown VF setting "speed"`)
	require.ErrorContains(t, sriov.Apply(l, "p", 0, sriov.SettingMAC, &sriov.Settings{}, &orig), "nothing asked")
	require.False(t, sriov.Setting("speed").Known())

	// RestoreAll tries every setting and reports each failure.
	l.FailNext("SetVFVlan", errors.New("busy"))
	err := sriov.RestoreAll(l, "p", 0, []sriov.Setting{sriov.SettingVlan, sriov.SettingGUID, "speed"}, &orig)
	require.ErrorContains(t, err, "restore vlan: busy")
	require.ErrorContains(t, err, `restore guid: original GUID "" unknown`)
	require.ErrorContains(t, err, `restore speed: unknown VF setting "speed"`)
	require.Contains(t, l.Calls(), "SetVFVlan p 0 0 0 0x8100")
}
