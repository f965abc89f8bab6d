package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// Add attaches a VF to the pod: claim a VF (lock), gather what the node
// says, plan (plan.go), journal the plan, apply it step by step.
func (p *Plugin) Add(args *skel.CmdArgs) (err error) {
	ctx := context.Background()
	c, err := p.conf(args.StdinData)
	if err != nil {
		return err
	}
	log, closeLog := p.logger(c, args)
	defer closeLog()
	if path := c.RuntimeConfig.CNIDeviceInfoFile; path != "" {
		if err := checkDeviceInfoPath(p.Node.DeviceInfoDir, path); err != nil {
			return err
		}
	}
	if err := ifname.Check(args.IfName); err != nil {
		return invalidEnv("CNI_IFNAME: %v", err)
	}
	if err := refuseHostNetns(args.Netns); err != nil {
		return err
	}
	if c.legacyResult() && c.IPAM.Type == "" {
		return invalidConf("cniVersion %s: its result holds IP addresses only, and this network has no ipam to give one: set cniVersion 0.3.1 or later (the result then names the interface), or add an ipam section", c.CNIVersion)
	}
	cands, held, fromDRA, err := p.candidates(ctx, c, args)
	if err != nil {
		return err
	}
	store, err := NewStore(p.Node.StateDir, log)
	if err != nil {
		return fail(types.ErrIOFailure, "", "open state", err)
	}
	// From here to its return ADD holds its attachment's lock, and gives
	// up if the attachment's DEL ran first (attachlock.go). What it did
	// before changed nothing.
	alock, err := p.lockAttachmentFor(log, "add", store, c.Name, args)
	if err != nil {
		return err
	}
	defer alock.Unlock()
	if err := store.refuseDeleted(log, c.Name, args, time.Now()); err != nil {
		return err
	}
	lock, vf, err := p.claim(ctx, log, c, store, cands, args)
	if err != nil {
		return err
	}
	defer func() {
		if err == nil {
			lock.Unlock(false)
			return
		}
		// A failed ADD that left no state leaves no lock file either.
		_, serr := store.Load(vf)
		lock.Unlock(errors.Is(serr, fs.ErrNotExist))
	}()
	p.point("add:locked")
	log = log.With("vf", vf)

	result, err := p.add(ctx, log, c, args, store, lock, vf)
	if errors.Is(err, errDelArrived) {
		store.settleDelRequest(log, c.Name, args, time.Now())
		log.Warn("ADD undone: its DEL arrived while it ran", "err", err)
		return types.NewError(types.ErrUnknownContainer, fmt.Sprintf(
			"container %s interface %s (network %q): %v; undone, nothing of it is left; "+gaveUp,
			args.ContainerID, args.IfName, c.Name, err), "")
	}
	if err != nil {
		return err
	}
	p.tellDRA(ctx, log, c, args, vf, held, fromDRA, result)
	return result.PrintTo(p.Stdout)
}

// refuseHostNetns refuses a CNI_NETNS that is the plugin's own netns (the
// host's, e.g. /proc/self/ns/net) before anything changes: the VF would be
// renamed and reconfigured on the host.
func refuseHostNetns(path string) error {
	same, err := netns.IsCurrent(path)
	if err != nil {
		return types.NewError(types.ErrInvalidNetNS, fmt.Sprintf("CNI_NETNS: %v", err), "")
	}
	if same {
		return types.NewError(types.ErrInvalidNetNS,
			fmt.Sprintf("CNI_NETNS %s is the plugin's own network namespace (the host's); a VF is only attached to a pod's", path), "")
	}
	return nil
}

// gather reads what planAdd needs: the VF in sysfs, the RDMA netns mode,
// its netdev in the host netns, its settings on the PF. It changes nothing.
func (p *Plugin) gather(c *NetConf, vf string, host *netns.NS, pfl sriov.PFLink) *addFacts {
	f := &addFacts{VF: vf, HostRoot: p.HostRoot, BootID: BootID()}
	f.Device, f.DeviceErr = nic.NewScanner(p.HostRoot).Device(vf)
	if f.DeviceErr != nil || !f.Device.IsVF() {
		return f
	}
	d := &f.Device
	if !d.IsVFIO() && d.RDMADevice != "" {
		f.RDMAMode, f.RDMAModeErr = p.RDMA.NetnsMode()
	}
	if !d.IsVFIO() && d.Netdev != "" {
		if l, err := host.Handle().LinkByName(d.Netdev); err == nil {
			a := *l.Attrs()
			f.HostLink = &a
		} else {
			f.HostLinkErr = err
		}
	}
	if c.vf.Any() && d.PFNetdev != "" {
		orig, err := pfl.VF(d.PFNetdev, d.VFIndex)
		if err == nil {
			f.VFOrig = &orig
		}
		f.VFOrigErr = err
	}
	if c.vf.GUID != nil {
		f.GUID = p.vfGUID(d)
	}
	return f
}

