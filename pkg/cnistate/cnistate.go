// Package cnistate is the sriov CNI's state file format: what ADD did, or
// began, to one VF, kept as <stateDir>/<pci>.json so that DEL can undo it
// and so that provisioning (cmd/rdma-device-plugin provision) knows the VF
// is in use. The CNI writes and reads it (cmd/sriov-cni/internal/plugin's
// Store); provisioning only lists it (Attached). One owner, so that a
// renamed field or file name breaks both sides' tests, not a node.
package cnistate

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// DefaultDir is where the CNI keeps its state unless its node
// configuration says otherwise.
const DefaultDir = "/var/lib/cni/sriov"

// Version is the major version of the state file format the plugin
// writes. The rule: a plugin reads every major from 1 up to its own,
// upgrading an older one as it loads it (see upgrade), so a node's running
// attachments survive a plugin upgrade; a file of a major it does not know
// — a newer plugin's, after a downgrade — is set aside like any other file
// it cannot trust, never guessed at. Fields added with omitempty, which an
// older plugin of the same major ignores, do not change the major.
//
// 1: LinkMoved and RDMAMoved were saved once the step was done.
// 2: every step is journaled before it starts (write-ahead): LinkMoved,
// RDMAMoved, VFApplied, IPAMAdded and DeviceInfoFile are intents.
const Version = 2

// Phase is how far ADD got.
type Phase string

// Phases of an attachment.
const (
	PhaseAdding Phase = "adding" // ADD is changing the node; a crash leaves this
	PhaseAdded  Phase = "added"
)

// State is what ADD did, or began, to one VF, so that DEL can undo it even
// when the pod's netns is gone and the conf is all DEL has.
type State struct {
	Version int   `json:"version"`
	Phase   Phase `json:"phase"`
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

	// The journal. ADD sets each of these, and saves the state, before
	// the step it names begins; teardown undoes every step that may have
	// happened, and each undo is idempotent.

	// VFOrig is the VF's settings on the PF before ADD; VFApplied the
	// settings ADD began to change, in order.
	VFOrig    *sriov.VFConfig `json:"vfOrig,omitempty"`
	VFApplied []sriov.Setting `json:"vfApplied,omitempty"`
	// LinkMoved: the netdev's move into the pod began.
	LinkMoved bool `json:"linkMoved,omitempty"`
	// RDMADevice moves with the netdev (exclusive RDMA netns mode);
	// RDMAMoved: its move began.
	RDMADevice string `json:"rdmaDevice,omitempty"`
	RDMAMoved  bool   `json:"rdmaMoved,omitempty"`
	// IPAMAdded: the IPAM plugin's ADD was started.
	IPAMType  string `json:"ipamType,omitempty"`
	IPAMAdded bool   `json:"ipamAdded,omitempty"`
	// DeviceInfoFile is the device-info file ADD began to write; only
	// that one is removed, and only while it still names this VF.
	DeviceInfoFile string `json:"deviceInfoFile,omitempty"`

	Result json.RawMessage `json:"result,omitempty"`

	// DelAttempts counts DELs that failed to restore something.
	DelAttempts int `json:"delAttempts,omitempty"`
}

// FileName is the name of vf's state file in the state dir.
func FileName(vf string) string { return vf + ".json" }

