package plugin

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
)

// An ADD and a DEL of one attachment (network, container ID, interface)
// may run side by side although the CNI spec forbids it: a runtime whose
// ADD timed out kills the delegating plugin (Multus), not this one, and
// sends its DEL while the orphaned ADD goes on. Measured on real kernels
// (issue 46), about 5% of DELs sent 0-40 ms after their ADD found no state
// yet and returned 0, and the ADD then attached the VF to the dying pod.
//
// Two things make every order end with the VF home and no state:
//
//   - The attachment lock, an flock on attach-<key>.lock in the state dir.
//     ADD holds it from before it reads the node (PodResources, states)
//     until it returns, DEL for all it does, so a DEL that arrives during
//     an ADD waits for it, then tears down what it made (or what its
//     journal says it began, if it failed or was killed: the kernel drops
//     an flock with its holder's last descriptor, SIGKILL included). It is
//     taken before any VF's lock, never while holding one, so the two
//     cannot deadlock; no child inherits it (close-on-exec), unlike the VF
//     lock the IPAM plugin inherits.
//   - The tombstone, deleted-<key>.json, that a DEL which finds no
//     attachment writes under that lock. An ADD that gets the lock after
//     it, one the runtime started before its DEL whose process was slower,
//     or one started after the DEL, is refused with code 3 ("container
//     unknown or does not exist": the runtime needs no cleanup) and
//     changes nothing. Tombstones go when GC is told the attachment is
//     not valid, and when older than tombstoneTTL, swept by every DEL that
//     writes one.
//
//   - The DEL request, deleting-<key>, that a DEL which has to wait for
//     the attachment's lock writes first. An ADD that runs on while its
//     DEL waits (a slow IPAM plugin behind a slow API server takes a
//     minute) checks for it once its steps are done: it undoes them, as a
//     failed ADD does, leaves the tombstone, and is refused with code 3.
//     So the VF comes home even when the DEL's own wait runs out first
//     (measured in make e2e-cluster's scale phase: a kubelet restarted
//     during a burst, containerd's cleanup DEL killed after 60 s with
//     Multus, the orphaned ADD then attached the VF to a sandbox nobody
//     would DEL again). The DEL, once it has the lock, removes the
//     request; an ADD that takes the lock while one is there is refused
//     as after a tombstone.
//
// An ADD of the attachment within tombstoneTTL of a DEL that found nothing
// is thus refused: Kubernetes runtimes never do that (a new sandbox is a
// new container ID); a tool that reuses a container ID must wait, or use
// another.

// AttachLockTimeout bounds the wait for an attachment's lock: a DEL waits
// that long for its ADD, under the 2 minutes a kubelet gives a runtime
// call (--runtime-request-timeout). Past it DEL fails with code 11 and
// nothing changed; the runtime retries it, and the retry tears down what
// the ADD made.
const AttachLockTimeout = 60 * time.Second

// tombstoneTTL is how long a tombstone refuses an ADD. An orphaned ADD
// takes the attachment lock milliseconds after it starts (it reads only
// its conf before), so this is far beyond the window it closes.
const tombstoneTTL = 10 * time.Minute

// attachmentKey names an attachment's files: a hash, since container IDs
// and network names are not file names.
func attachmentKey(network, containerID, ifName string) string {
	h := sha256.Sum256([]byte(network + "\x00" + containerID + "\x00" + ifName))
	return hex.EncodeToString(h[:12])
}

func (s *Store) attachLockPath(network, containerID, ifName string) string {
	return filepath.Join(s.dir, "attach-"+attachmentKey(network, containerID, ifName)+".lock")
}

func (s *Store) tombstonePath(network, containerID, ifName string) string {
	return filepath.Join(s.dir, "deleted-"+attachmentKey(network, containerID, ifName)+".json")
}

func (s *Store) delRequestPath(network, containerID, ifName string) string {
	return filepath.Join(s.dir, "deleting-"+attachmentKey(network, containerID, ifName))
}

