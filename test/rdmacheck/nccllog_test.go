package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
)

// Rank 0's output of the two runs, as NCCL 2.18-2.23 prints its
// NCCL_DEBUG=INFO lines (NCCL_DEBUG_SUBSYS=INIT,ENV,NET) and allreduce.py
// its RESULT line.
const (
	socketRun = `pod-a:4100:4100 [0] NCCL INFO Bootstrap : Using net1:192.168.79.2<0>
pod-a:4100:4100 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to net1
pod-a:4100:4123 [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.
pod-a:4100:4123 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
pod-a:4100:4123 [0] NCCL INFO NET/Socket : Using [0]net1:192.168.79.2<0>
pod-a:4100:4123 [0] NCCL INFO Using network Socket
pod-a:4100:4123 [0] NCCL INFO comm 0x55d0c1e0 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1b000 commId 0x6c5e1f - Init START
pod-a:4100:4123 [0] NCCL INFO Channel 00/02 :    0   1
pod-a:4100:4123 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
pod-a:4100:4123 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
pod-a:4100:4123 [0] NCCL INFO Connected all rings
RESULT rank=0 ok=True bytes=67108864 time_us=61000 algbw_GBps=1.100`
	ibRun = `pod-a:4200:4200 [0] NCCL INFO Bootstrap : Using net1:192.168.79.2<0>
pod-a:4200:4223 [0] NCCL INFO NCCL_IB_HCA set to =rxefp1a2b3c
pod-a:4200:4223 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so. Using internal network plugin.
pod-a:4200:4223 [0] NCCL INFO NET/IB : Using [0]rxefp1a2b3c:1/RoCE [RO]; OOB net1:192.168.79.2<0>
pod-a:4200:4223 [0] NCCL INFO Using network IB
pod-a:4200:4223 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0
pod-a:4200:4223 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0
pod-a:4200:4223 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'rxefp1a2b3c'
RESULT rank=0 ok=True bytes=67108864 time_us=98000 algbw_GBps=0.685`
	// NET/IB chosen, yet a channel fell back to sockets.
	mixedRun = `h:1:2 [0] NCCL INFO NET/IB : Using [0]rxefp1a2b3c:1/RoCE [RO]; OOB net1:192.168.79.2<0>
h:1:2 [0] NCCL INFO Using network IB
h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0`
	// IB "disabled", but NCCL brought it up (the variable did not reach it).
	leakyRun = `h:1:2 [0] NCCL INFO NET/IB : Using [0]rxefp1a2b3c:1/RoCE [RO]; OOB net1:192.168.79.2<0>
h:1:2 [0] NCCL INFO NET/Socket : Using [0]net1:192.168.79.2<0>
h:1:2 [0] NCCL INFO Using network Socket`
)

func TestTransport(t *testing.T) {
	const hca = "rxefp1a2b3c"
	for _, tc := range []struct {
		name, log, kind, hca, wantErr string
	}{
		{"sockets", socketRun, "Socket", "", ""},
		{"rxe", ibRun, "IB", hca, ""},
		{"sockets where IB was asked", socketRun, "IB", hca, `NCCL chose network "Socket", want IB`},
		{"IB where sockets were asked", ibRun, "Socket", "", `NCCL chose network "IB", want Socket`},
		{"another HCA", ibRun, "IB", "rxefp000000", `NET/IB uses "[0]rxefp1a2b3c:1/RoCE [RO]; OOB net1:192.168.79.2<0>", want rxefp000000 port 1 over RoCE`},
		{"a channel over sockets", mixedRun, "IB", hca, "1 channels connected via NET/Socket, want NET/IB only"},
		{"IB up though disabled", leakyRun, "Socket", "", "NET/IB came up"},
		{"no NCCL log", "RESULT rank=0 ok=True bytes=1 time_us=1 algbw_GBps=1", "Socket", "", `NCCL chose network "", want Socket`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := wantTransport(parseTransport(tc.log), tc.kind, tc.hca)
			if tc.wantErr == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
	tr := parseTransport(ibRun)
	require.Equal(t, map[string]int{"IB": 2}, tr.Channels)
}

func TestParseResult(t *testing.T) {
	r, err := parseResult(socketRun)
	require.NoError(t, err)
	require.Equal(t, rankResult{Rank: 0, OK: true, Bytes: 64 << 20, TimeUS: 61000, AlgBW: 1.1}, r)
	r, err = parseResult("RESULT rank=1 ok=False bytes=67108864 time_us=5 algbw_GBps=2.5\n")
	require.NoError(t, err)
	require.False(t, r.OK)
	_, err = parseResult("Traceback (most recent call last):\nRuntimeError: NCCL error")
	require.ErrorContains(t, err, "no RESULT line")
	_, err = parseResult("RESULT rank=x")
	require.ErrorContains(t, err, `RESULT line "RESULT rank=x"`)
}

// TestVerdicts runs the real doctor --nccl-log on both runs' logs.
func TestVerdicts(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the device plugin")
	}
	bin := testbin.Build(t, "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin")
	root := filepath.Join(t.TempDir(), "host")
	require.NoError(t, writeHost(root, fakeKernel(t, "rxefp1a2b3c", nil), nil))
	verdict := func(log, kind string) (string, error) {
		path := filepath.Join(t.TempDir(), "rank0.log")
		require.NoError(t, os.WriteFile(path, []byte(log), 0o644))
		checks, err := runDoctor(bin, root, "--nccl-log", path)
		require.NoError(t, err)
		return wantVerdict(checks, kind)
	}
	v, err := verdict(socketRun, "Socket")
	require.NoError(t, err)
	require.Contains(t, v, "fail nccl-log")
	require.Contains(t, v, "NCCL_IB_DISABLE=1 turned the IB transport off")
	v, err = verdict(ibRun, "IB")
	require.NoError(t, err)
	require.Contains(t, v, "ok nccl-log")
	require.Contains(t, v, "NCCL used network IB: [0]rxefp1a2b3c:1/RoCE")
	_, err = verdict(socketRun, "IB")
	require.ErrorContains(t, err, "doctor --nccl-log failed the IB run's log")
	_, err = verdict(ibRun, "Socket")
	require.ErrorContains(t, err, "no verdict naming it")
}

func TestHasUDPPort(t *testing.T) {
	udp := []byte(`   sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  112: 00000000:12B7 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 31218 2 0000000000000000 0
  201: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000   101        0 20117 2 0000000000000000 0
`)
	udp6 := []byte(`  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ref pointer drops
  112: 00000000000000000000000000000000:12B7 00000000000000000000000000000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 31219 2 0000000000000000 0
`)
	require.True(t, hasUDPPort(udp, 4791))
	require.True(t, hasUDPPort(udp6, 4791))
	require.True(t, hasUDPPort(udp, 53))
	require.False(t, hasUDPPort(udp, 4790))
	require.False(t, hasUDPPort(udp[:100], 4791), "the header alone")
}
