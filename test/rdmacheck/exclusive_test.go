package main

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestJudgeRefusedMove(t *testing.T) {
	const dev = "rxefp0a1b2c3d"
	// As libcni returns the sriov CNI's error: "plugin type=… failed
	// (add): " and the CNI's "sriov: VF <addr>: <step>: <cause>".
	const prefix = `plugin type="sriov" failed (add): sriov: VF 0000:5e:00.2: move RDMA device ` + dev + ` into the pod: `
	for _, tc := range []struct {
		name, err, outcome, msg string
	}{
		{"EOPNOTSUPP (no disassociate_ucontext)", prefix + "move RDMA device " + dev + " to /var/run/netns/fprc-pod-1a2b3c: operation not supported", outLimit,
			"ADD failed with the kernel's reason and rolled back: move RDMA device " + dev + " to /var/run/netns/fprc-pod-1a2b3c: operation not supported"},
		{"unregistered with its netdev", prefix + "RDMA device " + dev + " in /proc/12/task/12/ns/net: Rdma device " + dev + " not found", outLimit,
			"rolled back: RDMA device " + dev + " in /proc/12/task/12/ns/net: Rdma device " + dev + " not found"},
		{"rollback incomplete", prefix + "operation not supported\nrollback: VF 0000:5e:00.2: restore: netdev fprc0a1b: file exists", outFail,
			"its rollback is incomplete"},
		{"another step", `plugin type="sriov" failed (add): sriov: VF 0000:5e:00.2: find netdev: fprc0a1b is not in the host netns`, outFail,
			`not on the RDMA move (want "move RDMA device ` + dev + ` into the pod")`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			outcome, msg := judgeRefusedMove(errors.New(tc.err), dev)
			require.Equal(t, tc.outcome, outcome)
			require.Contains(t, msg, tc.msg)
		})
	}
}
