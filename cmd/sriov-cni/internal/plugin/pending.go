package plugin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sort"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
)

// ErrIPAMPending is a DEL's answer when the VF is restored and free for
// another pod but the IPAM plugin failed to release the attachment's
// address: the release is recorded (Pending) and tried again by every DEL
// and GC of the attachment until it works, or until an operator removes
// the record to give the address up.
var ErrIPAMPending = errors.New("address release pending")

// Pending is an address still to be released for an attachment whose VF is
// free: its IPAM DEL failed (an IPAM outage: whereabouts cannot reach the
// API server), or its VF was reclaimed by another network's ADD, which does
// not release it. It is kept apart from the VF's state, in
// <stateDir>/ipam-<hash>.pending, so that it holds no VF. A DEL of an
// attachment with neither state nor Pending has nothing of this plugin's
// to release: its IPAM DEL is tried and a failure only logged.
type Pending struct {
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns,omitempty"`
	IPAMType    string `json:"ipamType"`
	// PCIAddress is the VF the address was given with (for the operator).
	PCIAddress string `json:"pciAddress,omitempty"`
	// Attempts counts the failed releases; LastError is the last one's.
	Attempts  int    `json:"attempts"`
	LastError string `json:"lastError,omitempty"`
}

func pendingOf(st *State) *Pending {
	return &Pending{Network: st.Network, ContainerID: st.ContainerID, IfName: st.IfName, Netns: st.Netns,
		IPAMType: st.IPAMType, PCIAddress: st.PCIAddress}
}

// args are the CNI arguments of the attachment's IPAM DEL, with conf c (the
// network's, from a DEL or GC) and the plugin path of call; its CNI_ARGS
// are not kept (they were its pod's), as GC has none either.
func (pr *Pending) args(call *skel.CmdArgs) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: pr.ContainerID, Netns: pr.Netns, IfName: pr.IfName, Path: call.Path, StdinData: call.StdinData}
}

func (s *Store) pendingPath(network, containerID, ifName string) string {
	h := sha256.Sum256([]byte(network + "\x00" + containerID + "\x00" + ifName))
	return filepath.Join(s.dir, "ipam-"+hex.EncodeToString(h[:12])+".pending")
}

// SavePending writes pr atomically, mode 0600.
func (s *Store) SavePending(pr *Pending) error {
	data, err := json.MarshalIndent(pr, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.pendingPath(pr.Network, pr.ContainerID, pr.IfName), data, 0o600); err != nil {
		return fmt.Errorf("pending address release: %w", err)
	}
	return nil
}

// LoadPending reads the pending release of an attachment: fs.ErrNotExist
// when there is none, ErrBadState when the file cannot be trusted.
func (s *Store) LoadPending(network, containerID, ifName string) (*Pending, error) {
	pr, err := s.readPending(s.pendingPath(network, containerID, ifName))
	if err != nil {
		return nil, err
	}
	if pr.Network != network || pr.ContainerID != containerID || pr.IfName != ifName {
		return nil, fmt.Errorf("pending address release of %s: %w: names container %s interface %s (network %q)",
			containerID, ErrBadState, pr.ContainerID, pr.IfName, pr.Network)
	}
	return pr, nil
}

func (s *Store) readPending(path string) (*Pending, error) {
	data, err := readOwnFile(path, path)
	if err != nil {
		return nil, err
	}
	pr := &Pending{}
	if err := json.Unmarshal(data, pr); err != nil {
		return nil, fmt.Errorf("%s: %w: %v", path, ErrBadState, err)
	}
	if pr.Network == "" || pr.ContainerID == "" || pr.IfName == "" {
		return nil, fmt.Errorf("%s: %w: no network, containerID or ifName", path, ErrBadState)
	}
	return pr, nil
}

// RemovePending deletes the pending release of an attachment.
func (s *Store) RemovePending(network, containerID, ifName string) error {
	if err := os.Remove(s.pendingPath(network, containerID, ifName)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("pending address release: %w", err)
	}
	return nil
}

