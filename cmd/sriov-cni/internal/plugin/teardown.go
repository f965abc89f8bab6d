package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// Del detaches: restores the VF and releases its address.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	ctx := context.Background()
	if err := p.ready(); err != nil {
		return err
	}
	c, err := parseConf(args.StdinData)
	if err != nil {
		// ADD refused this conf before changing anything: nothing to undo.
		log, closeLog := p.logger(nil, args)
		defer closeLog()
		log.Warn("DEL with an invalid conf; nothing was attached with it", "err", err)
		return nil
	}
	log, closeLog := p.logger(c, args)
	defer closeLog()
	if err := p.checkNodePaths(c); err != nil {
		// ADD refused this conf, but the runtime's DEL must not fail
		// forever: DEL goes on with the node's paths (every one it uses
		// is the node's), which hold nothing of this conf's if ADD
		// refused it, and the attachment if it did not.
		log.Warn("DEL of a conf that names the node's paths; they are ignored", "err", err)
		if _, ok := relBeneath(p.Node.DeviceInfoDir, c.RuntimeConfig.CNIDeviceInfoFile); !ok {
			c.RuntimeConfig.CNIDeviceInfoFile = ""
		}
	}
	store, err := NewStore(p.Node.StateDir, log)
	if err != nil {
		return fail(types.ErrIOFailure, "", "open state", err)
	}
	// DEL waits for an ADD of its attachment still running, and leaves a
	// tombstone for one yet to start (attachlock.go).
	alock, err := p.lockAttachmentFor(log, "del", store, c.Name, args)
	switch {
	case errors.Is(err, unix.EROFS):
		log.Warn("state dir is read-only: DEL goes on without the attachment's lock", "err", err)
	case err != nil:
		return err
	default:
		// Its ADD, if it waited for one, has returned.
		if err := store.clearDelRequest(c.Name, args); err != nil {
			log.Warn("DEL request left", "err", err)
		}
	}
	defer alock.Unlock()
	// Whatever this DEL finds, it clears what killed calls left on VFs
	// with no attachment (Store.Sweep: their lock files, temporaries,
	// empty pins), once nobody holds them; else only an ADD that takes
	// such a VF again would.
	defer store.Sweep()
	p.tombstoneIfDetached(log, store, c, args)
	vf := c.deviceID()
	if vf == "" {
		st, err := store.Find(c.Name, args.ContainerID, args.IfName)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if uc, _ := store.loadUpstream(log, args); uc != nil {
				// Attached by upstream sriov-cni: its cache names the VF.
				return p.detach(ctx, log, c, store, uc.DeviceID, args)
			}
			// Never attached, or detached already.
			return p.releasePending(ctx, log, c, store, args, nil)
		case err != nil:
			return fail(types.ErrIOFailure, "", "read state", err)
		}
		vf = st.PCIAddress
	}
	return p.detach(ctx, log, c, store, vf, args)
}

// detach tears the attachment of vf down under its lock, if it is the
// attachment (args.ContainerID, args.IfName) of network c.Name. A state it
// cannot trust is set aside and what can be found by PCI address is
// restored: a damaged file never fails DEL forever.
func (p *Plugin) detach(ctx context.Context, log *slog.Logger, c *NetConf, store *Store, vf string, args *skel.CmdArgs) error {
	log = log.With("vf", vf)
	lock, err := store.Lock(vf, LockTimeout)
	switch {
	case errors.Is(err, unix.EROFS):
		// No ADD can write a state meanwhile either.
		log.Warn("state dir is read-only: DEL goes on without the VF's lock", "err", err)
		lock = &Lock{}
	case err != nil:
		return fail(types.ErrTryAgainLater, vf, "lock", err)
	}
	removeLock := false
	defer func() { lock.Unlock(removeLock) }()
	p.point("del:locked")

	st, err := p.loadState(store, vf)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// A concurrent DEL finished it, nothing was attached, or
		// upstream sriov-cni attached it before the swap.
		if ok, err := p.delUpstream(ctx, log, c, store, args, lock, vf); ok {
			removeLock = store.clearLeftovers(vf) == nil
			return err
		}
		removeLock = store.clearLeftovers(vf) == nil
		return p.releasePending(ctx, log, c, store, args, lock)
	case errors.Is(err, ErrBadState):
		to, serr := store.SetAside(vf)
		if serr != nil {
			return fail(types.ErrIOFailure, vf, "set aside a bad state", serr)
		}
		log.Warn("state file could not be trusted (damaged, or not what the kernel says of the VF); set aside, nothing it names is acted on, restoring what can be found by PCI address", "err", err, "to", to)
		host, herr := netns.Current()
		if herr != nil {
			return fail(0, vf, "open host netns", herr)
		}
		defer host.Close()
		rst := p.recoveryState(c, args, vf)
		restoreErr, ipamErr := p.teardown(ctx, log, store, rst, host, args, lock)
		if restoreErr != nil {
			log.Error("restore by PCI address incomplete", "err", restoreErr)
		}
		removeLock = store.clearLeftovers(vf) == nil
		if ipamErr != nil {
			return store.pend(log, pendingOf(rst), ipamErr)
		}
		return nil
	case err != nil:
		return fail(types.ErrIOFailure, vf, "read state", err)
	case !st.is(c.Name, args.ContainerID, args.IfName):
		// The VF serves another attachment: this one is gone. A cache
		// upstream sriov-cni left for it describes a VF since taken.
		if uc, path := store.loadUpstream(log, args); uc != nil && uc.DeviceID == vf {
			log.Warn("upstream sriov-cni's cache of this attachment dropped: the VF now serves another attachment",
				"upstreamCache", path, "attachment", st.owner())
			if err := removeUpstream(path); err != nil {
				log.Warn("upstream cache left", "err", err)
			}
		}
		return p.releasePending(ctx, log, c, store, args, lock)
	}

	host, err := netns.Current()
	if err != nil {
		return fail(0, vf, "open host netns", err)
	}
	defer host.Close()
	relErr := p.release(ctx, log, store, st, true, host, args, lock)
	if relErr != nil && !errors.Is(relErr, ErrIPAMPending) {
		return relErr
	}
	// The VF is free (its address may be pending).
	p.point("del:removed")
	if err := store.clearLeftovers(vf); err != nil {
		log.Warn("leftovers kept", "err", err)
	} else {
		removeLock = true
	}
	log.Info("detached", "netdev", st.HostName)
	return relErr
}

