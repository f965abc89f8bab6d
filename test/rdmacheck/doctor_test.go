package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// doctor's findings as it words them (cmd/rdma-device-plugin/internal/doctor).
var (
	netnsShared = doctorCheck{Name: "rdma-netns", Status: "ok", Subject: "RDMA netlink",
		Message: "shared (the default): every pod sees every RDMA device of the node but opens only the char devices it was given; for multi-tenant nodes prefer exclusive"}
	netnsExclusive = doctorCheck{Name: "rdma-netns", Status: "ok", Subject: "RDMA netlink",
		Message: "exclusive: each RDMA device lives in one network namespace, and a pod sees only those moved into it with its VF"}
	netnsParam = doctorCheck{Name: "rdma-netns", Status: "ok", Subject: "/host/sys/module/ib_core/parameters/netns_mode",
		Message: "shared (the default): every pod sees every RDMA device of the node"}
	portOK   = doctorCheck{Name: "port", Status: "ok", Message: "1 port ACTIVE and LinkUp"}
	portDown = doctorCheck{Name: "port", Status: "fail", Subject: "rxefp1 port 1 (0000:5e:00.2 fprcvf0)",
		Message: "state DOWN (phys_state Disabled): NCCL skips ports that are not ACTIVE"}
	gidOK   = doctorCheck{Name: "roce-gid", Status: "ok", Message: "1 RoCE netdev: every IPv4 address has its RoCE v2 GID"}
	gidMiss = doctorCheck{Name: "roce-gid", Status: "fail", Subject: "rxefp1 port 1 (fprcvf0)",
		Message: "fprcvf0 has 192.168.77.1 but its port has no RoCE v2 GID for it"}
	modules = doctorCheck{Name: "modules", Status: "fail", Message: "mlx5_ib is not loaded"}
)

func TestJudgeDoctor(t *testing.T) {
	for _, tc := range []struct {
		name   string
		checks []doctorCheck
		mode   string
		good   int
		bad    []string
	}{
		{"shared, healthy", []doctorCheck{modules, netnsShared, portOK, gidOK}, modeShared, 3, nil},
		{"exclusive, healthy", []doctorCheck{netnsExclusive, portOK, gidOK}, modeExclusive, 3, nil},
		{"the other mode", []doctorCheck{netnsShared, portOK, gidOK}, modeExclusive, 2, []string{`doctor rdma-netns: want ok "exclusive" from RDMA netlink`}},
		{"the mode from ib_core's parameter", []doctorCheck{netnsParam, portOK, gidOK}, modeShared, 2, []string{`want ok "shared" from RDMA netlink`}},
		{"port down", []doctorCheck{netnsShared, portDown, gidOK}, modeShared, 2, []string{"doctor port: want rxefp1's port ACTIVE and LinkUp, got [fail port"}},
		{"GID missing", []doctorCheck{netnsShared, portOK, gidMiss}, modeShared, 2, []string{"doctor roce-gid: want ok: every IPv4 address has its RoCE v2 GID, got [fail roce-gid"}},
		{"nothing", nil, modeShared, 0, []string{"rdma-netns", "port", "roce-gid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			good, bad := judgeDoctor(tc.checks, tc.mode, "rxefp1")
			require.Len(t, good, tc.good)
			require.Len(t, bad, len(tc.bad), "%v", bad)
			for i, want := range tc.bad {
				require.ErrorContains(t, bad[i], want)
			}
		})
	}
}
