package plugin

import (
	"fmt"

	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
)

// The state file's format is package cnistate's, which provisioning reads
// too; the names below keep the plugin's code as it was.

// StateVersion is the major version of the state file format this plugin
// writes (cnistate.Version says the rule).
const StateVersion = cnistate.Version

// Phase is how far ADD got.
type Phase = cnistate.Phase

// Phases of an attachment.
const (
	PhaseAdding = cnistate.PhaseAdding
	PhaseAdded  = cnistate.PhaseAdded
)

// State is what ADD did, or began, to one VF: cnistate.State, with the
// plugin's own methods.
type State cnistate.State

// format is st as the format's owner sees it.
func (s *State) format() *cnistate.State { return (*cnistate.State)(s) }

// PodMACOrActual is the MAC the pod's interface has: the one ADD set, or
// the VF netdev's own.
func (s *State) PodMACOrActual() string { return s.format().PodMACOrActual() }

// BootID is this boot's ID ("" when unreadable: no state is then judged
// stale).
func BootID() string { return cnistate.BootID() }

// stale reports whether st was written before the node last booted.
func (s *State) stale(boot string) bool { return s.format().Stale(boot) }

// owner names the attachment for messages.
func (s *State) owner() string { return s.format().Owner() }

// is reports whether st is the attachment (containerID, ifName) of network.
func (s *State) is(network, containerID, ifName string) bool {
	return s.format().Is(network, containerID, ifName)
}

// decodeState parses a state file of vf and upgrades it to StateVersion.
// Every error means the file cannot be trusted (ErrBadState).
func decodeState(vf string, data []byte) (*State, error) {
	st, err := cnistate.Decode(vf, data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	return (*State)(st), nil
}

// valid checks what teardown relies on, so that a state that parses but
// names something else is not acted on.
func (s *State) valid(vf string) error { return s.format().Valid(vf) }
