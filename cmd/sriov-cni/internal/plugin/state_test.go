package plugin

import (
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStoreRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	s, err := NewStore(dir)
	require.NoError(t, err)
	st := &State{Network: "net", ContainerID: "c1", IfName: "net1", PCIAddress: "0000:18:00.1", HostName: "ibp24s0v0",
		VFOrig: &VFConfig{Vlan: 5}, VFApplied: []string{"vlan"}}
	require.NoError(t, s.Save(st))
	fi, err := os.Stat(filepath.Join(dir, "0000:18:00.1.json"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	di, err := os.Stat(dir)
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

func TestStoreRefusesOtherVersions(t *testing.T) {
	dir := t.TempDir()
	s, err := NewStore(dir)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "0000:18:00.1.json"), []byte(`{"version":2}`), 0o600))
	_, err = s.Load("0000:18:00.1")
	require.ErrorContains(t, err, "version 2, this plugin reads version 1")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "0000:18:00.2.json"), []byte(`{`), 0o600))
	_, err = s.Load("0000:18:00.2")
	require.Error(t, err)
}

func TestLockIsExclusive(t *testing.T) {
	s, err := NewStore(t.TempDir())
	require.NoError(t, err)
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
	s, err := NewStore(t.TempDir())
	require.NoError(t, err)
	var inside, max atomic.Int32
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
				if n > max.Load() {
					max.Store(n)
				}
				time.Sleep(100 * time.Microsecond)
				inside.Add(-1)
				l.Unlock(j%2 == 0)
			}
		}()
	}
	wg.Wait()
	require.Equal(t, int32(1), max.Load())
}