// VFOf is the VF whose state file is called name; false when name is not
// a state file's.
func VFOf(name string) (string, bool) {
	vf, ok := strings.CutSuffix(name, ".json")
	return vf, ok && pci.ValidAddress(vf)
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

// Stale reports whether s was written before the node last booted.
func (s *State) Stale(boot string) bool {
	return boot != "" && s.BootID != "" && s.BootID != boot
}

// Owner names the attachment for messages.
func (s *State) Owner() string {
	return fmt.Sprintf("container %s interface %s (network %q)", s.ContainerID, s.IfName, s.Network)
}

// Is reports whether s is the attachment (containerID, ifName) of network.
func (s *State) Is(network, containerID, ifName string) bool {
	return s.Network == network && s.ContainerID == containerID && s.IfName == ifName
}

// Decode parses a state file of vf and upgrades it to Version. Every
// error means the file cannot be trusted.
func Decode(vf string, data []byte) (*State, error) {
	st := &State{}
	if err := json.Unmarshal(data, st); err != nil {
		return nil, err
	}
	if st.Version < 1 || st.Version > Version {
		return nil, fmt.Errorf("version %d, this plugin reads versions 1 to %d", st.Version, Version)
	}
	upgrade(st)
	if err := st.Valid(vf); err != nil {
		return nil, err
	}
	return st, nil
}

// upgrade turns a state an older plugin wrote into this version's meaning.
func upgrade(st *State) {
	if st.Version == 1 {
		// Version 1 released every IPAM allocation on DEL, and saved
		// LinkMoved and RDMAMoved only once done: a state ADD left
		// half-way may have begun either.
		st.IPAMAdded = st.IPAMType != ""
		if st.Phase == PhaseAdding {
			st.LinkMoved = !st.VFIO && st.HostName != ""
			st.RDMAMoved = st.RDMADevice != ""
		}
	}
	st.Version = Version
}

// Valid checks what teardown relies on, so that a state that parses but
// names something else is not acted on.
func (s *State) Valid(vf string) error {
	switch {
	case s.PCIAddress != vf:
		return fmt.Errorf("pciAddress %q in the state of %s", s.PCIAddress, vf)
	case s.Phase != PhaseAdding && s.Phase != PhaseAdded:
		return fmt.Errorf("phase %q", s.Phase)
	case s.ContainerID == "" || s.Network == "":
		return fmt.Errorf("no containerID or network")
	case ifname.Check(s.IfName) != nil:
		return fmt.Errorf("ifName: %v", ifname.Check(s.IfName))
	case s.PFAddress != "" && !pci.ValidAddress(s.PFAddress):
		return fmt.Errorf("pfAddress %q", s.PFAddress)
	case s.HostName != "" && ifname.Check(s.HostName) != nil:
		return fmt.Errorf("hostName: %v", ifname.Check(s.HostName))
	case s.PFNetdev != "" && ifname.Check(s.PFNetdev) != nil:
		return fmt.Errorf("pfNetdev: %v", ifname.Check(s.PFNetdev))
	case len(s.VFApplied) > 0 && s.VFOrig == nil:
		return fmt.Errorf("vfApplied without vfOrig")
	}
	for _, a := range s.VFApplied {
		if !a.Known() {
			return fmt.Errorf("vfApplied: unknown VF setting %q", a)
		}
	}
	if s.DeviceInfoFile != "" && !strings.HasPrefix(s.DeviceInfoFile, "/") {
		return fmt.Errorf("deviceInfoFile %q is not absolute", s.DeviceInfoFile)
	}
	return nil
}

// Attached reads dir's state files, as provisioning does to know which VFs
// are in use: each regular file named <pci>.json is a VF attached to a
// container, said as "CNI attachment of container <id> (network <name>)".
// A file that does not decode still holds its VF ("-" for what it lacks):
// the CNI sets such a file aside only at its next ADD or DEL of that VF,
// and until then the VF may be in a pod. No dir: nothing is attached.
func Attached(dir string) (map[string]string, error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err // os.ReadDir's error names dir
	}
	out := map[string]string{}
	for _, e := range ents {
		vf, ok := VFOf(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		var st State
		if b, err := os.ReadFile(filepath.Join(dir, e.Name())); err == nil {
			_ = json.Unmarshal(b, &st)
		}
		id := st.ContainerID
		if len(id) > 12 {
			id = id[:12]
		}
		out[vf] = fmt.Sprintf("CNI attachment of container %s (network %s)", orDash(id), orDash(st.Network))
	}
	return out, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Leftover reports whether name, a file in the state dir, is one the
// fastpath CNI writes beside the state files: a VF's lock (<pci>.lock),
// its pinned netns (<pci>.netns), a state set aside (<pci>.json.bad), an
// attachment's lock (attach-<key>.lock), tombstone (deleted-<key>.json)
// and DEL request (deleting-<key>), a pending address release
// (ipam-<key>.pending),
// and the temporaries of its atomic writes (.<name>.tmp-*, a state file's
// included). An uninstall
// removes them once no VF is attached. Upstream sriov-cni's cache files in
// the same directory (<containerID>-<ifName>) are none of these.
func Leftover(name string) bool {
	if base, _, ok := strings.Cut(name, ".tmp-"); ok && strings.HasPrefix(base, ".") {
		if _, state := VFOf(base[1:]); state {
			return true
		}
		name = base[1:]
	}
	for _, suffix := range []string{".lock", ".netns", ".json.bad"} {
		if vf, ok := strings.CutSuffix(name, suffix); ok && pci.ValidAddress(vf) {
			return true
		}
	}
	for _, f := range [][2]string{{"attach-", ".lock"}, {"deleted-", ".json"}, {"deleting-", ""}, {"ipam-", ".pending"}} {
		if key, ok := strings.CutPrefix(name, f[0]); ok {
			if key, ok = strings.CutSuffix(key, f[1]); ok && isKey(key) {
				return true
			}
		}
	}
	return false
}

// isKey: an attachment's key, 24 lower-case hex digits.
func isKey(s string) bool {
	if len(s) != 24 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