// release undoes the attachment st (teardown) and removes its state,
// which frees the VF; with releaseIPAM false its address is left alone.
//
// A failure to restore the VF (netdev, RDMA device, PF settings) is
// counted in the state, which stays for the next try, until
// maxDelAttempts: then the state goes anyway, with an error in the log,
// rather than holding the VF and the runtime's retries forever. A failed
// IPAM DEL does not count and never holds the VF: once the VF is restored
// (or given up on), the address still to be released is recorded apart
// (Pending), the state goes, and the error (ErrIPAMPending) is returned,
// so that the runtime's next DEL, or GC, releases it. An address left
// alone is recorded too, for its own runtime's DEL or GC.
func (p *Plugin) release(ctx context.Context, log *slog.Logger, store *Store, st *State, releaseIPAM bool, host *netns.NS, args *skel.CmdArgs, lock *Lock) error {
	undo := st
	if !releaseIPAM && st.IPAMAdded {
		cp := *st
		cp.IPAMAdded = false
		undo = &cp
	}
	restoreErr, ipamErr := p.teardown(ctx, log, store, undo, host, args, lock)
	if releaseIPAM && ipamErr == nil {
		// Released: a DEL that tries the restore again does not repeat it.
		st.IPAMAdded = false
	}
	if restoreErr != nil {
		st.DelAttempts++
		if st.DelAttempts < maxDelAttempts {
			if err := store.Save(st); err != nil {
				log.Error("save state", "err", err)
			}
			return errors.Join(restoreErr, ipamErr)
		}
		log.Error("giving up on restoring the VF after repeated failures; state dropped", "attempts", st.DelAttempts, "err", restoreErr)
	}
	var pendErr error
	switch {
	case ipamErr != nil:
		if pendErr = store.pend(log, pendingOf(st), ipamErr); !errors.Is(pendErr, ErrIPAMPending) {
			// The state keeps the address, and the VF, for the next DEL.
			if err := store.Save(st); err != nil {
				log.Error("save state", "err", err)
			}
			return pendErr
		}
	case st.IPAMAdded && !releaseIPAM:
		if err := store.SavePending(pendingOf(st)); err != nil {
			log.Warn("address left to its own runtime's DEL or GC not recorded; that DEL only tries to release it", "err", err)
		}
	}
	if err := store.Remove(st.PCIAddress); err != nil {
		return errors.Join(pendErr, fail(types.ErrIOFailure, st.PCIAddress, "remove state", err))
	}
	return pendErr
}

