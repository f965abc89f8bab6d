package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// rank is one NCCL rank: its pod and what it uses there.
type rank struct {
	pod, podPath string
	addr         string // its pod's address
	rxe          string // the rxe device on its net1
}

// nccl runs two ranks in two pod netns, one VF stand-in each (the two
// stand-ins are the two ends of one veth: a wire between the pods), and
// all-reduces over sockets, then over rxe. rxe cannot follow its netdev
// into a pod (see afterMove), so each pod's rxe device is made on its
// net1 after ADD, in the pod's netns.
func (p *phase) nccl(ctx context.Context, stack gpuStack, script string) {
	r := p.r
	r.section("NCCL (PyTorch %s, NCCL %s, %d GPU): all-reduce 64 MiB between two pods over the VF stand-ins", stack.Torch, stack.NCCL, stack.GPUs)
	vfs := []standIn{{PCIAddress: vfAddress(1), Netdev: "fprcvf1"}, {PCIAddress: vfAddress(2), Netdev: "fprcvf2"}}
	if _, err := p.veth(vfs[0].Netdev, vfs[1].Netdev); err != nil {
		r.fail("%v", err)
		return
	}
	for i := range vfs {
		l, err := p.node.LinkByName(vfs[i].Netdev)
		if err != nil {
			r.fail("stand-in %s: %v", vfs[i].Netdev, err)
			return
		}
		vfs[i].MAC = l.Attrs().HardwareAddr.String()
	}
	host, err := p.host(vfs...)
	if err != nil {
		r.fail("%v", err)
		return
	}
	n, err := newCNI(p.bin, p.work, host, "rdmacheck-nccl", "192.168.79.0/24")
	if err != nil {
		r.fail("%v", err)
		return
	}
	var ranks []rank
	var rts []*libcni.RuntimeConf
	var pods []string
	defer func() {
		for i := len(rts) - 1; i >= 0; i-- {
			_ = inNetns(ranks[i].podPath, func() error { return p.k.DelRxe(ranks[i].rxe) })
			if err := n.del(ctx, rts[i]); err != nil {
				r.fail("%v; %s", err, n.log())
			}
		}
		p.clean(n, []string{vfs[0].Netdev, vfs[1].Netdev}, pods)
	}()
	for _, vf := range vfs {
		pod, podPath, err := p.podNetns()
		if err != nil {
			r.fail("%v", err)
			return
		}
		pods = append(pods, podPath)
		rt := attachment(pod, podPath, "net1", vf.PCIAddress)
		res, err := n.add(ctx, rt)
		if err != nil {
			r.fail("%v; %s", err, n.log())
			return
		}
		rts = append(rts, rt)
		k := rank{pod: pod, podPath: podPath, addr: res.IPs[0].Address.IP.String(), rxe: "rxefp" + testnet.RandHex(3)}
		ranks = append(ranks, k)
		if err := inNetns(podPath, func() error { return p.k.AddRxe(k.rxe, "net1") }); err != nil {
			r.fail("in pod %s: %v", pod, err)
			return
		}
		r.ok("pod %s: %s -> net1 %s, rxe device %s on it", pod, vf.PCIAddress, res.IPs[0].Address.String(), k.rxe)
	}
	p.allReduce(ctx, host, script, ranks, "Socket")
	if why := verbsUserSpace(); why != "" {
		r.skip("NCCL over rxe: %s", why)
		return
	}
	if why := roceListener(ranks[1].podPath); why != "" {
		r.skip("NCCL over rxe: %s", why)
		return
	}
	p.allReduce(ctx, host, script, ranks, "IB")
}

