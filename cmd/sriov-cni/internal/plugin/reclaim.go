package plugin

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"os"

	"github.com/containernetworking/cni/pkg/skel"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// reclaim frees a VF held by an attachment whose pod is gone without a DEL
// (judgeOwner): a runtime that lost the pod never sends that DEL, and the
// VF would be lost until the node reboots. With the VF's lock held (the
// caller's), it tears the attachment down as its own DEL would: the
// journal's teardown (netdev, VF settings on the PF, RDMA device, the
// device-info file it wrote), its address when it is of this ADD's network
// and IPAM, and its state. It returns whether the VF is free now and, when
// it is not and the runtime's message should say why, the reason.
func (p *Plugin) reclaim(ctx context.Context, log *slog.Logger, c *NetConf, args *skel.CmdArgs, store *Store, lock *Lock, st *State, boot string) (bool, string) {
	log = log.With("vf", st.PCIAddress, "attachment", st.owner())
	verdict, why := judgeOwner(st, boot, p.readOwner(log, store, st))
	switch verdict {
	case ownerAlive:
		log.Debug("VF held", "why", why)
		return false, ""
	case ownerHeld:
		log.Warn("VF held by a netns that has no path any more", "why", why)
		return false, why
	}
	host, err := netns.Current()
	if err != nil {
		log.Error("open host netns", "err", err)
		return false, ""
	}
	defer host.Close()
	log.Warn("pod gone without a DEL: reclaiming its VF as its DEL would", "why", why)
	releaseIPAM := st.IPAMAdded && st.Network == c.Name && st.IPAMType == c.IPAM.Type
	if st.IPAMAdded && !releaseIPAM {
		log.Warn("its address is left for its own runtime's DEL or GC: it is another network's or another IPAM's",
			"network", st.Network, "ipam", st.IPAMType)
	}
	// The IPAM DEL of that attachment: its container and interface, this
	// ADD's conf (the same network and IPAM), no CNI_ARGS (they were its
	// pod's, and are not kept), as GC does.
	owner := &skel.CmdArgs{ContainerID: st.ContainerID, Netns: st.Netns, IfName: st.IfName, Path: args.Path, StdinData: args.StdinData}
	if err := p.release(ctx, log, store, st, releaseIPAM, host, owner, lock); errors.Is(err, ErrIPAMPending) {
		// The VF is restored; its address waits for its DEL or GC.
		log.Warn("VF reclaimed; its address is not released yet", "err", err)
		return true, ""
	} else if err != nil {
		log.Error("reclaim incomplete; the next ADD or its DEL tries again", "err", err)
		return false, why + ", but restoring the VF failed: " + err.Error()
	}
	log.Info("VF reclaimed from a pod gone without a DEL")
	return true, ""
}

// readOwner reads what judgeOwner needs about st's attachment: whether its
// netns path is there and, only when it is gone, where the VF's netdev is
// outside every pod (teardown's search, without the pod: the pinned
// temporary netns, then the host netns under a name sysfs lists, under the
// alias ADD set, or under its own name).
func (p *Plugin) readOwner(log *slog.Logger, store *Store, st *State) ownerFacts {
	var f ownerFacts
	if st.VFIO || st.Netns == "" {
		return f
	}
	if _, f.NetnsErr = os.Lstat(st.Netns); !errors.Is(f.NetnsErr, fs.ErrNotExist) {
		return f
	}
	host, err := netns.Current()
	if err != nil {
		// Where the netdev is cannot be told: it stays held.
		log.Warn("open host netns", "err", err)
		return f
	}
	defer host.Close()
	via := openPin(log, store.netnsPath(st.PCIAddress))
	if via != nil {
		defer via.Close()
	}
	if where, name := p.findNetdev(st, host, nil, via); where != nil {
		f.Netdev, f.InTemp = name, where == via
	}
	return f
}
