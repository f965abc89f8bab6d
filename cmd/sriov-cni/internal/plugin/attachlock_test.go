package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// syncBuffer is the plugin's log shared by an ADD and a DEL running side
// by side.
type syncBuffer struct {
	mu  sync.Mutex // guards the fields below
	buf *bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// isTombstone says whether a state dir's file name is a tombstone's.
func isTombstone(name string) bool {
	ok, _ := filepath.Match("deleted-*.json", name)
	return ok
}

// tombstones lists the tombstones in the state dir.
func (u *unit) tombstones() []string {
	paths, err := filepath.Glob(filepath.Join(u.stateDir, "deleted-*.json"))
	require.NoError(u.t, err)
	return paths
}

// requireRefusedUntouched checks an ADD refused with code 3 because of its
// DEL (the message says why), having changed nothing: VF settings as
// found, no address, no device-info file.
func (u *unit) requireRefusedUntouched(err error, why string) {
	u.t.Helper()
	require.Error(u.t, err, "ADD after its DEL")
	ce := CNIError(err)
	require.Equal(u.t, uint(types.ErrUnknownContainer), ce.Code, "%v", err)
	require.Contains(u.t, ce.Msg, why)
	require.Contains(u.t, ce.Msg, "nothing changed")
	require.Equal(u.t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0), "VF settings untouched")
	require.Empty(u.t, u.leases(), "no address")
	require.Empty(u.t, ls(u.t, u.devinfoDir), "no device-info file")
}

// gcNone is GC with no valid attachment.
func (u *unit) gcNone() {
	u.t.Helper()
	require.NoError(u.t, u.p.GC(u.args(u.conf(`"cni.dev/valid-attachments":[]`), "")))
}

