package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// ErrBadState marks a state file that cannot be trusted: not JSON,
// truncated, fields that make no sense, a major version this plugin does
// not know, or not a regular file (a directory, a symlink). It is set
// aside, never a reason to fail forever.
var ErrBadState = errors.New("bad state file")

// maxStateSize bounds what Load reads: a state file is a few KiB.
const maxStateSize = 1 << 20

// Store keeps, in one directory (0700), per VF: the state file
// <pci>.json (0600), the lock <pci>.lock, and while a netdev is being moved
// the pinned temporary netns <pci>.netns. A state set aside is
// <pci>.json.bad. Per attachment whose VF is free but whose address is
// not released yet: ipam-<hash>.pending (Pending).
type Store struct {
	dir string
	log *slog.Logger
}

// NewStore creates dir (0700) when needed, and refuses a dir that is not
// the plugin's alone: a symlink (not followed), not a directory, not owned
// by the user the plugin runs as (root), or writable by group or others.
// Its files steer what the plugin changes on the node, so a directory
// anyone else can write (a pod's emptyDir, /tmp) is never one. Every
// command opens its store once, so this is checked once per command.
func NewStore(dir string, log *slog.Logger) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return nil, fmt.Errorf("state dir %s is a symlink, which is not followed: the state dir must be a directory only root can write (remove the link, or set stateDir in the node config)", dir)
	case !fi.IsDir():
		return nil, fmt.Errorf("state dir %s is not a directory (%s)", dir, fi.Mode().Type())
	}
	if err := ownedByPlugin(fi); err != nil {
		return nil, fmt.Errorf("state dir %s refused: %w; the state dir must be a directory only root can write", dir, err)
	}
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return &Store{dir: dir, log: log}, nil
}

func (s *Store) path(vf string) string      { return filepath.Join(s.dir, cnistate.FileName(vf)) }
func (s *Store) lockPath(vf string) string  { return filepath.Join(s.dir, vf+".lock") }
func (s *Store) netnsPath(vf string) string { return filepath.Join(s.dir, vf+".netns") }

// Load reads the state of vf: fs.ErrNotExist when there is none,
// ErrBadState when the file cannot be trusted, another error when it
// cannot be read.
func (s *Store) Load(vf string) (*State, error) {
	p := s.path(vf)
	data, err := readOwnFile(p, "state "+p)
	if err != nil {
		return nil, err
	}
	st, err := decodeState(vf, data)
	if err != nil {
		return nil, fmt.Errorf("state %s: %w", p, err)
	}
	return st, nil
}

// readOwnFile reads a file of the state dir, named what in errors, that
// only a plugin writes: fs.ErrNotExist (or another open error, as is) when
// it cannot be opened, ErrBadState when it is a symlink, not a regular
// file or larger than maxStateSize.
func readOwnFile(path, what string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return nil, fmt.Errorf("%s: %w: a symlink", what, ErrBadState)
	case err != nil:
		return nil, err // fs.ErrNotExist and real I/O errors alike
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s: %w: not a regular file (%s)", what, ErrBadState, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxStateSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if len(data) > maxStateSize {
		return nil, fmt.Errorf("%s: %w: larger than %d bytes", what, ErrBadState, maxStateSize)
	}
	return data, nil
}