// allReduce runs both ranks with kind's environment and judges the run.
func (p *phase) allReduce(ctx context.Context, host, script string, ranks []rank, kind string) {
	r := p.r
	ctx, cancel := context.WithTimeout(ctx, 4*time.Minute)
	defer cancel()
	type ran struct {
		out bytes.Buffer
		err error
	}
	runs := make([]*ran, len(ranks))
	done := make(chan struct{}, len(ranks))
	for i, k := range ranks {
		env := append(os.Environ(), "NCCL_DEBUG=INFO", "NCCL_DEBUG_SUBSYS=INIT,ENV,NET", "NCCL_SOCKET_IFNAME=net1",
			"NCCL_HOSTID=fastpath-rdmacheck-"+k.pod, "CUDA_VISIBLE_DEVICES=0")
		if kind == "Socket" {
			env = append(env, "NCCL_IB_DISABLE=1")
		} else {
			env = append(env, "NCCL_IB_HCA=="+k.rxe)
		}
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", k.pod, "python3", script,
			"--rank", fmt.Sprint(i), "--world", fmt.Sprint(len(ranks)), "--addr", ranks[0].addr)
		cmd.Env = env
		runs[i] = &ran{}
		cmd.Stdout, cmd.Stderr = &runs[i].out, &runs[i].out
		go func() { runs[i].err = cmd.Run(); done <- struct{}{} }()
	}
	for range ranks {
		<-done
	}
	var algbw float64
	for i, x := range runs {
		log := filepath.Join(p.work, fmt.Sprintf("nccl-%s-rank%d.log", strings.ToLower(kind), i))
		if err := os.WriteFile(log, x.out.Bytes(), 0o644); err != nil {
			r.fail("%v", err)
			return
		}
		res, perr := parseResult(x.out.String())
		switch {
		case x.err != nil || perr != nil:
			r.fail("%s run, rank %d: %v %v; its output ends:\n%s", kind, i, x.err, perr, tail(x.out.String(), 15))
			continue
		case !res.OK:
			r.fail("%s run, rank %d: the all-reduce's sum is wrong", kind, i)
		default:
			r.ok("%s run, rank %d: sum right on every element of %d MiB", kind, i, res.Bytes>>20)
		}
		if i == 0 {
			algbw = res.AlgBW
		}
		hca := ranks[i].rxe
		if err := wantTransport(parseTransport(x.out.String()), kind, hca); err != nil {
			r.fail("%s run, rank %d: transport: %v", kind, i, err)
		} else {
			r.ok("%s run, rank %d: NCCL used NET/%s%s", kind, i, kind, map[bool]string{true: " over " + hca + " (RoCE)"}[kind == "IB"])
		}
		checks, err := runDoctor(p.bin, host, "--nccl-log", log)
		if err == nil {
			var verdict string
			if verdict, err = wantVerdict(checks, kind); err == nil {
				r.ok("doctor --nccl-log on rank %d's log: %s", i, verdict)
			}
		}
		if err != nil {
			r.fail("%v", err)
		}
	}
	r.note("%s all-reduce of 64 MiB: algbw %.3f GB/s", kind, algbw)
}

// verbsUserSpace says why NCCL could not open an RDMA device here ("" if
// it can): it needs ib_uverbs (the /dev/infiniband/uverbsN nodes; rdma_rxe
// does not load it) and rdma-core's libibverbs with the rxe provider.
func verbsUserSpace() string {
	if _, err := os.Stat(filepath.Join(realSys, "module", "ib_uverbs")); err != nil {
		if out, err := exec.Command("modprobe", "ib_uverbs").CombinedOutput(); err != nil {
			return "ib_uverbs is not loaded and modprobe ib_uverbs failed: " + firstLine(out, err)
		}
	}
	out, err := exec.Command("ldconfig", "-p").Output()
	if err != nil {
		return "ldconfig -p: " + err.Error()
	}
	if !bytes.Contains(out, []byte("libibverbs.so.1")) {
		return "no libibverbs.so.1 (rdma-core's user space: apt install ibverbs-providers, dnf install libibverbs), which NCCL's NET/IB opens"
	}
	return ""
}

// inNetns runs f on a thread in the netns at path.
func inNetns(path string, f func() error) error {
	n, err := netns.Open(path)
	if err != nil {
		return err
	}
	defer n.Close()
	return n.Do(f)
}

// roceListener says why rxe cannot carry RoCE v2 in the pod's netns ("" if
// it can): rxe receives RoCE v2 on a UDP socket (port 4791) that older
// kernels open in the initial netns only.
func roceListener(podPath string) string {
	found := false
	err := inNetns(podPath, func() error {
		for _, f := range []string{"/proc/thread-self/net/udp", "/proc/thread-self/net/udp6"} {
			b, err := os.ReadFile(f)
			if err != nil {
				return err
			}
			found = found || hasUDPPort(b, 4791)
		}
		return nil
	})
	switch {
	case err != nil:
		return "cannot read the pod's UDP sockets: " + err.Error()
	case !found:
		return "no RoCE v2 socket (UDP 4791) in the pod's netns: this kernel's rxe receives only in the initial network namespace, so soft-RoCE cannot carry traffic between pods"
	}
	return ""
}

// hasUDPPort reports whether a /proc/net/udp table has a socket bound to
// local port.
func hasUDPPort(table []byte, port int) bool {
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(bytes.NewReader(table))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 1 && strings.HasSuffix(f[1], want) {
			return true
		}
	}
	return false
}

// tail is the last n lines of s, indented.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "           " + strings.Join(lines, "\n           ")
}
