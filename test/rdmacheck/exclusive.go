package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

// exclusive runs the CNI in exclusive mode, in the netns the check was
// started in: in exclusive mode a new RDMA device belongs to the initial
// netns, and a device without disassociate support (rxe) cannot be moved
// out of it into a netns of the check's own. The RDMA device must move
// with the netdev: if the kernel moves it, it must be in the pod and come
// back on DEL; if the kernel refuses, ADD must fail naming the kernel's
// reason and roll the netdev back, leaving nothing behind.
func (p *phase) exclusive(ctx context.Context) {
	r := p.r
	r.section("exclusive RDMA netns mode: the RDMA device must move with the netdev, or ADD fails and rolls back")
	tag := testnet.RandHex(4)
	dev := "rxefp" + tag
	vf := standIn{PCIAddress: vfAddress(0), Netdev: "fprc" + tag, RDMA: dev}
	if _, ok := p.rxeStandIn(&vf, "fprp"+tag); !ok {
		return
	}
	if ok, err := p.k.Present(dev, nil); err != nil || !ok {
		r.fail("rxe device %s is not listed by RDMA netlink in this netns (present %v, %v): run make rdma-check in the node's initial network namespace", dev, ok, err)
		return
	}
	r.ok("rdma link add %s type rxe netdev %s: port 1 ACTIVE, listed by RDMA netlink here", dev, vf.Netdev)
	host, err := p.host(vf)
	if err != nil {
		r.fail("%v", err)
		return
	}
	p.doctor(host, dev)

	pod, podPath, err := p.podNetns()
	if err != nil {
		r.fail("%v", err)
		return
	}
	n, err := newCNI(p.bin, p.work, host, "rdmacheck-exclusive", "192.168.78.0/24")
	if err != nil {
		r.fail("%v", err)
		return
	}
	rt := attachment(pod, podPath, "net1", vf.PCIAddress)
	res, addErr := n.add(ctx, rt)
	p.follow(vf)
	if addErr != nil {
		// The runtime's DEL after a failed ADD must succeed too.
		delErr := n.del(ctx, rt)
		if outcome, msg := judgeRefusedMove(addErr, dev); outcome == outLimit {
			r.limit("%s", msg)
		} else {
			r.fail("%s; %s", msg, n.log())
		}
		if delErr != nil {
			r.fail("the runtime's DEL after the failed ADD: %v; %s", delErr, n.log())
		} else {
			r.ok("DEL after the failed ADD")
		}
		p.clean(n, []string{vf.Netdev}, []string{podPath})
		return
	}
	r.ok("ADD %s -> %s in %s, %s", vf.PCIAddress, rt.IfName, pod, res.IPs[0].Address.String())
	if ok, err := presentAt(p.k, dev, podPath); err != nil || !ok {
		r.fail("RDMA device %s is not in the pod's netns after ADD (present %v, %v)", dev, ok, err)
	} else {
		r.ok("RDMA device %s moved into the pod's netns with its netdev", dev)
	}
	p.checkAndDel(ctx, n, rt, " (the RDMA device is where the state says)")
	if ok, err := p.k.Present(dev, nil); err != nil || !ok {
		r.fail("RDMA device %s is not back in the node's netns after DEL (present %v, %v)", dev, ok, err)
	} else {
		r.ok("RDMA device %s back in the node's netns", dev)
	}
	p.clean(n, []string{vf.Netdev}, []string{podPath})
}

// judgeRefusedMove judges a failed ADD in exclusive mode: it must have
// failed on moving the RDMA device dev, with the kernel's reason, and
// rolled back completely (the CNI joins a rollback's failure to the
// error). A refusal handled so is soft-RoCE's limit (outLimit); anything
// else is the CNI's failure (outFail).
func judgeRefusedMove(err error, dev string) (outcome, msg string) {
	text := err.Error()
	step := "move RDMA device " + dev + " into the pod"
	switch {
	case !strings.Contains(text, step):
		return outFail, fmt.Sprintf("ADD failed, but not on the RDMA move (want %q): %v", step, err)
	case strings.Contains(text, "rollback"):
		return outFail, fmt.Sprintf("ADD failed on the RDMA move and its rollback is incomplete: %v", err)
	}
	_, after, _ := strings.Cut(text, step)
	reason := strings.TrimSpace(strings.TrimPrefix(after, ":"))
	return outLimit, fmt.Sprintf("the kernel did not move %s with its netdev; ADD failed with the kernel's reason and rolled back: %s", dev, reason)
}