// Save writes st atomically, mode 0600.
func (s *Store) Save(st *State) error {
	st.Version = StateVersion
	data, err := json.MarshalIndent(st, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path(st.PCIAddress), data, 0o600); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// Remove deletes the state of vf.
func (s *Store) Remove(vf string) error {
	if err := os.Remove(s.path(vf)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// SetAside moves a state file that cannot be trusted out of the way, to
// <pci>.json.bad (replacing an older one: one per VF is kept for a
// post-mortem), and returns where it went.
func (s *Store) SetAside(vf string) (string, error) {
	to, err := setAside(s.path(vf))
	if err != nil {
		return "", fmt.Errorf("set aside state of %s: %w", vf, err)
	}
	return to, nil
}

// setAside renames the file at path to <path>.bad, replacing an earlier
// one, and returns the new name.
func setAside(path string) (string, error) {
	to := path + ".bad"
	if err := os.RemoveAll(to); err != nil {
		return "", err
	}
	if err := os.Rename(path, to); err != nil {
		return "", err
	}
	return to, nil
}

// List returns the VFs that have a state file, sorted.
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", s.dir, err)
	}
	var vfs []string
	for _, e := range ents {
		if vf, ok := cnistate.VFOf(e.Name()); ok {
			vfs = append(vfs, vf)
		}
	}
	sort.Strings(vfs)
	return vfs, nil
}

// Find returns the state of the attachment (containerID, ifName) of
// network, or fs.ErrNotExist. Files that cannot be read are logged and
// skipped: whose they are cannot be told.
func (s *Store) Find(network, containerID, ifName string) (*State, error) {
	vfs, err := s.List()
	if err != nil {
		return nil, err
	}
	for _, vf := range vfs {
		st, err := s.Load(vf)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue // removed meanwhile
		case err != nil:
			s.log.Warn("state skipped: cannot tell whose it is", "vf", vf, "err", err)
			continue
		}
		if st.is(network, containerID, ifName) {
			return st, nil
		}
	}
	return nil, fs.ErrNotExist
}

// LockTimeout bounds the wait for a VF's lock.
const LockTimeout = 30 * time.Second

// Lock is a held per-VF lock: an flock on <pci>.lock. Whoever inherits its
// file holds it too — the IPAM plugins do, so that a DEL waits for an IPAM
// ADD that outlived a killed plugin.
type Lock struct {
	f    *os.File
	path string
}

// File is the locked file (for a child process to inherit); nil when the
// lock is a stand-in for a read-only state dir.
func (l *Lock) File() *os.File { return l.f }

// Lock takes the exclusive lock of vf, waiting up to timeout. The lock file
// is never followed through a symlink (one found is removed: nothing but
// this plugin writes here) and is opened read-only, so a state dir that
// turned read-only still locks once the file exists.
func (s *Store) Lock(vf string, timeout time.Duration) (*Lock, error) {
	path := s.lockPath(vf)
	f, err := s.flock("lock", path, timeout, nil)
	if errors.Is(err, errLockHeld) {
		return nil, fmt.Errorf("lock %s: still held by another CNI call after %v", path, timeout)
	}
	if err != nil {
		return nil, err
	}
	return &Lock{f: f, path: path}, nil
}

// errLockHeld is a lock flock found still held when its wait ended.
var errLockHeld = errors.New("still held")

// flock takes an exclusive flock on the file at path, the state dir's
// lock files (what names them in logs and errors: "lock", "attachment
// lock"), waiting up to timeout; busy, when set, is called once when it
// has to wait. The file is created 0600, opened read-only (a state dir
// that turned read-only still locks once the file exists), close-on-exec,
// and never followed through a symlink: one found is removed, as nothing
// but this plugin writes here. An unlock removes its file, so the lock is
// taken only when path still names the file locked, else tried anew. A
// lock still held at the deadline is errLockHeld.
func (s *Store) flock(what, path string, timeout time.Duration, busy func()) (*os.File, error) {
	deadline := time.Now().Add(timeout)
	waited := false
	for {
		f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
		if errors.Is(err, unix.ELOOP) && time.Now().Before(deadline) {
			s.log.Warn(what+" file was a symlink; removed it", "path", path)
			if err := os.Remove(path); err != nil {
				return nil, fmt.Errorf("%s %s: a symlink that cannot be removed: %w", what, path, err)
			}
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("%s %s: %w", what, path, err)
		}
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil || !errors.Is(err, unix.EWOULDBLOCK) || time.Now().After(deadline) {
				break
			}
			if !waited {
				waited = true
				if busy != nil {
					busy()
				}
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			f.Close()
			if errors.Is(err, unix.EWOULDBLOCK) {
				return nil, errLockHeld
			}
			return nil, fmt.Errorf("%s %s: %w", what, path, err)
		}
		if same(f, path) {
			return f, nil
		}
		f.Close()
	}
}

