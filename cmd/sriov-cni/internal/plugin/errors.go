package plugin

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
)

// stepError is a failure of one step on one VF, with the CNI error code
// to report.
type stepError struct {
	code uint
	vf   string
	step string
	err  error
}

func (e *stepError) Error() string {
	if e.vf == "" {
		return fmt.Sprintf("%s: %v", e.step, e.err)
	}
	return fmt.Sprintf("VF %s: %s: %v", e.vf, e.step, e.err)
}

func (e *stepError) Unwrap() error { return e.err }

// fail wraps err as a failure of step on vf with code (0: no code of its
// own). A code carried deeper in err wins: see CNIError.
func fail(code uint, vf, step string, err error) error {
	return &stepError{code: code, vf: vf, step: step, err: err}
}

// ErrBusy is returned when a VF is attached to another container.
var ErrBusy = errors.New("VF is in use")

// CNIError turns any error into the *types.Error the runtime sees: the
// whole message (VF and step included) with the innermost CNI code in the
// chain — a delegated IPAM plugin's own code survives our wrapping, and in
// a joined error (a failure and its rollback) the first one's — or 999
// (internal) when nothing carries one. The runtime never sees code 0.
func CNIError(err error) *types.Error {
	if err == nil {
		return nil
	}
	code, ok := innermostCode(err)
	if !ok {
		code = types.ErrInternal
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "sriov: ") {
		msg = "sriov: " + msg
	}
	return types.NewError(code, msg, "")
}

func innermostCode(err error) (uint, bool) {
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if c, ok := innermostCode(e); ok {
				return c, true
			}
		}
	case interface{ Unwrap() error }:
		if c, ok := innermostCode(u.Unwrap()); ok {
			return c, true
		}
	}
	switch v := err.(type) {
	case *types.Error:
		// Code 0 is not a code: libcni gives it to a delegated plugin
		// that died, printed non-JSON or exited without a word.
		return v.Code, v.Code != 0
	case *stepError:
		return v.code, v.code != 0
	}
	return 0, false
}
