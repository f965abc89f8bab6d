package plugin

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// breakHostLocal makes host-local's DEL (and ADD) fail, as an IPAM outage
// does (whereabouts that cannot reach the API server): its lock file is a
// directory it cannot open. The returned func repairs it.
func (u *unit) breakHostLocal() func() {
	u.t.Helper()
	lock := filepath.Join(u.ipamDir, "rdma-net", "lock")
	require.NoError(u.t, os.Remove(lock))
	require.NoError(u.t, os.Mkdir(lock, 0o700))
	return func() { require.NoError(u.t, os.Remove(lock)) }
}

func (u *unit) pending(cid string) *Pending {
	u.t.Helper()
	pr, err := u.store().LoadPending("rdma-net", cid, "net1")
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	require.NoError(u.t, err)
	return pr
}

// A failed IPAM DEL does not count toward maxDelAttempts and never drops
// the address: every DEL fails with ErrIPAMPending until the release
// works. The VF is restored by the first DEL and free for another pod
// meanwhile. (The review's repro: the third DEL succeeded and leaked.)
func TestIPAMDelFailureKeepsAddressPending(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(`"trust":"on"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	repair := u.breakHostLocal()

	for i := 1; i <= maxDelAttempts+1; i++ {
		err := u.del(conf, "c1")
		require.ErrorIs(t, err, ErrIPAMPending, "DEL %d", i)
		require.ErrorContains(t, err, "the VF is restored and free for another pod")
		require.ErrorContains(t, err, "to give the address up instead, remove "+u.store().pendingPath("rdma-net", "c1", "net1"))
		require.NotZero(t, CNIError(err).Code)
		require.Equal(t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0), "VF settings restored by DEL %d", i)
		_, lerr := u.store().Load(vfioVF)
		require.ErrorIs(t, lerr, fs.ErrNotExist, "the VF's state is gone: it holds no VF")
		require.Equal(t, []string{"10.60.0.2"}, u.leases(), "address still allocated after DEL %d", i)
		pr := u.pending("c1")
		require.NotNil(t, pr)
		require.Equal(t, i, pr.Attempts)
		require.Equal(t, vfioVF, pr.PCIAddress)
	}

	// The VF serves another pod meanwhile (a network without IPAM: the
	// outage would fail its ADD).
	noIPAM := `{"cniVersion":"1.1.0","name":"rdma-net","type":"sriov","trust":"on","stateDir":"` + u.stateDir + `","deviceID":"` + vfioVF + `"}`
	_, err = u.add(noIPAM, "c2")
	require.NoError(t, err)
	require.ErrorIs(t, u.del(conf, "c1"), ErrIPAMPending, "c1's DEL leaves c2's VF alone")
	require.True(t, u.pf.Get(vfioPF, 0).Trust)
	require.NoError(t, u.del(noIPAM, "c2"))

	// The IPAM plugin is back: the next DEL releases the address.
	repair()
	require.NoError(t, u.del(conf, "c1"))
	require.Nil(t, u.pending("c1"))
	u.requireClean()
	require.NoError(t, u.del(conf, "c1"), "and DEL again")
}

// GC tries a pending release again for an attachment not in
// valid-attachments, and leaves one that is.
func TestIPAMPendingReleasedByGC(t *testing.T) {
	u := newUnit(t)
	conf := u.conf("")
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	repair := u.breakHostLocal()
	require.ErrorIs(t, u.del(conf, "c1"), ErrIPAMPending)

	gcErr := u.p.GC(u.args(u.conf(`"cni.dev/valid-attachments":[]`), ""))
	require.ErrorIs(t, gcErr, ErrIPAMPending, "GC during the outage")
	require.Equal(t, 2, u.pending("c1").Attempts)

	repair()
	require.NoError(t, u.p.GC(u.args(u.conf(`"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net1"}]`), "")))
	require.NotNil(t, u.pending("c1"), "a valid attachment's release is left to its DEL")
	require.NoError(t, u.p.GC(u.args(u.conf(`"cni.dev/valid-attachments":[]`), "")))
	require.Nil(t, u.pending("c1"))
	u.requireClean()
}

// An IPAM plugin that never recovers: removing the pending record gives
// the address up, and DEL then succeeds (a DEL with neither state nor a
// pending record only logs a failed IPAM DEL).
func TestIPAMPendingGivenUp(t *testing.T) {
	u := newUnit(t)
	conf := u.conf("")
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	u.breakHostLocal()
	require.ErrorIs(t, u.del(conf, "c1"), ErrIPAMPending)
	require.NoError(t, os.Remove(u.store().pendingPath("rdma-net", "c1", "net1")))
	require.NoError(t, u.del(conf, "c1"))
	require.Contains(t, u.log.String(), "nothing of this attachment is known to be allocated")
	require.Equal(t, []string{"10.60.0.2"}, u.leases(), "given up: left allocated")
	require.Empty(t, ls(t, u.stateDir), "no state, no record")
}

// A VF that fails to restore still counts toward maxDelAttempts, and its
// address is released by the first DEL whose IPAM DEL works, not again.
func TestRestoreFailureCountsIPAMReleasedOnce(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(`"trust":"on"`)
	_, err := u.add(conf, "c1")
	require.NoError(t, err)
	u.pf.FailNext("SetVFTrust", errors.New("operation not permitted"))
	err = u.del(conf, "c1")
	require.ErrorContains(t, err, "restore trust: operation not permitted")
	require.NotErrorIs(t, err, ErrIPAMPending)
	st, err := u.store().Load(vfioVF)
	require.NoError(t, err)
	require.Equal(t, 1, st.DelAttempts)
	require.False(t, st.IPAMAdded, "released already")
	require.Empty(t, u.leases())
	require.NoError(t, u.del(conf, "c1"))
	u.requireClean()
}
