package plugin

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// candidates are the VFs this attachment may use: the one the conf names,
// or those of resourceName that the kubelet gave the pod, or (no
// resourceName, or none of it) the pod's VFs of fastpath's DRA driver
// (PodResources). fromDRA is set when they are known to be the DRA
// driver's (no resourceName: PodResources gave the pod's DRA VFs only).
func (p *Plugin) candidates(ctx context.Context, c *NetConf, args *skel.CmdArgs) (_ []string, fromDRA bool, _ error) {
	ids, err := p.candidateIDs(ctx, c, args)
	return ids, err == nil && c.deviceID() == "" && c.ResourceName == "", err
}

func (p *Plugin) candidateIDs(ctx context.Context, c *NetConf, args *skel.CmdArgs) ([]string, error) {
	if id := c.deviceID(); id != "" {
		return []string{id}, nil
	}
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, invalidEnv("CNI_ARGS: %v", err)
	}
	ns, pod := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	if (ns == "" || pod == "") && c.ResourceName == "" {
		return nil, invalidConf("no deviceID: Multus passes the VF the device plugin allocated; without Multus, set resourceName so the plugin asks the kubelet which VF the pod holds")
	}
	if ns == "" || pod == "" {
		return nil, invalidEnv("resourceName needs K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS to find the pod's VF")
	}
	ids, err := p.NewPodResources(c.PodResourcesSocket).Devices(ctx, ns, pod, c.ResourceName)
	if err != nil {
		return nil, fmt.Errorf("ask the kubelet for pod %s/%s's %s: %w", ns, pod, cmp.Or(c.ResourceName, "VFs"), err)
	}
	if len(ids) == 0 && c.ResourceName == "" {
		return nil, invalidConf("no deviceID, and pod %s/%s holds no VF of DRA driver %s: Multus passes the VF the device plugin allocated; without Multus, set resourceName so the plugin asks the kubelet which VF the pod holds", ns, pod, DRADriver)
	}
	if len(ids) == 0 {
		return nil, invalidConf("pod %s/%s holds no %s device: request it in the pod's resources (limits: {%s: 1})", ns, pod, c.ResourceName, c.ResourceName)
	}
	for _, id := range ids {
		if !pci.ValidAddress(id) {
			return nil, invalidConf("kubelet says pod %s/%s holds %s device %q, which is not a PCI address", ns, pod, c.ResourceName, id)
		}
	}
	return ids, nil
}

// claim locks the first candidate not attached elsewhere, and clears what
// an earlier boot, a killed call or a pod gone without a DEL left on it.
func (p *Plugin) claim(ctx context.Context, log *slog.Logger, c *NetConf, store *Store, cands []string, args *skel.CmdArgs) (*Lock, string, error) {
	var busy []string
	boot := BootID()
	for _, id := range cands {
		l, err := store.Lock(id, LockTimeout)
		if err != nil {
			return nil, "", fail(types.ErrTryAgainLater, id, "lock", err)
		}
		st, lerr := p.loadState(store, id)
		switch judge(st, lerr, c.Name, args.ContainerID, args.IfName, boot) {
		case vfStale:
			// The reboot reset the VF and took the pod's netns along.
			log.Info("state from before the last boot dropped", "vf", id, "attachment", st.owner())
			if st.IPAMAdded && st.IPAMType != "" {
				// IPAM state may outlive a reboot: its DEL or GC releases it.
				if err := store.SavePending(pendingOf(st)); err != nil {
					log.Warn("its address release not recorded; its DEL only tries it", "vf", id, "err", err)
				}
			}
			if err := store.Remove(id); err != nil {
				l.Unlock(false)
				return nil, "", fail(types.ErrIOFailure, id, "drop stale state", err)
			}
		case vfBadState:
			// Whose it was cannot be told; if the VF is still attached,
			// the netdev is not in the host netns and ADD stops there.
			to, err := store.SetAside(id)
			if err != nil {
				l.Unlock(false)
				return nil, "", fail(types.ErrIOFailure, id, "set aside a bad state", err)
			}
			log.Warn("state file could not be trusted; set aside", "vf", id, "err", lerr, "to", to)
		case vfUnreadable:
			l.Unlock(false)
			return nil, "", fail(types.ErrIOFailure, id, "read state", lerr)
		case vfOwn:
			l.Unlock(false)
			return nil, "", fail(types.ErrInternal, id, "add", fmt.Errorf("already attached as %s; DEL it first", st.owner()))
		case vfBusy:
			free, why := p.reclaim(ctx, log, c, args, store, l, st, boot)
			if !free {
				l.Unlock(false)
				if why != "" {
					why = "; " + why
				}
				busy = append(busy, fmt.Sprintf("%s (%s%s)", id, st.owner(), why))
				continue
			}
		}
		if err := store.clearLeftovers(id); err != nil {
			log.Warn("leftovers of an earlier call", "vf", id, "err", err)
		}
		return l, id, nil
	}
	return nil, "", fail(types.ErrTryAgainLater, strings.Join(cands, ","), "add", fmt.Errorf("%w: attached to %s", ErrBusy, strings.Join(busy, ", ")))
}
