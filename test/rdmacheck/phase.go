package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

// phase is one run of the check's steps in one RDMA netns mode, with
// what it made undone newest first.
type phase struct {
	r    *report
	bin  string // the built binaries (CNI_PATH too)
	work string // this phase's scratch directory
	mode string
	k    rdmaKernel
	// node is the network namespace the phase's node is: the check's
	// own (shared) or the one it was started in (exclusive).
	node *netlink.Handle
	undo []func() error
}

func newPhase(r *report, k rdmaKernel, bin, mode string) (*phase, error) {
	work, err := os.MkdirTemp("", "fastpath-rdmacheck-"+mode+"-")
	if err != nil {
		return nil, err
	}
	p := &phase{r: r, k: k, bin: bin, work: work, mode: mode, node: &netlink.Handle{}}
	p.later(func() error { return os.RemoveAll(work) })
	return p, nil
}

func (p *phase) later(f func() error) { p.undo = append(p.undo, f) }

// cleanup undoes everything the phase made; what could not be undone is
// a failure (it is left on the node).
func (p *phase) cleanup() {
	for i := len(p.undo) - 1; i >= 0; i-- {
		if err := p.undo[i](); err != nil {
			p.r.fail("cleanup: %v", err)
		}
	}
	p.undo = nil
}

// veth makes a veth pair in the node's netns, both ends up (the stand-in
// has carrier, so rxe's port is ACTIVE); deleting the peer at cleanup
// deletes the stand-in wherever it is.
func (p *phase) veth(name, peer string) (netlink.Link, error) {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1500}, PeerName: peer}
	if err := p.node.LinkAdd(v); err != nil {
		return nil, fmt.Errorf("veth %s/%s: %w", name, peer, err)
	}
	p.later(func() error {
		for _, n := range []string{peer, name} {
			if l, err := p.node.LinkByName(n); err == nil {
				return p.node.LinkDel(l)
			}
		}
		return nil
	})
	for _, n := range []string{peer, name} {
		l, err := p.node.LinkByName(n)
		if err == nil {
			err = p.node.LinkSetUp(l)
		}
		if err != nil {
			return nil, fmt.Errorf("veth %s up: %w", n, err)
		}
	}
	return p.node.LinkByName(name)
}

// rxe makes the rxe device name on netdev (in the caller's netns) and
// deletes it at cleanup.
func (p *phase) rxe(name, netdev string) error {
	if err := p.k.AddRxe(name, netdev); err != nil {
		_ = p.k.DelRxe(name)
		return err
	}
	p.later(func() error { return p.k.DelRxe(name) })
	return nil
}

// rxeStandIn makes the VF stand-in vf.Netdev (a veth with peer) with the
// rxe device vf.RDMA on it, and fills in vf.MAC; false (reported) when
// the kernel refused.
func (p *phase) rxeStandIn(vf *standIn, peer string) (netlink.Link, bool) {
	l, err := p.veth(vf.Netdev, peer)
	if err != nil {
		p.r.fail("%v", err)
		return nil, false
	}
	vf.MAC = l.Attrs().HardwareAddr.String()
	if err := p.rxe(vf.RDMA, vf.Netdev); err != nil {
		p.r.fail("%v", err)
		return nil, false
	}
	return l, true
}

// checkAndDel runs CHECK, then DEL, of an attachment, and reports both.
func (p *phase) checkAndDel(ctx context.Context, n *cniNet, rt *libcni.RuntimeConf, checked string) {
	if err := n.check(ctx, rt); err != nil {
		p.r.fail("%v; %s", err, n.log())
	} else {
		p.r.ok("CHECK %s%s", rt.IfName, checked)
	}
	if err := n.del(ctx, rt); err != nil {
		p.r.fail("%v; %s", err, n.log())
	} else {
		p.r.ok("DEL %s", rt.IfName)
	}
}

// podNetns makes a named netns standing in for a pod's.
func (p *phase) podNetns() (name, path string, err error) {
	name = "fprc-pod-" + testnet.RandHex(3)
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return "", "", fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	p.later(func() error {
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			return fmt.Errorf("ip netns del %s: %w: %s", name, err, out)
		}
		return nil
	})
	return name, filepath.Join(testnet.NetnsDir, name), nil
}

// host writes the phase's fixture host for vfs as the kernel is now.
func (p *phase) host(vfs ...standIn) (string, error) {
	root := filepath.Join(p.work, "host")
	return root, writeHost(root, p.k.Sys(), vfs)
}

// follow rewrites the fixture host as the kernel now is (after a move
// in which the kernel dropped or moved the RDMA device), so that the
// CNI's next call reads what sysfs would show.
func (p *phase) follow(vfs ...standIn) {
	if _, err := p.host(vfs...); err != nil {
		p.r.fail("%v", err)
	}
}

// doctor runs doctor on the host and judges the kernel-facing checks.
func (p *phase) doctor(host, dev string) {
	checks, err := runDoctor(p.bin, host)
	if err != nil {
		p.r.fail("doctor: %v", err)
		return
	}
	good, bad := judgeDoctor(checks, p.mode, dev)
	for _, g := range good {
		p.r.ok("doctor: %s", g)
	}
	for _, b := range bad {
		p.r.fail("%v", b)
	}
}

// clean reports what the attachments left behind.
func (p *phase) clean(n *cniNet, netdevs, pods []string) {
	left := n.leftovers(p.node, netdevs, pods)
	for _, l := range left {
		p.r.fail("left behind: %s", l)
	}
	if len(left) == 0 {
		p.r.ok("nothing left behind: %s back in the node's netns under %s, no CNI state, no address held",
			plural(len(netdevs), "stand-in", "stand-ins"), plural(len(netdevs), "its own name", "their own names"))
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// hostAddr adds cidr to the stand-in in the node's netns: the kernel
// derives its GIDs from it. Deleting the stand-in deletes it.
func (p *phase) hostAddr(l netlink.Link, cidr string) (*netlink.Addr, error) {
	a, err := netlink.ParseAddr(cidr)
	if err != nil {
		return nil, err
	}
	if err := p.node.AddrAdd(l, a); err != nil {
		return nil, fmt.Errorf("ip addr add %s dev %s: %w", cidr, l.Attrs().Name, err)
	}
	return a, nil
}
