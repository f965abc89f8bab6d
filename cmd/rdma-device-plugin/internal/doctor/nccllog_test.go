package doctor

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// NCCL_DEBUG=INFO lines as NCCL (2.18-2.27) prints them.
const (
	logIB = `node1:31842:31842 [0] NCCL INFO Bootstrap : Using net1:192.168.100.3<0>
node1:31842:31905 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
node1:31842:31905 [0] NCCL INFO NCCL_IB_HCA set to =mlx5_12:1
node1:31842:31905 [0] NCCL INFO NET/IB : Using [0]mlx5_12:1/IB [RO]; OOB net1:192.168.100.3<0>
node1:31842:31905 [0] NCCL INFO Using network IB
node1:31842:31905 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled for HCA 0 'mlx5_12'`
	logNoDevice = `node1:945:945 [0] NCCL INFO Bootstrap : Using eth0:10.244.1.7<0>
node1:945:988 [0] NCCL INFO NCCL_IB_HCA set to mlx5_0
node1:945:988 [0] NCCL INFO NET/IB : No device found.
node1:945:988 [0] NCCL INFO NET/Socket : Using [0]eth0:10.244.1.7<0>
node1:945:988 [0] NCCL INFO Using network Socket
node1:945:988 [0] NCCL INFO NET/Socket : GPU Direct RDMA Disabled for HCA 0 'eth0'`
	logNoVerbs = `4e9a7654171e:8639:8639 [0] NCCL INFO Bootstrap : Using [0]eth0:172.17.0.2<0>
4e9a7654171e:8639:8639 [0] misc/ibvwrap.cc:63 NCCL WARN Failed to open libibverbs.so[.1]
4e9a7654171e:8639:8639 [0] NCCL INFO NET/Socket : Using [0]eth0:172.17.0.2<0>
4e9a7654171e:8639:8639 [0] NCCL INFO Using network Socket`
	logDisabled = `axa:3048391:3048566 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
axa:3048391:3048566 [0] NCCL INFO NET/Socket : Using [0]lo:127.0.0.1<0>
axa:3048391:3048566 [0] NCCL INFO Using network Socket`
	logTimeout = `h:1:2 [5] NCCL INFO NCCL_IB_GID_INDEX set by environment to 0.
h:1:2 [5] NCCL INFO NET/IB : Using [0]mlx5_2:1/RoCE [RO]; OOB net1:192.168.1.20<0>
h:1:2 [5] NCCL INFO Using network IB
h:1:2 [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_2:1, curr state INIT, next state RTR, local GID index 0, local GID fe80::fa:3b00:1, remote GID fe80::fa:3b00:2
h:1:2 [5] ibvwrap.c:262 NCCL WARN Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_2:1
h:1:3 [5] transport/net_ib.cc:839 NCCL WARN NET/IB : Got completion from peer 192.168.1.21<43421> with error 12, opcode 0, len 0, vendor err 129 (Send)`
	logPKey = `h:1:2 [0] NCCL INFO NCCL_IB_PKEY set by environment to 3.
h:1:2 [0] NCCL INFO Using network IB
h:1:2 [0] misc/ibvwrap.cc:187 NCCL WARN Call to ibv_modify_qp failed with error Invalid argument`
	logNoIP = `h:1:2 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to ib
h:1:2 [0] NCCL WARN NET/IB : No IP interface found.
h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
h:1:2 [0] NCCL INFO Using network Socket`
	logUnopenable = `h:1:2 [0] NCCL WARN NET/IB : Unable to open device mlx5_0
h:1:2 [0] NCCL INFO NET/IB : No device found.
h:1:2 [0] NCCL INFO Using network Socket`
	logNoReason = `h:1:2 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
h:1:2 [0] NCCL INFO Using network Socket`
	logQuiet = `epoch 1 loss 0.3`
)

func TestNCCLLog(t *testing.T) {
	root := newHost(t, "generate")
	for _, tc := range []struct {
		name, log string
		want      []struct {
			st   Status
			text []string
		}
	}{
		{"IB in use", logIB, want(OK, "used network IB", "[0]mlx5_12:1/IB")},
		{"no device", logNoDevice, append(want(Fail, ":3", "no ACTIVE port", "doctor --pod"),
			append(want(Fail, "NCCL used NET/Socket ([0]eth0:10.244.1.7<0>)", "reasons above"),
				want(Warn, "GPUDirect RDMA is off for eth0")...)...)},
		{"no libibverbs", logNoVerbs, append(want(Fail, ":2", "no libibverbs", "ibverbs-providers"), want(Fail, "NCCL used NET/Socket")...)},
		{"IB disabled", logDisabled, want(Fail, ":1", "NCCL_IB_DISABLE=1 turned", "remove NCCL_IB_DISABLE")},
		{"RoCE GID that does not route", logTimeout, append(append(want(Fail, ":4", "(2 times)", "GID that does not route", "ib_write_bw"),
			want(Fail, ":6", "retry counter exceeded")...), want(Warn, ":1", "NCCL_IB_GID_INDEX=0 is pinned")...)},
		{"PKey", logPKey, want(Fail, ":3", "partition key", "NCCL_IB_PKEY")},
		{"no IP interface", logNoIP, want(Fail, ":2", "NCCL_SOCKET_IFNAME")},
		{"device not in the container", logUnopenable, want(Fail, ":1", "could not open mlx5_0", "NCCL_IB_HCA")},
		{"socket without a reason", logNoReason, want(Fail, "does not say why", "NCCL_DEBUG_SUBSYS")},
		{"not an NCCL log", logQuiet, want(Skip, "not an NCCL_DEBUG=INFO log")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "train.log")
			require.NoError(t, os.WriteFile(path, []byte(tc.log+"\n"), 0o644))
			r := Run(Options{HostRoot: root, NCCLLog: path})
			for _, w := range tc.want {
				requireCheck(t, r, "nccl-log", w.st, w.text...)
			}
			if tc.name == "IB in use" {
				requireNo(t, r, "nccl-log", Fail)
				requireNo(t, r, "nccl-log", Warn)
			}
		})
	}
	r := Run(Options{HostRoot: root, NCCLLog: filepath.Join(t.TempDir(), "missing.log")})
	requireCheck(t, r, "nccl-log", Fail, "cannot read the log")
	require.False(t, strings.Contains(dump(r), "used network"))
}

func want(st Status, text ...string) []struct {
	st   Status
	text []string
} {
	return []struct {
		st   Status
		text []string
	}{{st, text}}
}
