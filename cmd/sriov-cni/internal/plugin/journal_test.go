package plugin

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// killed is what a failpoint panics with to stand for SIGKILL: deferred
// rollbacks see no error and do nothing, so what is on disk and on the
// (fake) PF is what a killed process leaves.
type killed struct{ at string }

// killAt makes the plugin "die" at the failpoint name.
func (u *unit) killAt(name string) {
	u.p.failpoint = func(at string) {
		if at == name {
			panic(killed{at})
		}
	}
}

// run calls f and reports the failpoint it died at, if any.
func run(f func() error) (at string, err error) {
	defer func() {
		if r := recover(); r != nil {
			k, ok := r.(killed)
			if !ok {
				panic(r)
			}
			at = k.at
		}
	}()
	return "", f()
}

// addPoints are ADD's step boundaries on the vfio VF with every setting,
// IPAM and a device-info file, in order.
var addPoints = []string{"add:locked", "add:journal", "add:vf:spoofchk", "add:vf:trust",
	"add:vf:link_state", "add:vf:tx_rate", "add:ipam", "add:devinfo", "add:added"}

// The write-ahead rule: at every step boundary of ADD, the state on disk
// names every step that may have happened, so a DEL after a kill there
// leaves nothing behind: settings back, address released, device-info
// file, state, lock and temporaries gone.
func TestKillAtEveryAddStep(t *testing.T) {
	var seen []string
	for _, point := range addPoints {
		t.Run(point, func(t *testing.T) {
			u := newUnit(t)
			var hits []string
			u.p.failpoint = func(at string) {
				hits = append(hits, at)
				if at == point {
					panic(killed{at})
				}
			}
			conf := u.conf(allSettings)
			at, err := run(func() error { _, err := u.add(conf, "c1"); return err })
			require.NoError(t, err)
			require.Equal(t, point, at, "reached the failpoint (hits: %v)", hits)
			if len(hits) > len(seen) {
				seen = hits
			}

			st, lerr := u.store().Load(vfioVF)
			switch point {
			case "add:locked":
				require.Error(t, lerr, "nothing journaled yet")
			default:
				require.NoError(t, lerr)
				// What the journal says may have begun covers what did.
				now := u.pf.Get(vfioPF, 0)
				require.Equal(t, *st.VFOrig, undo(now, st), "every changed setting is journaled")
				require.Equal(t, len(u.leases()) > 0, len(u.leases()) > 0 && st.IPAMAdded)
				if _, err := os.Stat(filepath.Join(u.devinfoDir, "c1-net1.json")); err == nil {
					require.NotEmpty(t, st.DeviceInfoFile)
				}
			}

			// The runtime's DEL after the failed ADD.
			u.p.failpoint = nil
			require.NoError(t, u.del(conf, "c1"))
			u.requireClean()
		})
	}
	require.Equal(t, addPoints, seen, "every boundary is a failpoint, in this order")
}

// undo is now with the settings st journaled put back to st's originals:
// equal to the originals iff nothing changed went unjournaled.
func undo(now sriov.VFConfig, st *State) sriov.VFConfig {
	o := st.VFOrig
	for _, s := range st.VFApplied {
		switch s {
		case sriov.SettingVlan:
			now.Vlan, now.QoS, now.Proto = o.Vlan, o.QoS, o.Proto
		case sriov.SettingMAC:
			now.MAC = o.MAC
		case sriov.SettingSpoofChk:
			now.SpoofChk = o.SpoofChk
		case sriov.SettingTrust:
			now.Trust = o.Trust
		case sriov.SettingLinkState:
			now.LinkState = o.LinkState
		case sriov.SettingTxRate:
			now.MinTxRate, now.MaxTxRate = o.MinTxRate, o.MaxTxRate
		}
	}
	return now
}

// Teardown is idempotent: a DEL killed at any of its step boundaries is
// finished by the next one.
func TestKillAtEveryDelStep(t *testing.T) {
	for _, point := range []string{"del:locked", "teardown:ipam", "teardown:devinfo", "teardown:vf", "del:removed"} {
		t.Run(point, func(t *testing.T) {
			u := newUnit(t)
			conf := u.conf(allSettings)
			_, err := u.add(conf, "c1")
			require.NoError(t, err)
			u.killAt(point)
			at, err := run(func() error { return u.del(conf, "c1") })
			require.NoError(t, err)
			require.Equal(t, point, at)
			u.p.failpoint = nil
			require.NoError(t, u.del(conf, "c1"))
			u.requireClean()
		})
	}
}

// A state dir that fills up mid-ADD stops ADD before the step it could
// not journal, and the rollback leaves nothing.
func TestJournalWriteFailureStopsTheStep(t *testing.T) {
	for i, point := range addPoints[2:] {
		t.Run(point, func(t *testing.T) {
			u := newUnit(t)
			conf := u.conf(allSettings)
			// Make the state dir refuse new files just after the boundary
			// before point: the journal entry for point cannot be written.
			prev := addPoints[1+i]
			u.p.failpoint = func(at string) {
				if at == prev {
					require.NoError(t, os.Chmod(u.stateDir, 0o500))
				}
			}
			if os.Geteuid() == 0 {
				t.Skip("root writes to a read-only directory: see the soak's full tmpfs")
			}
			_, err := u.add(conf, "c1")
			require.ErrorContains(t, err, "write state")
			require.Equal(t, uint(5), CNIError(err).Code, "I/O error")
			require.NoError(t, os.Chmod(u.stateDir, 0o700))
			require.NoError(t, u.del(conf, "c1"))
			u.requireClean()
		})
	}
}