// requestDel records, for a DEL about to wait for the attachment's lock,
// that the attachment is being deleted: its ADD, still running, undoes
// itself when it sees it (delRequested).
func (s *Store) requestDel(network string, args *skel.CmdArgs) error {
	f, err := os.OpenFile(s.delRequestPath(network, args.ContainerID, args.IfName), os.O_WRONLY|os.O_CREATE|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("DEL request: %w", err)
	}
	return f.Close()
}

// delRequested says whether a DEL of the attachment asked for it while
// waiting for its lock.
func (s *Store) delRequested(network string, args *skel.CmdArgs) bool {
	_, err := os.Lstat(s.delRequestPath(network, args.ContainerID, args.IfName))
	return err == nil
}

// clearDelRequest removes the attachment's DEL request.
func (s *Store) clearDelRequest(network string, args *skel.CmdArgs) error {
	if err := os.Remove(s.delRequestPath(network, args.ContainerID, args.IfName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("DEL request: %w", err)
	}
	return nil
}

// gaveUp ends the message of every ADD refused or undone because of its
// DEL (code 3), which the runtime needs no cleanup for.
const gaveUp = "the runtime gave up on this ADD and tears the sandbox down"

// errDelArrived is an ADD that its DEL overtook while it ran: undone.
var errDelArrived = errors.New("the DEL of this attachment arrived while this ADD ran")

// attachLock is a held attachment lock.
type attachLock struct{ f *os.File }

// Unlock releases the lock and removes its file: a waiter that locked the
// removed file sees it is gone and locks a new one (lockAttachment).
func (l *attachLock) Unlock() {
	if l == nil || l.f == nil {
		return
	}
	_ = os.Remove(l.f.Name())
	_ = l.f.Close()
}

// lockAttachment takes the lock of the attachment (network, args) for the
// command cmd ("add", "del"), waiting up to timeout; busy is called once
// when it has to wait (a failpoint: the tests' interleavings start there).
// A state dir that is read-only gives an error that wraps unix.EROFS.
func (s *Store) lockAttachment(network string, args *skel.CmdArgs, timeout time.Duration, busy func()) (*attachLock, error) {
	path := s.attachLockPath(network, args.ContainerID, args.IfName)
	f, err := s.flock("attachment lock", path, timeout, busy)
	if errors.Is(err, errLockHeld) {
		return nil, fmt.Errorf("attachment lock %s: %w", path, errAttachBusy)
	}
	if err != nil {
		return nil, err
	}
	return &attachLock{f: f}, nil
}

// errAttachBusy is an attachment lock still held when the wait ends.
var errAttachBusy = errors.New("still held by another ADD or DEL of this attachment")

// tombstone records that DEL found no attachment.
type tombstone struct {
	Network     string    `json:"network"`
	ContainerID string    `json:"containerID"`
	IfName      string    `json:"ifName"`
	Deleted     time.Time `json:"deleted"`
}

// writeTombstone records, with the attachment lock held, that the DEL of
// (network, args) found nothing attached.
func (s *Store) writeTombstone(network string, args *skel.CmdArgs, now time.Time) error {
	data, err := json.Marshal(tombstone{Network: network, ContainerID: args.ContainerID, IfName: args.IfName, Deleted: now.UTC()})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.tombstonePath(network, args.ContainerID, args.IfName), data, 0o600); err != nil {
		return fmt.Errorf("tombstone: %w", err)
	}
	return nil
}

// loadTombstone reads the tombstone of (network, containerID, ifName):
// fs.ErrNotExist when there is none.
func (s *Store) loadTombstone(network, containerID, ifName string) (*tombstone, error) {
	path := s.tombstonePath(network, containerID, ifName)
	data, err := readOwnFile(path, "tombstone "+path)
	if err != nil {
		return nil, err
	}
	var t tombstone
	if err := json.Unmarshal(data, &t); err != nil {
		return nil, fmt.Errorf("tombstone %s: %w: %v", path, ErrBadState, err)
	}
	if t.Network != network || t.ContainerID != containerID || t.IfName != ifName {
		return nil, fmt.Errorf("tombstone %s: %w: names another attachment", path, ErrBadState)
	}
	return &t, nil
}

