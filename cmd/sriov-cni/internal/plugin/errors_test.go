package plugin

import (
	"errors"
	"fmt"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
)

func TestCNIErrorKeepsCodeThroughWrapping(t *testing.T) {
	ipam := types.NewError(types.ErrTryAgainLater, "range busy", "")
	for _, tc := range []struct {
		name string
		err  error
		code uint
		msg  string
	}{
		{"plain", errors.New("boom"), types.ErrInternal, "sriov: boom"},
		{"step", fail(types.ErrIOFailure, "0000:18:00.1", "write state", errors.New("disk full")), types.ErrIOFailure,
			"sriov: VF 0000:18:00.1: write state: disk full"},
		{"delegated code wins", fail(0, "0000:18:00.1", "IPAM host-local ADD", fmt.Errorf("exec: %w", ipam)),
			types.ErrTryAgainLater, "VF 0000:18:00.1: IPAM host-local ADD: exec: range busy"},
		{"innermost step wins", fail(types.ErrInternal, "", "add", fail(types.ErrInvalidNetworkConfig, "0000:18:00.1", "check", errors.New("x"))),
			types.ErrInvalidNetworkConfig, "add: VF 0000:18:00.1: check: x"},
		{"failure joined with its rollback", errors.Join(fail(types.ErrInvalidNetNS, "v", "open pod netns", errors.New("gone")),
			fail(0, "v", "restore", errors.New("x"))), types.ErrInvalidNetNS, "open pod netns"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := CNIError(tc.err)
			require.Equal(t, tc.code, e.Code)
			require.Contains(t, e.Msg, tc.msg)
			require.True(t, len(e.Msg) > 7 && e.Msg[:7] == "sriov: ")
		})
	}
	require.Nil(t, CNIError(nil))
}