// ListPending returns every pending release; files that cannot be read are
// logged and skipped.
func (s *Store) ListPending() ([]*Pending, error) {
	paths, err := filepath.Glob(filepath.Join(s.dir, "ipam-*.pending"))
	if err != nil {
		return nil, err
	}
	sort.Strings(paths)
	var out []*Pending
	for _, path := range paths {
		pr, err := s.readPending(path)
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.log.Warn("pending address release skipped", "err", err)
			}
			continue
		}
		out = append(out, pr)
	}
	return out, nil
}

// pendingError is what DEL reports while pr's release is pending: the IPAM
// plugin's failure (its code survives) and how to get out of it.
func (s *Store) pendingError(pr *Pending, ipamErr error) error {
	return fail(0, pr.PCIAddress, "release address", fmt.Errorf(
		"%w: the VF is restored and free for another pod; the release is tried again at each DEL and GC of container %s interface %s, "+
			"and to give the address up instead, remove %s: %w",
		ErrIPAMPending, pr.ContainerID, pr.IfName, s.pendingPath(pr.Network, pr.ContainerID, pr.IfName), ipamErr))
}

// pend records that pr's address is still to be released after ipamErr,
// and returns the error DEL reports: one that wraps ErrIPAMPending when
// the record was written, one that does not when it could not be.
func (s *Store) pend(log *slog.Logger, pr *Pending, ipamErr error) error {
	pr.Attempts++
	pr.LastError = ipamErr.Error()
	if err := s.SavePending(pr); err != nil {
		return errors.Join(fail(0, pr.PCIAddress, "release address", ipamErr),
			fail(types.ErrIOFailure, pr.PCIAddress, "record the pending address release", err))
	}
	log.Warn("address release failed; pending", "container", shortID(pr.ContainerID), "ifname", pr.IfName,
		"attempts", pr.Attempts, "err", ipamErr)
	return s.pendingError(pr, ipamErr)
}

// releasePending runs the IPAM DEL of an attachment that has no VF state
// (DEL after the VF was freed, or never attached; GC of a pending
// release). With a pending release recorded, a failure is DEL's error and
// the record stays; without one, nothing of this plugin's is known to be
// allocated, and a failure is only logged: a DEL without state never fails
// forever on an IPAM plugin that cannot release what it may not hold.
func (p *Plugin) releasePending(ctx context.Context, log *slog.Logger, c *NetConf, store *Store, args *skel.CmdArgs, lock *Lock) error {
	pr, err := store.LoadPending(c.Name, args.ContainerID, args.IfName)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		pr = nil
	case err != nil:
		// Whose it is cannot be told; this attachment's, by its name.
		log.Warn("pending address release unreadable; releasing as if pending", "err", err)
		pr = &Pending{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns, IPAMType: c.IPAM.Type}
	}
	if c.IPAM.Type == "" {
		if pr != nil {
			log.Warn("a release of this attachment's address is pending, but the conf has no ipam any more: record dropped",
				"ipam", pr.IPAMType)
			return store.RemovePending(c.Name, args.ContainerID, args.IfName)
		}
		return nil
	}
	ipamErr := p.ipamDel(ctx, args, c.IPAM.Type, lock)
	switch {
	case ipamErr == nil:
		if pr == nil {
			return nil
		}
		log.Info("pending address release done", "container", shortID(pr.ContainerID), "ifname", pr.IfName, "attempts", pr.Attempts+1)
		if err := store.RemovePending(c.Name, args.ContainerID, args.IfName); err != nil {
			return fail(0, pr.PCIAddress, "release address", err)
		}
		return nil
	case pr == nil:
		log.Warn("IPAM DEL failed; nothing of this attachment is known to be allocated, so DEL goes on", "err", ipamErr)
		return nil
	}
	return store.pend(log, pr, ipamErr)
}
