package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
)

// StateVersion is the version of the state file format. A file of another
// version is refused, never guessed at.
const StateVersion = 1

// Phases of an attachment.
const (
	PhaseAdding = "adding" // ADD is changing the node; a crash leaves this
	PhaseAdded  = "added"
)

// State is what ADD did to one VF, so that DEL can undo it even when the
// pod's netns is gone and the conf is all DEL has.
type State struct {
	Version int    `json:"version"`
	Phase   string `json:"phase"`
	// BootID is the kernel's boot_id when ADD ran: state from an earlier
	// boot describes VFs and namespaces that the reboot reset.
	BootID      string `json:"bootID,omitempty"`
	Network     string `json:"network"`
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Netns       string `json:"netns"`

	PCIAddress string `json:"pciAddress"`
	PFAddress  string `json:"pfAddress"`
	PFNetdev   string `json:"pfNetdev"`
	VFIndex    int    `json:"vfIndex"`
	LinkType   string `json:"linkType,omitempty"`
	VFIO       bool   `json:"vfio,omitempty"`

	// The VF netdev as it was on the host, and as it was set in the pod.
	HostName  string `json:"hostName,omitempty"`
	HostMAC   string `json:"hostMAC,omitempty"`
	HostMTU   int    `json:"hostMTU,omitempty"`
	HostAlias string `json:"hostAlias,omitempty"`
	HostUp    bool   `json:"hostUp,omitempty"`
	PodMAC    string `json:"podMAC,omitempty"`
	PodMTU    int    `json:"podMTU,omitempty"`
	// LinkMoved is set once the netdev has left the host netns.
	LinkMoved bool `json:"linkMoved,omitempty"`

	// VF settings on the PF: the originals, and the steps ADD applied.
	VFOrig    *VFConfig `json:"vfOrig,omitempty"`
	VFApplied []string  `json:"vfApplied,omitempty"`

	RDMADevice string `json:"rdmaDevice,omitempty"`
	RDMAMoved  bool   `json:"rdmaMoved,omitempty"`

	IPAMType       string          `json:"ipamType,omitempty"`
	Result         json.RawMessage `json:"result,omitempty"`
	DeviceInfoFile string          `json:"deviceInfoFile,omitempty"`

	// DelAttempts counts DELs that failed to restore something.
	DelAttempts int `json:"delAttempts,omitempty"`
}

// PodMACOrActual is the MAC the pod's interface has: the one ADD set, or
// the VF netdev's own.
func (s *State) PodMACOrActual() string {
	if s.PodMAC != "" {
		return s.PodMAC
	}
	return s.HostMAC
}

// bootIDPath holds a random ID the kernel picks at each boot.
const bootIDPath = "/proc/sys/kernel/random/boot_id"

// BootID is this boot's ID ("" when unreadable: no state is then judged
// stale).
func BootID() string {
	b, err := os.ReadFile(bootIDPath)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// stale reports whether st was written before the node last booted.
func (s *State) stale(boot string) bool {
	return boot != "" && s.BootID != "" && s.BootID != boot
}

// owner names the attachment for messages.
func (s *State) owner() string {
	return fmt.Sprintf("container %s interface %s (network %q)", s.ContainerID, s.IfName, s.Network)
}

// Store keeps state files and per-VF locks in a directory:
// <dir>/<pci>.json (0600) and <dir>/<pci>.lock.
type Store struct {
	dir string
}

// NewStore creates dir (0700) when needed.
func NewStore(dir string) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("state dir %s: %w", dir, err)
	}
	return &Store{dir: dir}, nil
}

func (s *Store) path(vf string) string { return filepath.Join(s.dir, vf+".json") }

// Load reads the state of vf; fs.ErrNotExist when there is none.
func (s *Store) Load(vf string) (*State, error) {
	data, err := os.ReadFile(s.path(vf))
	if err != nil {
		return nil, err
	}
	st := &State{}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, fmt.Errorf("state %s: %w", s.path(vf), err)
	}
	if st.Version != StateVersion {
		return nil, fmt.Errorf("state %s: version %d, this plugin reads version %d", s.path(vf), st.Version, StateVersion)
	}
	return st, nil
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

// List returns the VFs that have a state file, sorted.
func (s *Store) List() ([]string, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", s.dir, err)
	}
	var vfs []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") || !strings.HasSuffix(name, ".json") {
			continue
		}
		vfs = append(vfs, strings.TrimSuffix(name, ".json"))
	}
	sort.Strings(vfs)
	return vfs, nil
}

// Find returns the state of the attachment (containerID, ifName) of
// network, if there is one.
func (s *Store) Find(network, containerID, ifName string) (*State, error) {
	vfs, err := s.List()
	if err != nil {
		return nil, err
	}
	for _, vf := range vfs {
		st, err := s.Load(vf)
		if err != nil {
			continue // gone meanwhile, or not ours to judge here
		}
		if st.Network == network && st.ContainerID == containerID && st.IfName == ifName {
			return st, nil
		}
	}
	return nil, fs.ErrNotExist
}

// LockTimeout bounds the wait for a VF's lock.
const LockTimeout = 30 * time.Second

// Lock is a held per-VF lock.
type Lock struct {
	f    *os.File
	path string
}

// Lock takes the exclusive lock of vf, waiting up to timeout.
func (s *Store) Lock(vf string, timeout time.Duration) (*Lock, error) {
	path := filepath.Join(s.dir, vf+".lock")
	deadline := time.Now().Add(timeout)
	for {
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
		if err != nil {
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		for {
			err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
			if err == nil || !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) {
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		if err != nil {
			f.Close()
			if errors.Is(err, syscall.EWOULDBLOCK) {
				return nil, fmt.Errorf("lock %s: still held by another CNI call after %v", path, timeout)
			}
			return nil, fmt.Errorf("lock %s: %w", path, err)
		}
		// Unlock removes the file: the lock is ours only if the path
		// still names the file we locked.
		if same(f, path) {
			return &Lock{f: f, path: path}, nil
		}
		f.Close()
	}
}

func same(f *os.File, path string) bool {
	a, err := f.Stat()
	if err != nil {
		return false
	}
	b, err := os.Stat(path)
	return err == nil && os.SameFile(a, b)
}

// Unlock releases the lock; remove also deletes the lock file (after the
// attachment is gone).
func (l *Lock) Unlock(remove bool) {
	if remove {
		_ = os.Remove(l.path)
	}
	_ = l.f.Close()
}