// refuseDeleted is ADD's check, with the attachment lock held, that the
// attachment's DEL has not run: code 3 if it has. A tombstone older than
// tombstoneTTL, or one that cannot be read, is removed and does not
// refuse.
func (s *Store) refuseDeleted(log *slog.Logger, network string, args *skel.CmdArgs, now time.Time) error {
	if s.delRequested(network, args) {
		// A DEL waited for this lock and gave up: it stands for the
		// DEL's tombstone.
		s.settleDelRequest(log, network, args, now)
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf(
			"container %s interface %s (network %q) is being deleted (a DEL waited for this attachment) before this ADD took it: nothing changed; "+
				gaveUp+", and a new sandbox has a new container ID",
			args.ContainerID, args.IfName, network), "")
	}
	t, err := s.loadTombstone(network, args.ContainerID, args.IfName)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err == nil && now.Sub(t.Deleted) < tombstoneTTL:
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf(
			"container %s interface %s (network %q) was deleted (DEL at %s) before this ADD took it: nothing changed; "+
				gaveUp+", and a new sandbox has a new container ID",
			args.ContainerID, args.IfName, network, t.Deleted.Format(time.RFC3339Nano)), "")
	case err != nil:
		log.Warn("tombstone that cannot be read removed", "err", err)
	}
	if err := os.Remove(s.tombstonePath(network, args.ContainerID, args.IfName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fail(types.ErrIOFailure, "", "remove tombstone", err)
	}
	return nil
}

// settleDelRequest turns the attachment's DEL request, which an ADD
// honoured, into its tombstone: later ADDs of it are refused as after a
// DEL that found nothing, and the DEL still waiting, if any, finds
// nothing to undo.
func (s *Store) settleDelRequest(log *slog.Logger, network string, args *skel.CmdArgs, now time.Time) {
	if err := s.writeTombstone(network, args, now); err != nil {
		log.Warn("DEL request honoured, but no tombstone written: an ADD of this attachment is not refused", "err", err)
	}
	if err := s.clearDelRequest(network, args); err != nil {
		log.Warn("DEL request left", "err", err)
	}
}

// sweepTombstones removes attachment locks killed calls left
// (sweepAttachLock), tombstones older than tombstoneTTL (by their
// files' mtime: one lstat each, no read), and, when valid is not nil,
// those of network whose attachment valid does not name (GC), with the
// attachment's lock: one whose lock is held is left for next time, its
// ADD or DEL is running. An old tombstone refuses no ADD, so it goes
// without the lock.
func (s *Store) sweepTombstones(network string, valid map[types.GCAttachment]bool, now time.Time) {
	locks, _ := filepath.Glob(filepath.Join(s.dir, "attach-*.lock"))
	for _, path := range locks {
		s.sweepAttachLock(path, now)
	}
	reqs, _ := filepath.Glob(filepath.Join(s.dir, "deleting-*"))
	for _, path := range reqs {
		// A DEL request whose ADD and DEL both died: after a
		// tombstone's time it refuses nothing any more.
		if fi, err := os.Lstat(path); err == nil && now.Sub(fi.ModTime()) >= tombstoneTTL {
			_ = os.Remove(path)
		}
	}
	paths, err := filepath.Glob(filepath.Join(s.dir, "deleted-*.json"))
	if err != nil {
		return
	}
	for _, path := range paths {
		fi, err := os.Lstat(path)
		if err != nil {
			continue
		}
		if now.Sub(fi.ModTime()) >= tombstoneTTL {
			if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("tombstone not removed", "path", path, "err", err)
			}
			continue
		}
		if valid == nil {
			continue
		}
		data, err := readOwnFile(path, path)
		var t tombstone
		if err == nil {
			err = json.Unmarshal(data, &t)
		}
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil || t.ContainerID == "" || t.IfName == "" ||
			filepath.Base(path) != filepath.Base(s.tombstonePath(t.Network, t.ContainerID, t.IfName)):
			s.log.Warn("tombstone that cannot be read removed", "path", path, "err", err)
			_ = os.Remove(path)
			continue
		case t.Network != network || valid[types.GCAttachment{ContainerID: t.ContainerID, IfName: t.IfName}]:
			continue
		}
		l, err := s.lockAttachment(t.Network, &skel.CmdArgs{ContainerID: t.ContainerID, IfName: t.IfName}, 0, nil)
		if err != nil {
			continue
		}
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.log.Warn("tombstone not removed", "path", path, "err", err)
		}
		l.Unlock()
	}
}

