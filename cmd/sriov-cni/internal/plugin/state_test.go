package plugin

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

func newStore(t *testing.T) *Store {
	t.Helper()
	s, err := NewStore(filepath.Join(t.TempDir(), "state"), nil)
	require.NoError(t, err)
	return s
}

func validState(vf string) *State {
	return &State{Phase: PhaseAdded, Network: "net", ContainerID: "c1", IfName: "net1", PCIAddress: vf,
		PFAddress: "0000:18:00.0", PFNetdev: "ibp24s0", HostName: "ibp24s0v0",
		VFOrig: &sriov.VFConfig{Vlan: 5}, VFApplied: []sriov.Setting{sriov.SettingVlan}}
}

func TestStoreRoundTrip(t *testing.T) {
	s := newStore(t)
	st := validState("0000:18:00.1")
	require.NoError(t, s.Save(st))
	fi, err := os.Stat(filepath.Join(s.dir, "0000:18:00.1.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(s.dir)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), di.Mode().Perm())

	got, err := s.Load("0000:18:00.1")
	require.NoError(t, err)
	require.Equal(t, StateVersion, got.Version)
	require.Equal(t, st, got)

	found, err := s.Find("net", "c1", "net1")
	require.NoError(t, err)
	require.Equal(t, "0000:18:00.1", found.PCIAddress)
	_, err = s.Find("other-net", "c1", "net1")
	require.ErrorIs(t, err, fs.ErrNotExist)

	vfs, err := s.List()
	require.NoError(t, err)
	require.Equal(t, []string{"0000:18:00.1"}, vfs)

	require.NoError(t, s.Remove("0000:18:00.1"))
	require.NoError(t, s.Remove("0000:18:00.1"), "removing twice is fine")
	_, err = s.Load("0000:18:00.1")
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// A newer plugin reads what an older one wrote: version 1 saved
// LinkMoved and RDMAMoved only once done, so a state left half-way means
// they may have begun; it always released IPAM on DEL.
func TestStateUpgradeFromVersion1(t *testing.T) {
	for _, tc := range []struct {
		name string
		v1   string
		want func(*State)
	}{
		{"half-way ADD", `{"version":1,"phase":"adding","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1",
			"hostName":"ibp24s0v0","rdmaDevice":"mlx5_12","ipamType":"host-local","deviceInfoFile":"/run/x.json"}`,
			func(st *State) {
				st.LinkMoved, st.RDMAMoved, st.IPAMAdded = true, true, true
			}},
		{"finished ADD", `{"version":1,"phase":"added","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1",
			"hostName":"ibp24s0v0","linkMoved":true,"ipamType":"static"}`,
			func(st *State) { st.LinkMoved, st.IPAMAdded = true, true }},
		{"vfio VF half-way", `{"version":1,"phase":"adding","network":"n","containerID":"c","ifName":"net1","pciAddress":"0000:18:00.1","vfio":true}`,
			func(*State) {}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := decodeState("0000:18:00.1", []byte(tc.v1))
			require.NoError(t, err)
			want := &State{}
			require.NoError(t, json.Unmarshal([]byte(tc.v1), want))
			want.Version = StateVersion
			tc.want(want)
			require.Equal(t, want, got)
		})
	}
}

// Every kind of state file that cannot be trusted is ErrBadState (set
// aside by DEL and ADD), never a permanent failure.
func TestBadStateFiles(t *testing.T) {
	vf := "0000:18:00.1"
	st := validState(vf)
	st.Version = StateVersion
	good, err := json.Marshal(st)
	require.NoError(t, err)
	for _, tc := range []struct {
		name  string
		make  func(path string)
		wants string
	}{
		{"truncated", func(p string) { write(t, p, good[:len(good)/2]) }, "unexpected end of JSON"},
		{"empty", func(p string) { write(t, p, nil) }, "unexpected end of JSON"},
		{"not JSON", func(p string) { write(t, p, []byte("\x00\x01garbage")) }, "invalid character"},
		{"unknown major", func(p string) { write(t, p, []byte(strings.Replace(string(good), `"version":2`, `"version":3`, 1))) }, "version 3, this plugin reads versions 1 to 2"},
		{"no version", func(p string) { write(t, p, []byte(`{"phase":"added"}`)) }, "version 0"},
		{"another VF's", func(p string) {
			write(t, p, []byte(strings.Replace(string(good), vf, "0000:18:00.2", 1)))
		}, `pciAddress "0000:18:00.2"`},
		{"bad phase", func(p string) { write(t, p, []byte(strings.Replace(string(good), `"added"`, `"done"`, 1))) }, `phase "done"`},
		{"bad ifName", func(p string) { write(t, p, []byte(strings.Replace(string(good), `"net1"`, `"a/b"`, 1))) }, "ifName"},
		{"unknown VF setting", func(p string) { write(t, p, []byte(strings.Replace(string(good), `["vlan"]`, `["speed"]`, 1))) }, `unknown VF setting "speed"`},
		{"a directory", func(p string) { require.NoError(t, os.Mkdir(p, 0o700)) }, "not a regular file"},
		{"a symlink", func(p string) {
			target := filepath.Join(filepath.Dir(p), "elsewhere")
			write(t, target, good)
			require.NoError(t, os.Symlink(target, p))
		}, "a symlink"},
		{"a dangling symlink", func(p string) { require.NoError(t, os.Symlink("/nonexistent/x", p)) }, "a symlink"},
		{"a FIFO", func(p string) { require.NoError(t, syscall.Mkfifo(p, 0o600)) }, "not a regular file"},
		{"huge", func(p string) { write(t, p, []byte(strings.Repeat(" ", maxStateSize+1))) }, "larger than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newStore(t)
			tc.make(s.path(vf))
			_, err := s.Load(vf)
			require.ErrorIs(t, err, ErrBadState)
			require.ErrorContains(t, err, tc.wants)
			require.ErrorContains(t, err, s.path(vf), "names the file")
			v, _ := judgeLoad(s, vf)
			require.Equal(t, vfBadState, v)

			to, err := s.SetAside(vf)
			require.NoError(t, err)
			require.Equal(t, s.path(vf)+".bad", to)
			_, err = os.Lstat(s.path(vf))
			require.ErrorIs(t, err, fs.ErrNotExist)
			_, err = s.Load(vf)
			require.ErrorIs(t, err, fs.ErrNotExist, "the VF is free again")

			// A second bad file replaces the first one set aside.
			write(t, s.path(vf), []byte("{"))
			_, err = s.SetAside(vf)
			require.NoError(t, err)
			b, err := os.ReadFile(to)
			require.NoError(t, err)
			require.Equal(t, "{", string(b))
		})
	}
}

func judgeLoad(s *Store, vf string) (verdict, error) {
	st, err := s.Load(vf)
	return judge(st, err, "net", "c1", "net1", "boot"), err
}

func write(t *testing.T, path string, data []byte) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, data, 0o600))
}