// requireEmptyStateDir checks the state dir holds nothing, tombstones
// included.
func (u *unit) requireEmptyStateDir() {
	u.t.Helper()
	ents, err := os.ReadDir(u.stateDir)
	require.NoError(u.t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	require.Empty(u.t, names, "state dir empty, tombstones included")
}

// An ADD and a DEL of one attachment side by side, as when a runtime's
// timeout kills Multus and not the plugin (issue 46): the DEL issued at
// each of ADD's step boundaries, in-process with its own goroutine, asks
// for the attachment (its DEL request) and waits for the ADD; the ADD,
// seeing the request once its steps are done, undoes them and is refused
// with code 3; the DEL then finds nothing. When the ADD is killed there
// instead, the DEL undoes what its journal says it made. Either way, once
// both have returned, the VF's settings are as found, no address, no
// device-info file, no state, no DEL request; a tombstone only where the
// DEL found nothing (GC removes it).
//
// The DEL's conf names the VF (deviceID, as Multus passes it) or does not
// (the DEL finds the attachment by its state): without the attachment
// lock, the latter returned 0 at add:locked, having found no state, and
// the ADD then attached the VF.
func TestAddDelEveryOrder(t *testing.T) {
	for _, tc := range []struct {
		name           string
		kill, deviceID bool
	}{
		{"", false, true}, {"DEL without deviceID", false, false},
		{"ADD killed", true, true}, {"ADD killed, DEL without deviceID", true, false},
	} {
		for _, point := range addPoints {
			kill := tc.kill
			name := point
			if tc.name != "" {
				name += "/" + tc.name
			}
			t.Run(name, func(t *testing.T) {
				u := newUnit(t)
				u.p.Stderr = &syncBuffer{buf: &u.log}
				conf := u.conf(allSettings)
				delConf := conf
				if !tc.deviceID {
					delConf = strings.Replace(conf, `"deviceID":"`+vfioVF+`",`, "", 1)
					require.NotEqual(t, conf, delConf)
				}
				delWaits := make(chan struct{}, 1)
				delDone := make(chan error, 1)
				fired := false
				u.p.failpoint = func(at string) {
					switch {
					case at == "del:waiting":
						delWaits <- struct{}{}
					case at == point && !fired:
						fired = true
						go func() { delDone <- u.del(delConf, "c1") }()
						select {
						case <-delWaits:
						case err := <-delDone:
							delDone <- err
							t.Errorf("DEL at %s returned (%v) while its ADD was still running", point, err)
						case <-time.After(10 * time.Second):
							t.Fatalf("DEL at %s neither returned nor waited for its ADD in 10s", point)
						}
						if kill {
							panic(killed{at})
						}
					}
				}
				at, addErr := run(func() error { _, err := u.add(conf, "c1"); return err })
				require.True(t, fired, "ADD reached %s", point)
				if kill {
					require.Equal(t, point, at)
				} else {
					require.Error(t, addErr, "ADD whose DEL waited")
					ce := CNIError(addErr)
					require.Equal(t, uint(types.ErrUnknownContainer), ce.Code, "ADD whose DEL waited: %v", addErr)
					require.Contains(t, ce.Msg, "arrived while this ADD ran")
					require.Contains(t, ce.Msg, "undone")
				}
				select {
				case err := <-delDone:
					require.NoError(t, err, "DEL")
				case <-time.After(10 * time.Second):
					t.Fatal("DEL did not return in 10s after its ADD")
				}
				u.requireClean()
				if !kill || point == "add:locked" {
					// Undone by the ADD, or killed before its journal:
					// nothing to find, as if the DEL had come first.
					require.Len(t, u.tombstones(), 1)
					u.gcNone()
				}
				require.Empty(t, u.tombstones(), "DEL found the attachment: no tombstone")
				u.requireEmptyStateDir()
			})
		}
	}
}

// A DEL whose wait for its ADD runs out first, as when the ADD's IPAM
// plugin waits a minute for a slow API server and the runtime kills the
// DEL's parent meanwhile: the DEL fails with code 11 having changed
// nothing, but its request stays, and the ADD, once its steps are done,
// undoes them and is refused with code 3. Nothing is left for a DEL that
// may never come; the runtime's retried DEL finds nothing. Found in make
// e2e-cluster's scale phase (a kubelet restarted during a burst).
func TestAddUndoneWhenItsDelGaveUp(t *testing.T) {
	for _, point := range addPoints {
		t.Run(point, func(t *testing.T) {
			u := newUnit(t)
			u.p.Stderr = &syncBuffer{buf: &u.log}
			u.p.attachWait = 100 * time.Millisecond
			conf := u.conf(allSettings)
			var delErr error
			fired := false
			u.p.failpoint = func(at string) {
				if at == point && !fired {
					fired = true
					delErr = u.del(conf, "c1") // waits 100 ms, gives up
				}
			}
			_, addErr := u.add(conf, "c1")
			require.True(t, fired, "ADD reached %s", point)
			require.Error(t, delErr, "DEL that gave up waiting")
			require.Equal(t, uint(types.ErrTryAgainLater), CNIError(delErr).Code, "%v", delErr)
			require.Contains(t, CNIError(delErr).Msg, "undoes itself")
			require.Error(t, addErr, "ADD whose DEL gave up")
			ce := CNIError(addErr)
			require.Equal(t, uint(types.ErrUnknownContainer), ce.Code, "%v", addErr)
			u.requireClean()
			require.Len(t, u.tombstones(), 1, "the request became the tombstone")
			u.p.failpoint = nil
			require.NoError(t, u.del(conf, "c1"), "the runtime's retried DEL")
			_, err := u.add(conf, "c1")
			require.Equal(t, uint(types.ErrUnknownContainer), CNIError(err).Code, "a later ADD of it is refused: %v", err)
			u.gcNone()
			u.requireClean()
			u.requireEmptyStateDir()
		})
	}
}

// A DEL request found when ADD takes the lock (its DEL gave up, and the
// ADD that held the lock was killed before it saw the request) refuses
// that ADD as a tombstone would, and becomes one.
func TestAddRefusedByADelRequest(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(allSettings)
	store, err := NewStore(u.stateDir, nil)
	require.NoError(t, err)
	args := u.args(conf, "c1")
	c, err := parseConf([]byte(conf))
	require.NoError(t, err)
	require.NoError(t, store.requestDel(c.Name, args))
	_, err = u.add(conf, "c1")
	u.requireRefusedUntouched(err, "is being deleted")
	require.Len(t, u.tombstones(), 1, "the request became the tombstone")
	require.False(t, store.delRequested(c.Name, args))
	u.gcNone()
	u.requireClean()
	u.requireEmptyStateDir()
}

// A DEL that ran before its ADD leaves a tombstone: the ADD is refused
// with code 3 and changes nothing, and GC then removes the tombstone.
func TestAddAfterItsDelRefused(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(allSettings)
	require.NoError(t, u.del(conf, "c1"))
	_, err := u.add(conf, "c1")
	u.requireRefusedUntouched(err, "was deleted")
	require.Len(t, u.tombstones(), 1)

	// Another attachment of the container, or of another network, is not
	// refused.
	other := u.conf(allSettings + `,"name":"other-net"`)
	_, err = u.add(other, "c1")
	require.NoError(t, err)
	require.NoError(t, u.del(other, "c1"))

	// GC keeps the tombstone of a valid attachment, drops the rest.
	require.NoError(t, u.p.GC(u.args(u.conf(`"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"net1"}]`), "")))
	require.Len(t, u.tombstones(), 1, "valid attachment's tombstone kept")
	u.gcNone()
	u.requireClean()
	u.requireEmptyStateDir()
}

// Tombstones older than tombstoneTTL refuse nothing and are swept by the
// next DEL that writes one.
func TestTombstonesExpire(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(allSettings)
	require.NoError(t, u.del(conf, "old"))
	paths := u.tombstones()
	require.Len(t, paths, 1)
	age := func(path string) {
		var ts map[string]any
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.NoError(t, json.Unmarshal(data, &ts))
		ts["deleted"] = time.Now().Add(-11 * time.Minute).UTC().Format(time.RFC3339Nano)
		data, err = json.Marshal(ts)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, data, 0o600))
		old := time.Now().Add(-11 * time.Minute)
		require.NoError(t, os.Chtimes(path, old, old))
	}
	age(paths[0])
	require.NoError(t, u.del(conf, "new"))
	require.Len(t, u.tombstones(), 1, "the old tombstone swept, the new one kept")
	require.NotEqual(t, paths[0], u.tombstones()[0])

	// An expired tombstone does not refuse its ADD.
	age(u.tombstones()[0])
	_, err := u.add(conf, "new")
	require.NoError(t, err)
	require.Empty(t, u.tombstones())
	require.NoError(t, u.del(conf, "new"))
	u.requireClean()
	u.requireEmptyStateDir()
}

