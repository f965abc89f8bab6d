package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ip"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

// Check verifies that the attachment is as ADD left it: the interface,
// its MAC and MTU, its addresses and routes, and where the RDMA device is.
func (p *Plugin) Check(args *skel.CmdArgs) error {
	ctx := context.Background()
	c, err := p.conf(args.StdinData)
	if err != nil {
		return err
	}
	log, closeLog := p.logger(c, args)
	defer closeLog()
	if c.PrevResult == nil {
		return invalidConf("CHECK needs prevResult")
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return invalidConf("prevResult: %v", err)
	}
	store, err := NewStore(p.Node.StateDir, log)
	if err != nil {
		return fail(types.ErrIOFailure, "", "open state", err)
	}
	st, err := p.findAttachment(store, c, args)
	if err != nil {
		return fail(types.ErrIOFailure, "", "read state", err)
	}
	if st == nil {
		return types.NewError(types.ErrUnknownContainer,
			fmt.Sprintf("no attachment of container %s interface %s on network %q", args.ContainerID, args.IfName, c.Name), "")
	}
	if st.Phase != PhaseAdded {
		return fail(0, st.PCIAddress, "check", fmt.Errorf("attachment is in phase %q, not %q", st.Phase, PhaseAdded))
	}
	vf := st.PCIAddress
	if c.IPAM.Type != "" {
		if _, err := p.ipamCall(ctx, "CHECK", args, c.IPAM.Type, nil); err != nil {
			return fail(0, vf, "IPAM "+c.IPAM.Type+" CHECK", err)
		}
	}
	if st.VFIO {
		return nil
	}
	pod, err := netns.Open(args.Netns)
	if err != nil {
		return fail(types.ErrInvalidNetNS, vf, "open pod netns", err)
	}
	defer pod.Close()
	l, err := pod.Handle().LinkByName(args.IfName)
	if err != nil {
		return fail(0, vf, "check", fmt.Errorf("%s not in the pod netns: %w", args.IfName, err))
	}
	a := l.Attrs()
	var wrong []error
	if a.Alias != st.HostName {
		wrong = append(wrong, fmt.Errorf("%s is not the VF's netdev %s (alias %q)", args.IfName, st.HostName, a.Alias))
	}
	if want := st.PodMACOrActual(); a.HardwareAddr.String() != want {
		wrong = append(wrong, fmt.Errorf("MAC is %s, want %s", a.HardwareAddr, want))
	}
	if st.PodMTU != 0 && a.MTU != st.PodMTU {
		wrong = append(wrong, fmt.Errorf("MTU is %d, want %d", a.MTU, st.PodMTU))
	}
	for _, iface := range prev.Interfaces {
		if iface.Name == args.IfName && iface.Mac != "" && iface.Mac != a.HardwareAddr.String() {
			wrong = append(wrong, fmt.Errorf("MAC is %s, prevResult says %s", a.HardwareAddr, iface.Mac))
		}
	}
	if err := pod.Do(func() error {
		if err := ip.ValidateExpectedInterfaceIPs(args.IfName, prev.IPs); err != nil {
			return err
		}
		return ip.ValidateExpectedRoute(prev.Routes)
	}); err != nil {
		wrong = append(wrong, err)
	}
	if st.RDMAMoved {
		in, err := p.RDMA.Present(st.RDMADevice, pod)
		switch {
		case err != nil:
			wrong = append(wrong, fmt.Errorf("RDMA device %s: %w", st.RDMADevice, err))
		case !in:
			wrong = append(wrong, fmt.Errorf("RDMA device %s is not in the pod netns", st.RDMADevice))
		}
	}
	if len(wrong) > 0 {
		return fail(0, vf, "check", errors.Join(wrong...))
	}
	log.Debug("check passed", "vf", vf)
	return nil
}

// Status reports whether the plugin can serve ADDs: its state directory is
// writable, the IPAM plugin says it is ready, and, with rdmaIsolation, the
// RDMA subsystem is in exclusive mode.
func (p *Plugin) Status(args *skel.CmdArgs) error {
	ctx := context.Background()
	c, err := p.conf(args.StdinData)
	if err != nil {
		return err
	}
	unavailable := func(format string, a ...any) error {
		return types.NewError(types.ErrPluginNotAvailable, fmt.Sprintf(format, a...), "")
	}
	store, err := NewStore(p.Node.StateDir, nil)
	if err != nil {
		return unavailable("state dir: %v", err)
	}
	// access(2), not a probe file: nothing for a kill to leave behind.
	if err := unix.Access(store.dir, unix.W_OK); err != nil {
		return unavailable("state dir %s is not writable: %v", store.dir, err)
	}
	if c.RDMAIsolation {
		mode, err := p.RDMA.NetnsMode()
		if err != nil {
			return unavailable("rdmaIsolation: %v", err)
		}
		if mode != RDMAModeExclusive {
			return unavailable("rdmaIsolation: RDMA netns mode is %q; run `rdma system set netns exclusive`", mode)
		}
	}
	if c.IPAM.Type != "" {
		if _, err := p.ipamCall(ctx, "STATUS", &skel.CmdArgs{Path: args.Path, StdinData: args.StdinData}, c.IPAM.Type, nil); err != nil {
			// The IPAM plugin's own code, when it gave one, wins.
			return fail(types.ErrPluginNotAvailable, "", "IPAM "+c.IPAM.Type+" STATUS", err)
		}
	}
	return nil
}