func TestLockIsExclusive(t *testing.T) {
	s := newStore(t)
	l, err := s.Lock("0000:18:00.1", time.Second)
	require.NoError(t, err)
	_, err = s.Lock("0000:18:00.1", 50*time.Millisecond)
	require.ErrorContains(t, err, "still held by another CNI call")
	other, err := s.Lock("0000:18:00.2", 50*time.Millisecond)
	require.NoError(t, err, "another VF's lock is independent")
	other.Unlock(true)
	l.Unlock(false)
	l, err = s.Lock("0000:18:00.1", 50*time.Millisecond)
	require.NoError(t, err)
	l.Unlock(true)
	_, err = os.Stat(filepath.Join(s.dir, "0000:18:00.1.lock"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// Holders that remove the lock file on unlock never let two callers hold
// the lock at once.
func TestLockSurvivesRemovalOnUnlock(t *testing.T) {
	s := newStore(t)
	var inside, most atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 25; j++ {
				l, err := s.Lock("0000:18:00.1", 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
				}
				time.Sleep(100 * time.Microsecond)
				inside.Add(-1)
				l.Unlock(j%2 == 0)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), most.Load())
}

// The lock file is never created through a symlink, dangling or not: the
// symlink is removed and a plain file made in its place.
func TestLockRefusesSymlinks(t *testing.T) {
	s := newStore(t)
	target := filepath.Join(t.TempDir(), "target")
	require.NoError(t, os.Symlink(target, s.lockPath("0000:18:00.1")))
	l, err := s.Lock("0000:18:00.1", time.Second)
	require.NoError(t, err)
	defer l.Unlock(true)
	_, err = os.Lstat(target)
	require.ErrorIs(t, err, fs.ErrNotExist, "nothing created through the symlink")
	fi, err := os.Lstat(s.lockPath("0000:18:00.1"))
	require.NoError(t, err)
	require.True(t, fi.Mode().IsRegular())
}

// What killed calls leave — locks, atomic-write temporaries, an empty
// pinned netns file — is swept for VFs without state; a VF with a state,
// or whose lock is held, keeps its files.
func TestSweepClearsLeftovers(t *testing.T) {
	s := newStore(t)
	for _, f := range []string{
		"0000:18:00.1.lock", ".0000:18:00.1.json.tmp-123", // a killed ADD before its first save
		"0000:18:00.2.lock", "0000:18:00.2.netns", // killed before the netns was mounted
		".0000:18:00.3.json.tmp-9", // no lock file at all
		"0000:18:00.4.lock",        // held below
		"unrelated.lock", "notes.txt",
	} {
		write(t, filepath.Join(s.dir, f), nil)
	}
	require.NoError(t, s.Save(validState("0000:18:00.5")))
	write(t, filepath.Join(s.dir, ".0000:18:00.5.json.tmp-7"), nil)
	write(t, s.lockPath("0000:18:00.5"), nil)
	held, err := s.Lock("0000:18:00.4", time.Second)
	require.NoError(t, err)
	defer held.Unlock(false)

	s.Sweep()
	ents, err := os.ReadDir(s.dir)
	require.NoError(t, err)
	var left []string
	for _, e := range ents {
		left = append(left, e.Name())
	}
	require.ElementsMatch(t, []string{
		"0000:18:00.4.lock",
		"0000:18:00.5.json", "0000:18:00.5.lock", ".0000:18:00.5.json.tmp-7",
		"unrelated.lock", "notes.txt",
	}, left)

	// With its lock held, the VF's own leftovers go.
	l, err := s.Lock("0000:18:00.5", time.Second)
	require.NoError(t, err)
	require.NoError(t, s.clearLeftovers("0000:18:00.5"))
	l.Unlock(false)
	_, err = os.Stat(filepath.Join(s.dir, ".0000:18:00.5.json.tmp-7"))
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// An attachment lock a killed ADD or DEL left goes with the next sweep
// (Sweep, which every DEL runs, and sweepTombstones) once older than
// AttachLockTimeout; a held one, or a young one (a call between its open
// and its flock), stays.
func TestSweepRemovesStaleAttachmentLocks(t *testing.T) {
	for name, sweep := range map[string]func(*Store){
		"Sweep":           func(s *Store) { s.Sweep() },
		"sweepTombstones": func(s *Store) { s.sweepTombstones("", nil, time.Now()) },
	} {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			old := time.Now().Add(-2 * AttachLockTimeout)
			stale := filepath.Join(s.dir, "attach-aaaa.lock")
			young := filepath.Join(s.dir, "attach-bbbb.lock")
			heldPath := filepath.Join(s.dir, "attach-cccc.lock")
			for _, p := range []string{stale, young, heldPath} {
				write(t, p, nil)
			}
			require.NoError(t, os.Chtimes(stale, old, old))
			require.NoError(t, os.Chtimes(heldPath, old, old))
			held, err := s.flock("attachment lock", heldPath, time.Second, nil)
			require.NoError(t, err)
			defer held.Close()

			sweep(s)
			_, err = os.Lstat(stale)
			require.ErrorIs(t, err, fs.ErrNotExist, "the killed call's lock is removed")
			_, err = os.Lstat(young)
			require.NoError(t, err, "a young lock stays")
			_, err = os.Lstat(heldPath)
			require.NoError(t, err, "a held lock stays")
		})
	}
}