// recoveryState is what can be known of an attachment whose state file was
// set aside: the attachment from DEL's arguments and conf, the VF from
// sysfs, the netdev's host name from sysfs or from the alias ADD set on it
// in the pod. The VF's settings on the PF and the netdev's MAC and MTU
// before ADD are lost with the file; they are left as they are.
func (p *Plugin) recoveryState(c *NetConf, args *skel.CmdArgs, vf string) *State {
	st := &State{Version: StateVersion, Phase: PhaseAdding, Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName,
		Netns: args.Netns, PCIAddress: vf, IPAMType: c.IPAM.Type, IPAMAdded: c.IPAM.Type != "",
		DeviceInfoFile: c.RuntimeConfig.CNIDeviceInfoFile}
	d, err := nic.NewScanner(p.HostRoot).Device(vf)
	if err != nil {
		return st
	}
	st.PFAddress, st.PFNetdev, st.VFIndex, st.LinkType, st.VFIO = d.PFAddress, d.PFNetdev, d.VFIndex, d.LinkType, d.IsVFIO()
	if st.VFIO {
		return st
	}
	st.LinkMoved, st.HostName = true, d.Netdev
	if st.HostName == "" && args.Netns != "" {
		if pod := podNetns(slog.New(slog.DiscardHandler), args.Netns); pod != nil {
			if l, err := pod.Handle().LinkByName(args.IfName); err == nil {
				st.HostName = l.Attrs().Alias
			}
			pod.Close()
		}
	}
	if mode, err := p.RDMA.NetnsMode(); err == nil && mode == RDMAModeExclusive && d.RDMADevice != "" {
		st.RDMADevice, st.RDMAMoved = d.RDMADevice, true
	}
	return st
}

// teardown undoes what st says ADD did or began, newest first, but for the
// VF's settings on the PF, which come back before its netdev (see below).
// Each undo
// tolerates a step that never happened, happened half-way or was undone
// already, so teardown may run again after a crash of its own. It returns
// what failed to restore the VF (its netdev, RDMA device, PF settings, the
// device-info file) apart from a failed IPAM DEL, which holds no VF.
func (p *Plugin) teardown(ctx context.Context, log *slog.Logger, store *Store, st *State, host *netns.NS, args *skel.CmdArgs, lock *Lock) (restoreErr, ipamErr error) {
	var errs []error
	// Nothing the state names acts until the kernel confirms it
	// (evidence.go); its callers set aside one that fails, so this
	// catches a translated upstream cache and any caller that did not.
	trusted := true
	if err := p.checkState(st); err != nil {
		trusted = false
		log.Warn("state not confirmed by the kernel: the VF's settings on the PF and its RDMA device are left alone, only the VF's own netdev is restored", "err", err)
	}
	p.point("teardown:ipam")
	if st.IPAMAdded && st.IPAMType != "" {
		ipamErr = p.ipamDel(ctx, args, st.IPAMType, lock)
	}
	p.point("teardown:devinfo")
	if st.DeviceInfoFile != "" {
		if err := removeDeviceInfo(log, p.Node.DeviceInfoDir, st.DeviceInfoFile, st.PCIAddress); err != nil {
			errs = append(errs, err)
		}
	}
	// The VF's settings on the PF come back before its netdev does: a VF
	// driver may refuse a change of its netdev's MAC while the PF holds an
	// administrative MAC for it (igbvf: EADDRNOTAVAIL, igb_rcv_msg_from_vf
	// / igb_set_vf_mac_addr in drivers/net/ethernet/intel/igb/igb_main.c),
	// and the netdev's MAC is put back below. Restoring the PF's MAC
	// (usually to zero, which clears igb's IGB_VF_FLAG_PF_SET_MAC) first
	// lets that change through on igb, and changes nothing on mlx5,
	// which takes a VF-side MAC either way.
	p.point("teardown:vf")
	switch {
	case len(st.VFApplied) == 0 || st.VFOrig == nil:
	case !trusted:
		errs = append(errs, fmt.Errorf("VF settings on PF %s VF %d not restored: the kernel does not confirm them as the VF's", st.PFNetdev, st.VFIndex))
	case st.PFNetdev == "":
		// Only a translated upstream cache (upstreamState) gets here.
		errs = append(errs, errors.New("VF settings: PF netdev unknown (not in sysfs, and the cache names no Master and VFID)"))
	default:
		if err := sriov.RestoreAll(p.NewPFLink(host.Handle()), st.PFNetdev, st.VFIndex, st.VFApplied, st.VFOrig); err != nil {
			errs = append(errs, fmt.Errorf("VF settings on PF %s: %w", st.PFNetdev, err))
		}
	}
	if !st.VFIO {
		pod := podNetns(log, st.Netns)
		if pod != nil {
			defer pod.Close()
		} else if st.Netns != "" && st.LinkMoved {
			log.Info("pod netns gone; the kernel returned the VF to the host netns", "netns", st.Netns)
		}
		p.point("teardown:rdma")
		if st.RDMAMoved && st.RDMADevice != "" && pod != nil && trusted {
			present, err := p.RDMA.Present(st.RDMADevice, pod)
			if err == nil && present {
				err = p.RDMA.Move(st.RDMADevice, pod, host)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("return RDMA device %s to the host: %w", st.RDMADevice, err))
			}
		}
		p.point("teardown:link")
		if _, err := os.Lstat(store.netnsPath(st.PCIAddress)); st.LinkMoved || err == nil {
			if err := p.restoreLink(log, store, st, host, pod); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(errs) > 0 {
		restoreErr = fail(0, st.PCIAddress, "restore", errors.Join(errs...))
	}
	return restoreErr, ipamErr
}
