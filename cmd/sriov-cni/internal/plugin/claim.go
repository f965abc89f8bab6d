package plugin

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
)

// candidates are the VFs this attachment may use: the one the conf names,
// or those of resourceName that the kubelet gave the pod, or (no
// resourceName, or none of it) the pod's VFs of fastpath's DRA driver
// (PodResources). fromDRA is set when they are known to be the DRA
// driver's (no resourceName: PodResources gave the pod's DRA VFs only).
// held is what the kubelet said the pod holds, nil when it was not asked
// (a deviceID with the node's deviceIDCheck off): tellDRA reads it rather
// than ask again.
func (p *Plugin) candidates(ctx context.Context, c *NetConf, args *skel.CmdArgs) (_ []string, held *PodDevices, fromDRA bool, _ error) {
	ids, held, err := p.candidateIDs(ctx, c, args)
	return ids, held, err == nil && c.deviceID() == "" && c.ResourceName == "", err
}

func (p *Plugin) candidateIDs(ctx context.Context, c *NetConf, args *skel.CmdArgs) ([]string, *PodDevices, error) {
	id := c.deviceID()
	if id != "" && p.Node.DeviceIDCheck == DeviceIDCheckOff {
		return []string{id}, nil, nil
	}
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, nil, invalidEnv("CNI_ARGS: %v", err)
	}
	ns, pod := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	if id != "" {
		return p.checkDeviceID(ctx, c, id, ns, pod)
	}
	if (ns == "" || pod == "") && c.ResourceName == "" {
		return nil, nil, invalidConf("no deviceID: Multus passes the VF the device plugin allocated; without Multus, set resourceName so the plugin asks the kubelet which VF the pod holds")
	}
	if ns == "" || pod == "" {
		return nil, nil, invalidEnv("resourceName needs K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS to find the pod's VF")
	}
	held, err := p.NewPodResources(p.Node.PodResourcesSocket).Pod(ctx, ns, pod)
	if err != nil {
		return nil, nil, fmt.Errorf("ask the kubelet for pod %s/%s's %s: %w", ns, pod, cmp.Or(c.ResourceName, "VFs"), err)
	}
	ids := held.Of(c.ResourceName)
	if len(ids) == 0 && c.ResourceName == "" {
		return nil, nil, invalidConf("no deviceID, and pod %s/%s holds no VF of DRA driver %s: Multus passes the VF the device plugin allocated; without Multus, set resourceName so the plugin asks the kubelet which VF the pod holds", ns, pod, DRADriver)
	}
	if len(ids) == 0 {
		return nil, nil, invalidConf("pod %s/%s holds no %s device: request it in the pod's resources (limits: {%s: 1})", ns, pod, c.ResourceName, c.ResourceName)
	}
	for _, id := range ids {
		if !pci.ValidAddress(id) {
			return nil, nil, invalidConf("kubelet says pod %s/%s holds %s device %q, which is not a PCI address", ns, pod, c.ResourceName, id)
		}
	}
	return ids, &held, nil
}

// checkDeviceID refuses, before anything on the node changes, a deviceID
// that names a VF the pod does not hold: a NetworkAttachmentDefinition is
// a namespace admin's, and without this check it could name another
// pod's VF, or one no pod was given, and have the root-run plugin attach
// and reconfigure it. What the pod holds is the kubelet's word
// (PodResources, one List): the devices of the conf's resourceName (or,
// when it has none of it, its VFs of fastpath's DRA driver, as Of says);
// without a resourceName, every PCI address of any resource and its DRA
// VFs. The node's deviceIDCheck "off" (nodeconf.go) skips it, for a
// runtime without the kubelet.
func (p *Plugin) checkDeviceID(ctx context.Context, c *NetConf, id, ns, pod string) ([]string, *PodDevices, error) {
	if ns == "" || pod == "" {
		return nil, nil, invalidEnv("deviceID %s: CNI_ARGS lack K8S_POD_NAMESPACE and K8S_POD_NAME, which name the pod that must hold the VF; "+
			"for a runtime without the kubelet's PodResources API, set \"deviceIDCheck\": \"off\" in the node's config (%s, or the file $%s names)",
			id, DefaultNodeConfigPath, NodeConfigEnv)
	}
	held, err := p.NewPodResources(p.Node.PodResourcesSocket).Pod(ctx, ns, pod)
	if err != nil {
		return nil, nil, fmt.Errorf("ask the kubelet whether pod %s/%s holds VF %s (deviceID): %w", ns, pod, id, err)
	}
	may, of := held.VFs(), "VFs"
	if c.ResourceName != "" {
		may, of = held.Of(c.ResourceName), c.ResourceName+" devices (or DRA VFs)"
	}
	if !slices.Contains(may, id) {
		holds := "none"
		if len(may) > 0 {
			holds = words.List(may, 8)
		}
		return nil, nil, invalidConf("deviceID %s: pod %s/%s does not hold that VF (its %s: %s): the kubelet gave it to another pod or to none; "+
			"the pod must request it (resources.limits or a resource claim), and the network's deviceID come from Multus", id, ns, pod, of, holds)
	}
	return []string{id}, &held, nil
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
