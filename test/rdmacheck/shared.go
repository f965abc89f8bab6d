package main

import (
	"context"
	"net"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

// shared runs the CNI in shared mode, in the check's own netns: the
// netdev moves, the RDMA device stays where it is, visible to every
// netns, and its GIDs follow the address the pod gets.
func (p *phase) shared(ctx context.Context) {
	r := p.r
	r.section("shared RDMA netns mode: the netdev moves, the RDMA device stays visible, its GIDs follow the pod's address")
	dev := "rxefp" + testnet.RandHex(3)
	vf := standIn{PCIAddress: vfAddress(0), Netdev: "fprcvf0", RDMA: dev}
	l, ok := p.rxeStandIn(&vf, "fprcpeer0")
	if !ok {
		return
	}
	r.ok("rdma link add %s type rxe netdev %s: port 1 ACTIVE", dev, vf.Netdev)
	addr, err := p.hostAddr(l, "192.168.77.1/24")
	if err != nil {
		r.fail("%v", err)
		return
	}
	if g, err := waitGID(portDir(p.k.Sys(), dev), addr.IP, vf.Netdev, 10*time.Second); err != nil {
		r.fail("GID of the node's address: %v", err)
	} else {
		r.ok("GID follows the node's address: %s", g)
	}
	host, err := p.host(vf)
	if err != nil {
		r.fail("%v", err)
		return
	}
	r.note("fixture host %s: VF %s of PF %s, netdev %s, RDMA device %s (its ports: the kernel's)", host, vf.PCIAddress, hostPF, vf.Netdev, dev)
	p.doctor(host, dev)
	if err := p.node.AddrDel(l, addr); err != nil {
		r.fail("ip addr del %s: %v", addr, err)
	}

	pod, podPath, err := p.podNetns()
	if err != nil {
		r.fail("%v", err)
		return
	}
	n, err := newCNI(p.bin, p.work, host, "rdmacheck-shared", "192.168.78.0/24")
	if err != nil {
		r.fail("%v", err)
		return
	}
	rt := attachment(pod, podPath, "net1", vf.PCIAddress)
	res, err := n.add(ctx, rt)
	if err != nil {
		r.fail("%v; %s", err, n.log())
		return
	}
	podIP := res.IPs[0].Address.IP
	r.ok("ADD %s -> %s in %s, %s", vf.PCIAddress, rt.IfName, pod, res.IPs[0].Address.String())
	p.afterMove(dev, vf, podIP, podPath)
	p.checkAndDel(ctx, n, rt, "")
	p.clean(n, []string{vf.Netdev}, []string{podPath})
}

// afterMove checks the RDMA device once its netdev is in the pod (shared
// mode): still registered and visible in the pod's netns, with a RoCE v2
// GID for the pod's address on the pod's interface. rxe unregisters its
// device when its netdev leaves the netns (its netdev notifier takes the
// NETDEV_UNREGISTER a netns move sends for a removal); that is
// soft-RoCE's limit, not the CNI's, and the fixture host then follows
// the kernel: the VF has no RDMA device, as sysfs would show.
func (p *phase) afterMove(dev string, vf standIn, podIP net.IP, podPath string) {
	r := p.r
	gone, err := p.k.Gone(dev, 3*time.Second)
	switch {
	case err != nil:
		r.fail("RDMA device %s after the move: %v", dev, err)
		return
	case gone:
		r.limit("rxe unregistered %s when %s left the node's netns (the rxe driver deletes its device on the NETDEV_UNREGISTER a netns move sends; a ConnectX VF keeps its RDMA device): the pod's GID cannot be looked for on soft-RoCE", dev, vf.Netdev)
		p.follow(vf)
		return
	}
	if ok, err := presentAt(p.k, dev, podPath); err != nil || !ok {
		r.fail("RDMA device %s not visible in the pod's netns in shared mode (present %v, %v)", dev, ok, err)
	} else {
		r.ok("RDMA device %s stayed registered and is visible in the pod's netns", dev)
	}
	if g, err := waitGID(portDir(p.k.Sys(), dev), podIP, "net1", 10*time.Second); err != nil {
		r.fail("GID of the pod's address: %v", err)
	} else {
		r.ok("GID follows the pod's address: %s", g)
	}
}
