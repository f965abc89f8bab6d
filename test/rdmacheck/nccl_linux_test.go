package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// fakeRanks stands in for allreduce.py where there is no GPU: run as a
// rank is (ip netns exec <pod> python3 …), it checks that it is in a pod
// with net1, prints the NCCL_DEBUG=INFO lines NCCL prints for the
// transport its environment asks for, and a RESULT line.
const fakeRanks = `import argparse, os, sys
p = argparse.ArgumentParser()
p.add_argument("--rank", type=int); p.add_argument("--world", type=int); p.add_argument("--addr")
a = p.parse_args()
if not os.path.exists("/sys/class/net/net1"):
    sys.exit("not in a pod's netns: no net1")
pre = "pod:%d:%d [0] NCCL INFO " % (os.getpid(), os.getpid())
if os.environ.get("NCCL_IB_DISABLE") == "1":
    print(pre + "NCCL_IB_DISABLE set by environment to 1.")
    print(pre + "NET/Socket : Using [0]net1:" + a.addr + "<0>")
    print(pre + "Using network Socket")
    print(pre + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0")
else:
    hca = os.environ["NCCL_IB_HCA"].lstrip("=")
    print(pre + "NET/IB : Using [0]" + hca + ":1/RoCE [RO]; OOB net1:" + a.addr + "<0>")
    print(pre + "Using network IB")
    print(pre + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0")
print("RESULT rank=%d ok=True bytes=67108864 time_us=1000 algbw_GBps=67.109" % a.rank)
`

// TestNCCLPhase runs the NCCL phase's plumbing over a stand-in RDMA core,
// with stand-in ranks: two pods through the real CNI, a rank in each
// (ip netns exec), the transport judged, the real doctor's verdict on each
// log, the figures, nothing left behind.
func TestNCCLPhase(t *testing.T) {
	bin := phaseBinaries(t)
	script := filepath.Join(t.TempDir(), "ranks.py")
	require.NoError(t, os.WriteFile(script, []byte(fakeRanks), 0o644))
	k := newStandInKernel(t, nil)
	r, out, _ := runPhase(t, k, bin, modeShared, func(p *phase) {
		p.nccl(context.Background(), gpuStack{Torch: "stand-in", NCCL: "stand-in", GPUs: 1}, script)
	})
	require.False(t, r.failed(), out)
	for _, want := range []string{
		"ok     pod fprc-pod-", "-> net1 192.168.79.2/24, rxe device rxefp", "-> net1 192.168.79.3/24, rxe device rxefp",
		"ok     Socket run, rank 0: sum right on every element of 64 MiB",
		"ok     Socket run, rank 1: NCCL used NET/Socket",
		"ok     doctor --nccl-log on rank 1's log: fail nccl-log",
		"NCCL_IB_DISABLE=1 turned the IB transport off",
		"Socket all-reduce of 64 MiB: algbw 67.109 GB/s",
		"ok     nothing left behind: stand-ins back in the node's netns under their own names",
	} {
		require.Contains(t, out, want)
	}
	if why := verbsUserSpace(); why != "" {
		require.Contains(t, out, "skip   NCCL over rxe: "+why)
		return
	}
	// A machine with ib_uverbs and libibverbs but no RDMA netlink: the IB
	// run is judged too (the stand-in rxe has no RoCE socket, so a real
	// kernel's check would skip here; the stand-in ranks do not care).
	require.Contains(t, out, "NCCL over rxe: no RoCE v2 socket")
	require.Empty(t, k.devs)
}
