// Command rdmacheck is make rdma-check: fastpath's RDMA path on the
// running kernel's RDMA core, through soft-RoCE (rdma_rxe) on veth links
// that stand in for VFs whose PCI side is a fixture host. It runs the
// real sriov CNI (ADD, CHECK, DEL through libcni, host-local IPAM) in both
// RDMA netns modes, switching the mode when it must and restoring it,
// and rdma-device-plugin doctor against the real RDMA netlink; where a
// GPU, PyTorch and NCCL are present, two NCCL ranks in two pods
// all-reduce over sockets and over rxe, and doctor reads their logs.
// Where the kernel has no rdma_rxe it prints why and exits 0. See
// docs/rdma-check.md.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

const (
	modeShared    = "shared"
	modeExclusive = "exclusive"
	// phaseEnv and binEnv pass the shared phase and the binaries to the
	// check's isolated child.
	phaseEnv = "FASTPATH_RDMACHECK_PHASE"
	binEnv   = "FASTPATH_RDMACHECK_BIN"
)

func main() {
	script := flag.String("script", "test/rdmacheck/allreduce.py", "the NCCL rank script")
	flag.Parse()
	if os.Geteuid() != 0 {
		fmt.Fprintln(os.Stderr, "make rdma-check needs root: it loads rdma_rxe, makes veth links, rxe devices and network namespaces, and may switch the RDMA netns mode (sudo make rdma-check)")
		os.Exit(2)
	}
	abs, err := filepath.Abs(*script)
	if err != nil {
		fmt.Fprintln(os.Stderr, "rdma-check:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if os.Getenv(phaseEnv) == modeShared {
		os.Exit(testnet.Own(func() int { return sharedChild(ctx, os.Getenv(binEnv), abs) }))
	}
	os.Exit(run(ctx, abs))
}

// run is the check in the netns it was started in: the skip decision,
// the build, each mode in turn (the node's own first), the mode put back.
func run(ctx context.Context, script string) int {
	out := os.Stdout
	fmt.Fprintln(out, "rdma-check: soft-RoCE (rdma_rxe) on veth stand-ins for VFs; the sriov CNI in both RDMA netns modes; doctor; NCCL where a GPU is")
	if why := loadRxe(realSys); why != "" {
		fmt.Fprintln(out, "skip:", why)
		return 0
	}
	orig, err := netnsMode()
	if err != nil {
		fmt.Fprintf(out, "FAIL: rdma_rxe is loaded, but %v\n", err)
		return 1
	}
	fmt.Fprintf(out, "rdma_rxe loaded; RDMA netns mode %s\n", orig)
	r := newReport(out)
	bin, err := os.MkdirTemp("", "fastpath-rdmacheck-bin-")
	if err != nil {
		fmt.Fprintln(out, "FAIL:", err)
		return 1
	}
	defer os.RemoveAll(bin)
	if err := build(bin); err != nil {
		fmt.Fprintln(out, "FAIL:", err)
		return 1
	}
	failed := false
	cur := orig
	for _, m := range []string{orig, other(orig)} {
		if ctx.Err() != nil {
			break
		}
		if m != cur {
			if err := setNetnsMode(m); err != nil {
				r.section("%s RDMA netns mode", m)
				also := ""
				if m == modeShared {
					also = " (and NCCL, which runs in shared mode)"
				}
				r.skip("%s mode%s: the kernel refused the switch: %v. It switches only while no network namespace but the initial one exists (no containers, no ip netns); to check it, run make rdma-check on an idle node, or boot with ib_core netns_mode=%d",
					m, also, err, map[string]int{modeShared: 1, modeExclusive: 0}[m])
				continue
			}
			cur = m
			fmt.Fprintf(out, "\nRDMA netns mode set to %s (rdma system set netns %s)\n", m, m)
		}
		switch m {
		case modeShared:
			failed = sharedInChild(out, bin) || failed
		case modeExclusive:
			p, err := newPhase(r, kernelRDMA{}, bin, m)
			if err != nil {
				r.fail("%v", err)
				continue
			}
			p.exclusive(ctx)
			p.cleanup()
		}
	}
	if cur != orig {
		if err := setNetnsMode(orig); err != nil {
			r.fail("RDMA netns mode not restored to %s: %v; run `rdma system set netns %s`", orig, err, orig)
		} else {
			fmt.Fprintf(out, "\nRDMA netns mode restored to %s\n", orig)
		}
	}
	if len(r.counts) > 0 {
		fmt.Fprintf(out, "\n  exclusive mode and the mode switches: %s\n", r.summary())
	}
	failed = failed || r.failed()
	if failed {
		fmt.Fprintln(out, "\nrdma-check: FAIL")
		return 1
	}
	fmt.Fprintln(out, "\nrdma-check: PASS")
	return 0
}

func other(mode string) string {
	if mode == modeShared {
		return modeExclusive
	}
	return modeShared
}

// sharedInChild runs the shared phase in a network (and mount) namespace
// of the check's own, as make demo runs, and reports whether it failed.
func sharedInChild(out *os.File, bin string) bool {
	os.Setenv(phaseEnv, modeShared)
	os.Setenv(binEnv, bin)
	defer os.Unsetenv(phaseEnv)
	code := testnet.Own(func() int {
		fmt.Fprintln(out, "FAIL: the shared phase needs a netns of its own (root)")
		return 1
	})
	return code != 0
}

// sharedChild is the shared phase, then NCCL, in the isolated child.
func sharedChild(ctx context.Context, bin, script string) int {
	r := newReport(os.Stdout)
	p, err := newPhase(r, kernelRDMA{}, bin, modeShared)
	if err != nil {
		fmt.Println("FAIL:", err)
		return 1
	}
	p.shared(ctx)
	p.cleanup()
	r.section("NCCL")
	if stack, why := probeGPU(); why != "" {
		r.skip("NCCL all-reduce: %s", why)
	} else if p, err = newPhase(r, kernelRDMA{}, bin, modeShared); err != nil {
		r.fail("%v", err)
	} else {
		p.nccl(ctx, stack, script)
		p.cleanup()
	}
	fmt.Printf("\n  shared mode and NCCL: %s\n", r.summary())
	if r.failed() {
		return 1
	}
	return 0
}

// build builds the device plugin, the CNI and host-local into bin.
func build(bin string) error {
	for _, b := range []struct{ pkg, name string }{
		{"./cmd/rdma-device-plugin", "rdma-device-plugin"},
		{"./cmd/sriov-cni", "sriov"},
		{"github.com/containernetworking/plugins/plugins/ipam/host-local", "host-local"},
	} {
		if out, err := exec.Command("go", "build", "-buildvcs=false", "-o", filepath.Join(bin, b.name), b.pkg).CombinedOutput(); err != nil {
			return fmt.Errorf("go build %s: %w\n%s", b.pkg, err, out)
		}
	}
	return nil
}
