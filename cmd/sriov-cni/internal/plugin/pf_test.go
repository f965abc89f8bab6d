package plugin

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func allSettings(t *testing.T) *vfSettings {
	t.Helper()
	c, err := parseConf([]byte(`{"name":"n","vlan":100,"vlanQoS":3,"vlanProto":"802.1ad","mac":"02:00:00:00:00:01",
		"spoofchk":"off","trust":"on","link_state":"disable","min_tx_rate":100,"max_tx_rate":1000,
		"guid":"00:11:22:33:44:55:66:77"}`))
	require.NoError(t, err)
	return &c.vf
}

func TestVFStepsOrderAndValues(t *testing.T) {
	pf := newFakePF()
	orig, err := pf.VF("ens1f0", 3)
	require.NoError(t, err)
	orig.GUID = "aa:bb:cc:dd:ee:ff:00:11"
	steps := vfSteps(pf, "ens1f0", 3, allSettings(t), &orig)
	applied, err := applyVF(pf, "ens1f0", 3, steps, &orig)
	require.NoError(t, err)
	require.Equal(t, []string{"vlan", "mac", "spoofchk", "trust", "link_state", "tx_rate", "guid"}, applied)
	require.Equal(t, []string{
		"VF ens1f0 3",
		"SetVFVlan ens1f0 3 100 3 0x88a8",
		"SetVFMAC ens1f0 3 02:00:00:00:00:01",
		"SetVFSpoofChk ens1f0 3 false",
		"SetVFTrust ens1f0 3 true",
		"SetVFLinkState ens1f0 3 2",
		"SetVFRate ens1f0 3 100 1000",
		"SetVFGUID ens1f0 3 00:11:22:33:44:55:66:77",
	}, pf.Calls())

	// Restoring puts every original back, newest first.
	pf.calls = nil
	require.NoError(t, restoreVF(pf, "ens1f0", 3, applied, &orig))
	require.Equal(t, []string{
		"SetVFGUID ens1f0 3 aa:bb:cc:dd:ee:ff:00:11",
		"SetVFRate ens1f0 3 0 0",
		"SetVFLinkState ens1f0 3 0",
		"SetVFTrust ens1f0 3 false",
		"SetVFSpoofChk ens1f0 3 true",
		"SetVFMAC ens1f0 3 00:00:00:00:00:00",
		"SetVFVlan ens1f0 3 0 0 0x8100",
	}, pf.Calls())
	got := pf.Get("ens1f0", 3)
	orig.GUID = "aa:bb:cc:dd:ee:ff:00:11"
	require.Equal(t, orig, got)
}

// Each step failing rolls back exactly the steps before it, newest first,
// and leaves the VF as it was.
func TestApplyVFRollsBackOnEachFailingStep(t *testing.T) {
	methods := []string{"SetVFVlan", "SetVFMAC", "SetVFSpoofChk", "SetVFTrust", "SetVFLinkState", "SetVFRate", "SetVFGUID"}
	names := []string{"vlan", "mac", "spoofchk", "trust", "link_state", "tx_rate", "guid"}
	for i, m := range methods {
		t.Run(m, func(t *testing.T) {
			pf := newFakePF()
			orig, err := pf.VF("ens1f0", 0)
			require.NoError(t, err)
			orig.GUID = "aa:bb:cc:dd:ee:ff:00:11"
			before := orig
			pf.vf("ens1f0", 0).GUID = orig.GUID
			pf.failOn[m] = errors.New("EOPNOTSUPP")
			pf.calls = nil
			applied, err := applyVF(pf, "ens1f0", 0, vfSteps(pf, "ens1f0", 0, allSettings(t), &orig), &orig)
			require.Error(t, err)
			require.Nil(t, applied)
			require.Contains(t, err.Error(), "set "+names[i]+": EOPNOTSUPP")
			calls := pf.Calls()
			require.Len(t, calls, 2*i+1, "i applies, one failure, i restores: %v", calls)
			for j := 0; j < i; j++ {
				// restore j comes after the failure, in reverse order
				require.Contains(t, calls[i+1+j], methods[i-1-j])
			}
			require.Equal(t, before, pf.Get("ens1f0", 0))
		})
	}
}

func TestRateKeepsTheOtherBound(t *testing.T) {
	pf := newFakePF()
	pf.vf("p", 1).MaxTxRate = 5000
	orig, _ := pf.VF("p", 1)
	c, err := parseConf([]byte(`{"name":"n","min_tx_rate":100}`))
	require.NoError(t, err)
	_, err = applyVF(pf, "p", 1, vfSteps(pf, "p", 1, &c.vf, &orig), &orig)
	require.NoError(t, err)
	require.Equal(t, 5000, pf.Get("p", 1).MaxTxRate)
	require.Equal(t, 100, pf.Get("p", 1).MinTxRate)

	// A min above the VF's current max is refused before any call.
	pf.vf("p", 2).MaxTxRate = 50
	orig, _ = pf.VF("p", 2)
	pf.calls = nil
	_, err = applyVF(pf, "p", 2, vfSteps(pf, "p", 2, &c.vf, &orig), &orig)
	require.ErrorContains(t, err, "min_tx_rate 100 would be above the VF's max_tx_rate 50")
	require.Empty(t, pf.Calls())
}

func TestRestoreVFUnknownGUID(t *testing.T) {
	pf := newFakePF()
	err := restoreVF(pf, "p", 0, []string{"guid"}, &VFConfig{})
	require.ErrorContains(t, err, "original GUID")
}