// delDuringKubelet is a kubelet that, asked which VFs the pod holds, first
// lets the attachment's DEL run: the DEL that arrives while ADD asks,
// before ADD has taken any lock.
type delDuringKubelet struct {
	del func() error
	err error
}

func (k *delDuringKubelet) Pod(context.Context, string, string) (PodDevices, error) {
	k.err = k.del()
	return PodDevices{Resources: map[string][]string{"fastpath.io/vf": {vfioVF}}}, nil
}

// A DEL that arrives while the ADD asks the kubelet, before the ADD has
// taken any lock, finds nothing and returns; the ADD then gives up with
// code 3 and changes nothing.
func TestDelWhileAddAsksKubelet(t *testing.T) {
	u := newUnit(t)
	conf := u.conf(allSettings)
	k := &delDuringKubelet{del: func() error { return u.del(conf, "c1") }}
	u.p.Node.DeviceIDCheck = DeviceIDCheckPodResources
	u.p.NewPodResources = func(string) PodResources { return k }
	err := u.addAs(conf, "c1", "trainer-0")
	require.NoError(t, k.err, "DEL")
	require.Equal(t, uint(types.ErrUnknownContainer), CNIError(err).Code, "%v", err)
	require.Empty(t, u.pf.Calls(), "no call to the PF")
	require.Empty(t, u.leases(), "no address")
	require.Empty(t, ls(t, u.devinfoDir), "no device-info file")
	require.Empty(t, ls(t, u.stateDir), "no state")
	u.gcNone()
	u.requireEmptyStateDir()
}