// vfGUID reads the VF's current GUID from its RDMA device's node_guid.
func (p *Plugin) vfGUID(d *nic.Device) string {
	if d.RDMADevice == "" {
		return ""
	}
	b, err := os.ReadFile(filepath.Join(p.HostRoot, "sys/bus/pci/devices", d.PCIAddress, "infiniband", d.RDMADevice, "node_guid"))
	if err != nil {
		return ""
	}
	// node_guid is "0011:2233:4455:6677"; ParseMAC wants octets.
	hex := strings.ReplaceAll(strings.TrimSpace(string(b)), ":", "")
	if len(hex) != 16 {
		return ""
	}
	var parts []string
	for i := 0; i < 16; i += 2 {
		parts = append(parts, hex[i:i+2])
	}
	return strings.Join(parts, ":")
}

// add does the attachment with vf's lock held: plan, journal, apply; on a
// failure, the journal's teardown. The result is in the conf's cniVersion:
// one that version cannot express (0.2.0 without an address) is a failure
// that rolls back too.
func (p *Plugin) add(ctx context.Context, log *slog.Logger, c *NetConf, args *skel.CmdArgs, store *Store, lock *Lock, vf string) (_ types.Result, err error) {
	host, err := netns.Current()
	if err != nil {
		return nil, fail(0, vf, "open host netns", err)
	}
	defer host.Close()
	pfl := p.NewPFLink(host.Handle())
	plan, err := planAdd(c, args, p.gather(c, vf, host, pfl))
	if err != nil {
		return nil, err
	}
	for _, n := range plan.Notes {
		log.Log(ctx, n.level, n.msg, n.args...)
	}
	var pod *netns.NS
	if !plan.State.VFIO {
		if pod, err = netns.Open(args.Netns); err != nil {
			return nil, fail(types.ErrInvalidNetNS, vf, "open pod netns", err)
		}
		defer pod.Close()
	}

	// The journal: from here on, every change is undone from j.st.
	j := &journal{store: store, st: plan.State, point: p.failpoint}
	if err := j.begin(); err != nil {
		return nil, fail(types.ErrIOFailure, vf, "write state", err)
	}
	defer func() {
		if err == nil {
			return
		}
		if terr := errors.Join(p.teardown(ctx, log, store, j.st, host, args, lock)); terr != nil {
			// The state stays: the DEL the runtime sends after a failed
			// ADD tries the restore again.
			log.Error("rollback incomplete; state kept for DEL", "err", terr)
			err = errors.Join(err, fmt.Errorf("rollback: %w", terr))
			return
		}
		if rerr := store.Remove(vf); rerr != nil {
			log.Error("remove state", "err", rerr)
		}
	}()
	res, err := p.apply(ctx, log, c, args, j, plan, host, pod, pfl, lock)
	if err != nil {
		return nil, err
	}
	if store.delRequested(c.Name, args) {
		// Its DEL waits, or waited and gave up: undone (the deferred
		// rollback), rather than left to a DEL that may never come.
		return nil, errDelArrived
	}
	out, err := res.GetAsVersion(c.CNIVersion)
	if err != nil {
		return nil, fail(types.ErrIncompatibleCNIVersion, vf, "result in CNI "+c.CNIVersion, err)
	}
	return out, nil
}

// journalErr is a failure to record a step before it runs.
func journalErr(vf string, err error) error {
	return fail(types.ErrIOFailure, vf, "write state", err)
}