// GC tears down every attachment of this network that is not in
// cni.dev/valid-attachments — state, lock, VF and address — and those
// upstream sriov-cni's caches describe (gcUpstream), tries again the
// pending address releases of those not in it, then lets the IPAM plugin
// collect its own leftovers.
func (p *Plugin) GC(args *skel.CmdArgs) error {
	ctx := context.Background()
	c, err := p.conf(args.StdinData)
	if err != nil {
		return err
	}
	log, closeLog := p.logger(c, nil)
	defer closeLog()
	store, err := NewStore(p.Node.StateDir, log)
	if err != nil {
		return fail(types.ErrIOFailure, "", "open state", err)
	}
	valid := map[types.GCAttachment]bool{}
	for _, a := range c.ValidAttachments {
		valid[a] = true
	}
	vfs, err := store.List()
	if err != nil {
		return fail(types.ErrIOFailure, "", "list state", err)
	}
	var errs []error
	for _, vf := range vfs {
		st, err := p.loadState(store, vf)
		if err != nil {
			log.Warn("unreadable state, or one the kernel does not confirm, skipped", "vf", vf, "err", err)
			continue
		}
		if st.Network != c.Name || valid[types.GCAttachment{ContainerID: st.ContainerID, IfName: st.IfName}] {
			continue
		}
		// Release it as a DEL of that attachment would.
		a := &skel.CmdArgs{ContainerID: st.ContainerID, Netns: st.Netns, IfName: st.IfName, Path: args.Path, StdinData: args.StdinData}
		al, err := store.lockAttachment(st.Network, a, 0, nil)
		if err != nil && !errors.Is(err, unix.EROFS) {
			log.Debug("attachment busy: left to its ADD or DEL", "vf", vf, "err", err)
			continue
		}
		err = p.detach(ctx, log, c, store, vf, a)
		al.Unlock()
		if err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("collected stale attachment", "vf", vf, "container", shortID(st.ContainerID), "ifname", st.IfName)
	}
	// Upstream sriov-cni's attachments of pods lost without a DEL.
	if err := p.gcUpstream(ctx, log, c, store, args, valid); err != nil {
		errs = append(errs, err)
	}
	// Tombstones of attachments the runtime no longer knows (attachlock.go).
	store.gcTombstones(c.Name, valid)
	// Addresses whose release failed once their VF was freed.
	pending, err := store.ListPending()
	if err != nil {
		errs = append(errs, fmt.Errorf("list pending address releases: %w", err))
	}
	for _, pr := range pending {
		if pr.Network != c.Name || valid[types.GCAttachment{ContainerID: pr.ContainerID, IfName: pr.IfName}] {
			continue
		}
		if err := p.releasePending(ctx, log, c, store, pr.args(args), nil); err != nil {
			errs = append(errs, err)
		}
	}
	if c.IPAM.Type != "" {
		if _, err := p.ipamCall(ctx, "GC", &skel.CmdArgs{Path: args.Path, StdinData: args.StdinData}, c.IPAM.Type, nil); err != nil {
			errs = append(errs, fmt.Errorf("IPAM %s GC: %w", c.IPAM.Type, err))
		}
	}
	if len(errs) > 0 {
		return fail(0, "", "GC", errors.Join(errs...))
	}
	return nil
}

// findAttachment returns the state of the attachment args names on
// network c.Name, or nil if there is none.
func (p *Plugin) findAttachment(store *Store, c *NetConf, args *skel.CmdArgs) (*State, error) {
	if id := c.deviceID(); id != "" {
		st, err := p.loadState(store, id)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, nil
		case err != nil:
			return nil, err
		case st.is(c.Name, args.ContainerID, args.IfName):
			return st, nil
		}
		return nil, nil
	}
	st, err := store.Find(c.Name, args.ContainerID, args.IfName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err == nil {
		if cerr := p.checkState(st); cerr != nil {
			return nil, fmt.Errorf("state %s: %w", store.path(st.PCIAddress), cerr)
		}
	}
	return st, err
}