func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Lstat(path)
	return err == nil && os.SameFile(a, b)
}

// Unlock releases the lock; remove also deletes the lock file (when no
// attachment of the VF is left).
func (l *Lock) Unlock(remove bool) {
	if l.f == nil {
		return
	}
	if remove {
		_ = os.Remove(l.path)
	}
	_ = l.f.Close()
}

// clearLeftovers removes, with vf's lock held, what a killed call on vf may
// have left beside its state: atomic-write temporaries (.<pci>.json.tmp-*)
// and an empty pinned netns. A pinned netns that still holds a link is
// left for teardown, which knows where the link belongs.
func (s *Store) clearLeftovers(vf string) error {
	var errs []error
	tmps, _ := atomicfile.Temporaries(s.path(vf))
	for _, t := range tmps {
		if err := os.Remove(t); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	if err := unpinIfEmpty(s.log, s.netnsPath(vf)); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// unpinIfEmpty releases the netns pinned at path (by a version that moved
// VF netdevs through one) unless a link is still in it; a path that is not
// there is fine. What is not such a pin (netns.OpenPin: a symlink, a plain
// file, the plugin's own netns bound there) is removed without being
// followed (netns.Unpin), with a log line.
func unpinIfEmpty(log *slog.Logger, path string) error {
	if _, err := os.Lstat(path); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	n, err := netns.OpenPin(path)
	if errors.Is(err, netns.ErrNotPin) {
		log.Warn("removing a leftover pinned netns that is not one this plugin made; not followed", "err", err)
	}
	if err == nil {
		links, lerr := n.Links()
		n.Close()
		if lerr != nil {
			return lerr
		}
		if len(links) > 0 {
			return fmt.Errorf("temporary netns %s still holds %s", path, strings.Join(links, ", "))
		}
	}
	return netns.Unpin(path)
}

// Sweep clears what killed calls left for VFs that have no state: their
// temporaries, empty pinned namespaces and lock files. A VF whose lock is
// held is busy, not stale, and is skipped. Attachment locks that a killed
// ADD or DEL left (an flock goes with its holder, its file stays) go too
// once older than AttachLockTimeout and not held (sweepAttachLock).
func (s *Store) Sweep() {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	now := time.Now()
	seen := map[string]bool{}
	for _, e := range ents {
		n := e.Name()
		var vf string
		switch {
		case strings.HasPrefix(n, "attach-") && strings.HasSuffix(n, ".lock"):
			s.sweepAttachLock(filepath.Join(s.dir, n), now)
			continue
		case strings.HasSuffix(n, ".lock"):
			vf = strings.TrimSuffix(n, ".lock")
		case strings.HasSuffix(n, ".netns"):
			vf = strings.TrimSuffix(n, ".netns")
		case strings.HasPrefix(n, ".") && strings.Contains(n, ".json.tmp-"):
			vf = strings.TrimPrefix(n[:strings.Index(n, ".json.tmp-")], ".")
		default:
			continue
		}
		if !pci.ValidAddress(vf) || seen[vf] {
			continue
		}
		seen[vf] = true
		if _, err := os.Lstat(s.path(vf)); !errors.Is(err, fs.ErrNotExist) {
			continue // an attachment, or a state to set aside: not a leftover
		}
		l, err := s.Lock(vf, 0)
		if err != nil {
			continue
		}
		_, err = os.Lstat(s.path(vf))
		stale := errors.Is(err, fs.ErrNotExist)
		if stale {
			if err := s.clearLeftovers(vf); err != nil {
				s.log.Warn("leftovers of a killed call not cleared", "vf", vf, "err", err)
				stale = false
			} else {
				s.log.Debug("leftovers of a killed call cleared", "vf", vf)
			}
		}
		l.Unlock(stale)
	}
}
