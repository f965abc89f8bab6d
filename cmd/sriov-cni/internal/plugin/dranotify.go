package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/fastpath-k8s/fastpath/internal/netdata"
)

// draNotifyTimeout bounds the call to the DRA driver: the kubelet waits
// for the pod's network before it starts its containers.
const draNotifyTimeout = 2 * time.Second

// tellDRA tells fastpath's DRA driver, after a successful ADD of a VF it
// prepared for one of the pod's claims, the VF's interface in the pod
// (name, MAC, addresses), and waits for it: the driver writes them into
// the claim's device metadata file (KEP-5304's networkData), which the
// pod's containers, created after the sandbox's network, find mounted.
//
// The VF is the driver's when PodResources gave it as one of the pod's
// DRA VFs (no deviceID, no resourceName: fromDRA), or, with a deviceID
// (Multus found it in the claim's CDI names), when the driver's socket
// exists on the node and PodResources lists the VF among the pod's DRA
// VFs: held, what the deviceID check or the resourceName lookup already
// asked, or else one List. A node without the socket has no DRA driver: a
// VF of the device plugin costs one stat. The network works without the metadata: a
// driver that cannot be told (no socket, a refusal, a timeout) leaves the
// ADD successful, with a warning on stderr that names the VF and why.
func (p *Plugin) tellDRA(ctx context.Context, log *slog.Logger, c *NetConf, args *skel.CmdArgs, vf string, held *PodDevices, fromDRA bool, result types.Result) {
	socket := p.Node.DRASocket
	if socket == "" {
		return
	}
	var ka k8sArgs
	_ = types.LoadArgs(args.Args, &ka) // checked where it decides; a pod unnamed here is told below
	ns, pod, uid := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME), string(ka.K8S_POD_UID)
	if !fromDRA {
		if _, err := os.Stat(socket); errors.Is(err, fs.ErrNotExist) || ns == "" || pod == "" {
			return // no DRA driver here, or no pod to ask about
		}
		if held == nil {
			h, err := p.NewPodResources(p.Node.PodResourcesSocket).Pod(ctx, ns, pod)
			if err != nil {
				p.warnDRA(log, c, vf, args.IfName, fmt.Errorf("cannot tell whether it is a VF of DRA driver %s: %w", DRADriver, err))
				return
			}
			held = &h
		}
		if !slices.Contains(held.DRAVFs, vf) {
			log.Debug("VF not of the DRA driver: no device metadata to publish", "pod", ns+"/"+pod)
			return
		}
	}
	if ns == "" || pod == "" || uid == "" {
		p.warnDRA(log, c, vf, args.IfName, errors.New("CNI_ARGS lack K8S_POD_NAMESPACE, K8S_POD_NAME or K8S_POD_UID, which name the pod to the driver"))
		return
	}
	req := netdata.Request{PCIAddress: vf, PodNamespace: ns, PodName: pod, PodUID: uid, InterfaceName: args.IfName}
	if res, err := current.NewResultFromResult(result); err == nil {
		for _, i := range res.Interfaces {
			if i.Name == args.IfName && i.Mac != "" {
				req.HardwareAddress = i.Mac
			}
		}
		for _, ip := range res.IPs {
			req.IPs = append(req.IPs, ip.Address.String())
		}
	}
	ctx, cancel := context.WithTimeout(ctx, draNotifyTimeout)
	defer cancel()
	resp, err := netdata.Send(ctx, socket, req)
	if err != nil {
		p.warnDRA(log, c, vf, args.IfName, err)
		return
	}
	log.Info("device metadata has the VF's interface", "claim", resp.Claim, "request", resp.Request, "ips", req.IPs)
}

// warnDRA says that the VF works but its device metadata lacks its
// interface, and why: in the log, and on stderr (the runtime's log)
// when the log goes to a file.
func (p *Plugin) warnDRA(log *slog.Logger, c *NetConf, vf, ifName string, why error) {
	const msg = "VF attached, but the DRA driver was not told its interface: the pod's device metadata has no networkData for it"
	log.Warn(msg, "err", why) // the log names the VF and the interface
	if c.LogFile != "" && p.Stderr != nil {
		fmt.Fprintf(p.Stderr, "sriov: warning: VF %s attached as %s, but the DRA driver was not told its interface (the pod's device metadata has no networkData for it): %v\n", vf, ifName, why)
	}
}