// lockAttachmentFor takes the attachment lock for ADD or DEL (cmd) and
// maps its failures to what the runtime is told.
func (p *Plugin) lockAttachmentFor(log *slog.Logger, cmd string, store *Store, network string, args *skel.CmdArgs) (*attachLock, error) {
	wait := p.attachWait
	if wait == 0 {
		wait = AttachLockTimeout
	}
	busy := func() {
		if cmd == "del" {
			// Before waiting: the ADD that holds the lock undoes itself
			// when it sees this, even if this wait runs out first.
			if err := store.requestDel(network, args); err != nil {
				log.Warn("DEL waits for its ADD without telling it; the ADD completes and this DEL undoes it", "err", err)
			}
		}
		p.point(cmd + ":waiting")
	}
	l, err := store.lockAttachment(network, args, wait, busy)
	switch {
	case err == nil:
		return l, nil
	case errors.Is(err, errAttachBusy) && cmd == "del":
		return nil, fail(types.ErrTryAgainLater, "", "DEL", fmt.Errorf("the ADD of this attachment is still running after %v: it undoes itself when its steps are done; retry the DEL to make sure: %w", wait, err))
	case errors.Is(err, errAttachBusy):
		return nil, fail(types.ErrTryAgainLater, "", "ADD", fmt.Errorf("another ADD or DEL of this attachment is still running after %v: nothing changed: %w", wait, err))
	}
	return nil, fail(types.ErrIOFailure, "", "lock attachment", err)
}

// sweepAttachLock removes the attachment lock file path when it is older
// than AttachLockTimeout (its mtime: when it was made) and nobody holds
// it: a killed call's. Measured in make e2e-cluster's scale phase: a DEL
// killed while waiting for whereabouts left one, and no later call of its
// attachment came to remove it. Removing a lock file nobody holds is safe
// whenever it happens: a caller that opened it before and locks it after
// sees it unlinked and makes a new one (Store.flock).
func (s *Store) sweepAttachLock(path string, now time.Time) {
	fi, err := os.Lstat(path)
	if err != nil || !fi.Mode().IsRegular() || now.Sub(fi.ModTime()) < AttachLockTimeout {
		return
	}
	f, err := s.flock("attachment lock", path, 0, nil)
	if err != nil {
		return // held: its ADD or DEL is running
	}
	(&attachLock{f: f}).Unlock()
	s.log.Debug("attachment lock a killed call left removed", "path", path)
}

// tombstoneIfDetached writes, for DEL with the attachment lock held, the
// attachment's tombstone when no state of it is found, and sweeps old
// ones. A tombstone that cannot be written is logged: DEL still undoes
// what there is, and an ADD yet to start is then not refused.
func (p *Plugin) tombstoneIfDetached(log *slog.Logger, store *Store, c *NetConf, args *skel.CmdArgs) {
	st, err := p.findAttachment(store, c, args)
	if st != nil || err != nil {
		return
	}
	now := time.Now()
	if err := store.writeTombstone(c.Name, args, now); err != nil {
		log.Warn("no attachment found, and its tombstone not written: an ADD of it yet to start is not refused", "err", err)
	}
	store.sweepTombstones("", nil, now)
}

// gcTombstones is GC's sweep: network's tombstones that valid does not
// name, and every old one.
func (s *Store) gcTombstones(network string, valid map[types.GCAttachment]bool) {
	s.sweepTombstones(network, valid, time.Now())
}