// apply runs the plan's steps, each journaled before it begins.
func (p *Plugin) apply(ctx context.Context, log *slog.Logger, c *NetConf, args *skel.CmdArgs, j *journal, plan *addPlan,
	host, pod *netns.NS, pfl sriov.PFLink, lock *Lock) (*current.Result, error) {
	st, vf, dev := j.st, j.st.PCIAddress, &plan.Device
	for _, s := range plan.Settings {
		if err := j.intend("vf:"+string(s), func(st *State) { st.VFApplied = append(st.VFApplied, s) }); err != nil {
			return nil, journalErr(vf, err)
		}
		if err := sriov.Apply(pfl, st.PFNetdev, st.VFIndex, s, &c.vf, st.VFOrig); err != nil {
			if !errors.Is(err, sriov.ErrPartlyApplied) {
				// The PF refused it: nothing of this setting to restore.
				st.VFApplied = st.VFApplied[:len(st.VFApplied)-1]
			}
			// Else part of it took effect (a GUID's node half): it stays
			// journaled, and the rollback restores it.
			return nil, fail(0, vf, "VF settings on PF "+st.PFNetdev, fmt.Errorf("set %s: %w", confKeys(s, &c.vf), err))
		}
	}
	if len(plan.Settings) > 0 {
		log.Debug("VF settings applied", "pf", st.PFNetdev, "settings", st.VFApplied)
	}

	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if !st.VFIO {
		if err := p.attachLink(log, c, j, host, pod, args); err != nil {
			return nil, err
		}
		res.Interfaces = []*current.Interface{{Name: args.IfName, Mac: st.PodMACOrActual(), Mtu: st.PodMTU, Sandbox: args.Netns, PciID: vf}}
	} else {
		res.Interfaces = []*current.Interface{{Name: args.IfName, Sandbox: args.Netns, PciID: vf}}
	}

	if c.IPAM.Type != "" {
		if err := j.intend("ipam", func(st *State) { st.IPAMAdded = true }); err != nil {
			return nil, journalErr(vf, err)
		}
		if err := p.ipamAdd(ctx, c, args, res, st.VFIO, lock); err != nil {
			return nil, fail(0, vf, "IPAM "+c.IPAM.Type+" ADD", err)
		}
		if !st.VFIO {
			if err := pod.Do(func() error {
				if err := announceOnUp(args.IfName); err != nil {
					log.Warn("no neighbour announcements; peers learn the address on first contact", "err", err)
				}
				return ipam.ConfigureIface(args.IfName, res)
			}); err != nil {
				return nil, fail(0, vf, "configure addresses and routes", err)
			}
		}
	} else if !st.VFIO {
		if err := pod.Do(func() error {
			l, err := netlink.LinkByName(args.IfName)
			if err != nil {
				return err
			}
			return netlink.LinkSetUp(l)
		}); err != nil {
			return nil, fail(0, vf, "set "+args.IfName+" up", err)
		}
	}
	if c.DNS.Nameservers != nil || c.DNS.Domain != "" || c.DNS.Search != nil || c.DNS.Options != nil {
		res.DNS = c.DNS
	}

	if path := c.RuntimeConfig.CNIDeviceInfoFile; path != "" {
		if err := j.intend("devinfo", func(st *State) { st.DeviceInfoFile = path }); err != nil {
			return nil, journalErr(vf, err)
		}
		if err := writeDeviceInfo(p.Node.DeviceInfoDir, path, devinfo.NewPCI(vf, dev.RDMADevice, dev.PFAddress)); err != nil {
			return nil, fail(types.ErrIOFailure, vf, "write device-info file", err)
		}
	}

	var err error
	if st.Result, err = res.MarshalJSON(); err == nil {
		err = j.done()
	}
	if err != nil {
		return nil, fail(types.ErrIOFailure, vf, "write state", err)
	}
	log.Info("attached", "netdev", st.HostName, "rdma", dev.RDMADevice, "rdmaMoved", st.RDMAMoved, "netns", args.Netns)
	return res, nil
}

// confKeys names a setting as the conf asks for it: tx_rate is
// "min_tx_rate 10, max_tx_rate 100" (those the conf gives), so that a
// driver's refusal of one (igb: EINVAL for any min_tx_rate,
// igb_ndo_set_vf_bw) names the key to change.
func confKeys(s sriov.Setting, w *sriov.Settings) string {
	if s != sriov.SettingTxRate {
		return string(s)
	}
	var keys []string
	if w.MinTxRate != nil {
		keys = append(keys, fmt.Sprintf("min_tx_rate %d", *w.MinTxRate))
	}
	if w.MaxTxRate != nil {
		keys = append(keys, fmt.Sprintf("max_tx_rate %d", *w.MaxTxRate))
	}
	if len(keys) == 0 {
		return string(s)
	}
	return strings.Join(keys, ", ")
}

// attachLink moves the VF netdev (and its RDMA device) into the pod. The
// netdev goes in one rtnetlink request that also renames it and sets its
// MTU and the alias teardown finds it by (netns.MoveTo), so a kill leaves it
// on the host as it was or in the pod as the journal says.
func (p *Plugin) attachLink(log *slog.Logger, c *NetConf, j *journal, host, pod *netns.NS, args *skel.CmdArgs) error {
	st := j.st
	if err := j.intend("link", func(st *State) { st.LinkMoved = true }); err != nil {
		return journalErr(st.PCIAddress, err)
	}
	alias := st.HostName
	cfg := netns.LinkConfig{Name: args.IfName, Alias: &alias}
	if c.MTU != nil {
		cfg.MTU = *c.MTU
	}
	if _, err := netns.MoveTo(st.HostName, host, pod, cfg); err != nil {
		return fail(0, st.PCIAddress, "move "+st.HostName+" into the pod as "+args.IfName, err)
	}
	// The MAC in the pod, where a VF driver that refuses it while the PF
	// holds one for the VF can be reset to take the PF's (setNetdevMAC).
	if c.vf.MAC != nil {
		if err := p.setNetdevMAC(st, pod.Handle(), args.IfName, c.vf.MAC); err != nil {
			return fail(0, st.PCIAddress, "set MAC "+c.vf.MAC.String()+" on "+args.IfName, err)
		}
	}
	if st.RDMADevice != "" {
		if err := j.intend("rdma", func(st *State) { st.RDMAMoved = true }); err != nil {
			return journalErr(st.PCIAddress, err)
		}
		if err := p.RDMA.Move(st.RDMADevice, host, pod); err != nil {
			return fail(0, st.PCIAddress, "move RDMA device "+st.RDMADevice+" into the pod", err)
		}
	}
	log.Debug("netdev moved", "from", st.HostName, "to", args.IfName)
	return nil
}
