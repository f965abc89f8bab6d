// Package plugin is the sriov CNI plugin: it gives a pod a ConnectX SR-IOV
// VF — the netdev and its RDMA device — and on DEL puts everything back.
//
// Every ADD is journaled: the VF's original state is written to a state file
// before anything on the node changes, and the one teardown that undoes an
// attachment serves ADD's rollback, DEL and GC alike. DEL therefore works
// when the pod's netns is gone, when ADD died half-way, and twice.
package plugin

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/plugins/pkg/ipam"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// HostRootEnv names the directory that stands for / when reading sysfs
// (tests and the fixture host set it; runtimes pass their environment on).
const HostRootEnv = "FASTPATH_HOST_ROOT"

// maxDelAttempts is how many DELs may fail to restore a VF before DEL gives
// up, drops the state and reports success: a runtime retries a failing DEL
// forever, and what failed three times will not heal by itself.
const maxDelAttempts = 3

// Plugin holds the plugin's dependencies; main wires the real ones, tests
// inject fakes for what this machine's kernel cannot do.
type Plugin struct {
	// HostRoot is where sysfs is read ("/" in production).
	HostRoot string
	// NewPF returns the PF calls over a netlink handle in the host netns.
	NewPF func(h *netlink.Handle) PF
	// RDMA moves RDMA devices between namespaces.
	RDMA RDMA
	// NewPodResources returns a client of the kubelet's PodResources API.
	NewPodResources func(socket string) PodResources
	// Stdout receives the result (the CNI protocol); Stderr the log.
	Stdout, Stderr io.Writer
}

// New returns the plugin with the real kernel and kubelet behind it.
func New() *Plugin {
	root := os.Getenv(HostRootEnv)
	if root == "" {
		root = "/"
	}
	return &Plugin{
		HostRoot: root, NewPF: NewNetlinkPF, RDMA: NewNetlinkRDMA(), NewPodResources: NewKubeletPodResources,
		Stdout: os.Stdout, Stderr: os.Stderr,
	}
}

// Funcs are the plugin's commands for skel.
func (p *Plugin) Funcs() skel.CNIFuncs {
	wrap := func(f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			if err := f(a); err != nil {
				return CNIError(err)
			}
			return nil
		}
	}
	return skel.CNIFuncs{Add: wrap(p.Add), Del: wrap(p.Del), Check: wrap(p.Check), Status: wrap(p.Status), GC: wrap(p.GC)}
}

// logger logs to Stderr (or the conf's logFile) at the conf's level.
func (p *Plugin) logger(c *NetConf, args *skel.CmdArgs) (*slog.Logger, func()) {
	var level slog.Level
	if c != nil && c.LogLevel != "" {
		_ = level.UnmarshalText([]byte(strings.Replace(strings.ToLower(c.LogLevel), "warning", "warn", 1)))
	}
	w, closeFn := p.Stderr, func() {}
	if c != nil && c.LogFile != "" {
		if f, err := os.OpenFile(c.LogFile, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600); err == nil {
			w, closeFn = f, func() { f.Close() }
		}
	}
	if w == nil {
		w = io.Discard
	}
	log := slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level})).With("plugin", "sriov")
	if args != nil {
		log = log.With("container", shortID(args.ContainerID), "ifname", args.IfName)
	}
	return log, closeFn
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// k8sArgs are the CNI_ARGS a Kubernetes runtime passes.
type k8sArgs struct {
	types.CommonArgs
	K8S_POD_NAMESPACE          types.UnmarshallableString
	K8S_POD_NAME               types.UnmarshallableString
	K8S_POD_INFRA_CONTAINER_ID types.UnmarshallableString
	K8S_POD_UID                types.UnmarshallableString
}

// candidates are the VFs this attachment may use: the one the conf names,
// or those of resourceName that the kubelet gave the pod.
func (p *Plugin) candidates(ctx context.Context, c *NetConf, args *skel.CmdArgs) ([]string, error) {
	if id := c.deviceID(); id != "" {
		return []string{id}, nil
	}
	if c.ResourceName == "" {
		return nil, invalidConf("no deviceID: Multus passes the VF the device plugin allocated; without Multus, set resourceName so the plugin asks the kubelet which VF the pod holds")
	}
	var ka k8sArgs
	if err := types.LoadArgs(args.Args, &ka); err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_ARGS: %v", err), "")
	}
	ns, pod := string(ka.K8S_POD_NAMESPACE), string(ka.K8S_POD_NAME)
	if ns == "" || pod == "" {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables,
			"resourceName needs K8S_POD_NAMESPACE and K8S_POD_NAME in CNI_ARGS to find the pod's VF", "")
	}
	ids, err := p.NewPodResources(c.PodResourcesSocket).Devices(ctx, ns, pod, c.ResourceName)
	if err != nil {
		return nil, fmt.Errorf("ask the kubelet for pod %s/%s's %s: %w", ns, pod, c.ResourceName, err)
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

// ipamCall runs the conf's IPAM plugin for one attachment, with the
// attachment's own arguments (not the process environment, so that GC can
// release other attachments).
func ipamCall(ctx context.Context, cmd string, args *skel.CmdArgs, ipamType string, stdin []byte) (types.Result, error) {
	paths := filepath.SplitList(args.Path)
	plugin, err := invoke.FindInPath(ipamType, paths)
	if err != nil {
		return nil, fmt.Errorf("IPAM plugin %q: %w", ipamType, err)
	}
	a := &invoke.Args{Command: cmd, ContainerID: args.ContainerID, NetNS: args.Netns, IfName: args.IfName,
		PluginArgsStr: args.Args, Path: args.Path}
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}}
	if cmd == "ADD" {
		return invoke.ExecPluginWithResult(ctx, plugin, stdin, a, exec)
	}
	return nil, invoke.ExecPluginWithoutResult(ctx, plugin, stdin, a, exec)
}

// Add attaches a VF to the pod.
func (p *Plugin) Add(args *skel.CmdArgs) (err error) {
	ctx := context.Background()
	c, err := parseConf(args.StdinData)
	if err != nil {
		return err
	}
	log, closeLog := p.logger(c, args)
	defer closeLog()
	if err := ifname.Check(args.IfName); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_IFNAME: %v", err), "")
	}
	cands, err := p.candidates(ctx, c, args)
	if err != nil {
		return err
	}
	store, err := NewStore(c.StateDir)
	if err != nil {
		return fail(types.ErrIOFailure, "", "open state", err)
	}

	// Take the first candidate that is not attached elsewhere.
	var (
		lock *Lock
		vf   string
		busy []string
		boot = BootID()
	)
	for _, id := range cands {
		l, err := store.Lock(id, LockTimeout)
		if err != nil {
			return fail(types.ErrTryAgainLater, id, "lock", err)
		}
		st, lerr := store.Load(id)
		if lerr == nil && st.stale(boot) {
			// The reboot reset the VF and took the pod's netns along.
			log.Info("state from before the last boot dropped", "vf", id, "attachment", st.owner())
			if err := store.Remove(id); err != nil {
				l.Unlock(false)
				return fail(types.ErrIOFailure, id, "drop stale state", err)
			}
			st, lerr = nil, fs.ErrNotExist
		}
		switch {
		case errors.Is(lerr, fs.ErrNotExist):
			lock, vf = l, id
		case lerr != nil:
			l.Unlock(false)
			return fail(types.ErrIOFailure, id, "read state", lerr)
		case st.ContainerID == args.ContainerID && st.IfName == args.IfName && st.Network == c.Name:
			l.Unlock(false)
			return fail(types.ErrInternal, id, "add", fmt.Errorf("already attached as %s; DEL it first", st.owner()))
		default:
			l.Unlock(false)
			busy = append(busy, fmt.Sprintf("%s (%s)", id, st.owner()))
			continue
		}
		break
	}
	if lock == nil {
		return fail(types.ErrTryAgainLater, strings.Join(cands, ","), "add", fmt.Errorf("%w: attached to %s", ErrBusy, strings.Join(busy, ", ")))
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
	log = log.With("vf", vf)

	result, err := p.add(ctx, log, c, args, store, vf)
	if err != nil {
		return err
	}
	out, err := result.GetAsVersion(c.CNIVersion)
	if err != nil {
		return fail(types.ErrIncompatibleCNIVersion, vf, "convert result", err)
	}
	return out.PrintTo(p.Stdout)
}

// add does the attachment with vf's lock held.
func (p *Plugin) add(ctx context.Context, log *slog.Logger, c *NetConf, args *skel.CmdArgs, store *Store, vf string) (_ *current.Result, err error) {
	dev, err := nic.NewScanner(p.HostRoot).Device(vf)
	if err != nil {
		if errors.Is(err, pci.ErrNotFound) {
			return nil, fail(types.ErrInvalidNetworkConfig, vf, "read sysfs", fmt.Errorf("%w under %s", err, filepath.Join(p.HostRoot, "sys/bus/pci/devices")))
		}
		return nil, fail(0, vf, "read sysfs", err)
	}
	if !dev.IsVF() {
		return nil, fail(types.ErrInvalidNetworkConfig, vf, "check device", errors.New("is a PF, not a VF: give a VF's PCI address (the device plugin's mlnx_sriov_rdma pools hand out VFs)"))
	}
	if err := checkDevice(c, &dev); err != nil {
		return nil, fail(types.ErrInvalidNetworkConfig, vf, "check conf against the device", err)
	}
	if c.vf.any() && dev.PFNetdev == "" {
		return nil, fail(types.ErrInvalidNetworkConfig, vf, "check device", fmt.Errorf("VF settings need the PF's netdev, and PF %s has none", dev.PFAddress))
	}
	moveRDMA, err := p.rdmaPlan(log, c, &dev)
	if err != nil {
		return nil, fail(0, vf, "RDMA", err)
	}

	host, err := netns.Current()
	if err != nil {
		return nil, fail(0, vf, "open host netns", err)
	}
	defer host.Close()
	var pod *netns.NS
	if !dev.IsVFIO() {
		if pod, err = netns.Open(args.Netns); err != nil {
			return nil, fail(types.ErrInvalidNetNS, vf, "open pod netns", err)
		}
		defer pod.Close()
	}

	st := &State{
		Phase: PhaseAdding, BootID: BootID(), Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
		PCIAddress: vf, PFAddress: dev.PFAddress, PFNetdev: dev.PFNetdev, VFIndex: dev.VFIndex,
		LinkType: dev.LinkType, VFIO: dev.IsVFIO(), IPAMType: c.IPAM.Type,
		DeviceInfoFile: c.RuntimeConfig.CNIDeviceInfoFile,
	}
	if !dev.IsVFIO() {
		if dev.Netdev == "" {
			return nil, fail(0, vf, "find netdev", fmt.Errorf("no netdev under %s: is the VF attached to another pod, or its driver not bound?", filepath.Join(p.HostRoot, "sys/bus/pci/devices", vf, "net")))
		}
		l, err := host.Handle().LinkByName(dev.Netdev)
		if err != nil {
			return nil, fail(0, vf, "find netdev", fmt.Errorf("%s is not in the host netns (attached to another pod?): %w", dev.Netdev, err))
		}
		a := l.Attrs()
		st.HostName, st.HostMAC, st.HostMTU, st.HostAlias = a.Name, a.HardwareAddr.String(), a.MTU, a.Alias
		st.HostUp = a.Flags&net.FlagUp != 0
		st.PodMTU = a.MTU
		if c.MTU != nil {
			st.PodMTU = *c.MTU
		}
		if c.vf.MAC != nil {
			st.PodMAC = c.vf.MAC.String()
		}
		if moveRDMA {
			st.RDMADevice = dev.RDMADevice
		}
	}
	pf := p.NewPF(host.Handle())
	var steps []vfStep
	if c.vf.any() {
		orig, err := pf.VF(dev.PFNetdev, dev.VFIndex)
		if err != nil {
			return nil, fail(0, vf, "read VF settings on PF "+dev.PFNetdev, err)
		}
		if c.vf.GUID != nil {
			orig.GUID = p.vfGUID(&dev)
		}
		st.VFOrig = &orig
		steps = vfSteps(pf, dev.PFNetdev, dev.VFIndex, &c.vf, &orig)
		for _, s := range steps {
			st.VFApplied = append(st.VFApplied, s.name)
		}
	}
	// The journal: from here on, every change is undone from st.
	if err := store.Save(st); err != nil {
		return nil, fail(types.ErrIOFailure, vf, "write state", err)
	}
	ipamDone := false
	defer func() {
		if err == nil {
			return
		}
		if terr := p.teardown(ctx, log, st, host, args, ipamDone); terr != nil {
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

	if len(steps) > 0 {
		if _, err = applyVF(pf, dev.PFNetdev, dev.VFIndex, steps, st.VFOrig); err != nil {
			st.VFApplied = nil // applyVF restored what it had done
			return nil, fail(0, vf, "VF settings on PF "+dev.PFNetdev, err)
		}
		log.Debug("VF settings applied", "pf", dev.PFNetdev, "settings", st.VFApplied)
	}

	res := &current.Result{CNIVersion: current.ImplementedSpecVersion}
	if !dev.IsVFIO() {
		if err = p.attachLink(log, c, st, host, pod, args); err != nil {
			return nil, err
		}
		res.Interfaces = []*current.Interface{{Name: args.IfName, Mac: st.PodMACOrActual(), Mtu: st.PodMTU, Sandbox: args.Netns, PciID: vf}}
	} else {
		res.Interfaces = []*current.Interface{{Name: args.IfName, Sandbox: args.Netns, PciID: vf}}
	}

	if c.IPAM.Type != "" {
		var r types.Result
		r, err = ipamCall(ctx, "ADD", args, c.IPAM.Type, args.StdinData)
		if err != nil {
			return nil, fail(0, vf, "IPAM "+c.IPAM.Type+" ADD", err)
		}
		ipamDone = true
		var ipRes *current.Result
		if ipRes, err = current.NewResultFromResult(r); err != nil {
			return nil, fail(0, vf, "IPAM "+c.IPAM.Type+" result", err)
		}
		if len(ipRes.IPs) == 0 && !dev.IsVFIO() {
			return nil, fail(0, vf, "IPAM "+c.IPAM.Type, errors.New("returned no IP address"))
		}
		for _, ipc := range ipRes.IPs {
			ipc.Interface = current.Int(0)
		}
		res.IPs, res.Routes, res.DNS = ipRes.IPs, ipRes.Routes, ipRes.DNS
		if !dev.IsVFIO() {
			if err = pod.Do(func() error {
				if err := announceOnUp(args.IfName); err != nil {
					log.Warn("no neighbour announcements; peers learn the address on first contact", "err", err)
				}
				return ipam.ConfigureIface(args.IfName, res)
			}); err != nil {
				return nil, fail(0, vf, "configure addresses and routes", err)
			}
		}
	} else if !dev.IsVFIO() {
		if err = pod.Do(func() error {
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
		if err = os.MkdirAll(filepath.Dir(path), 0o755); err == nil {
			err = devinfo.Write(path, devinfo.NewPCI(vf, dev.RDMADevice, dev.PFAddress), 0o444)
		}
		if err != nil {
			return nil, fail(types.ErrIOFailure, vf, "write device-info file", err)
		}
	}

	st.Phase = PhaseAdded
	if st.Result, err = res.MarshalJSON(); err == nil {
		err = store.Save(st)
	}
	if err != nil {
		return nil, fail(types.ErrIOFailure, vf, "write state", err)
	}
	log.Info("attached", "netdev", st.HostName, "rdma", dev.RDMADevice, "rdmaMoved", st.RDMAMoved, "netns", args.Netns)
	return res, nil
}

// checkDevice checks the conf against what the VF is.
func checkDevice(c *NetConf, d *nic.Device) error {
	ib := d.LinkType == rdma.LinkLayerInfiniBand
	switch {
	case ib && c.vf.MAC != nil:
		return errors.New("an InfiniBand VF has no Ethernet MAC to set: set guid (or runtimeConfig.infinibandGUID) instead of mac")
	case !ib && d.LinkType != "" && c.vf.GUID != nil:
		return fmt.Errorf("guid is for InfiniBand VFs; this one's link layer is %s", d.LinkType)
	case ib && (c.vf.Vlan != nil || c.vf.VlanProto != nil):
		return errors.New("an InfiniBand VF has no VLAN: use a partition key on the subnet manager instead of vlan")
	case d.IsVFIO() && c.MTU != nil:
		return fmt.Errorf("the VF is bound to %s (no netdev): mtu cannot apply", pci.DriverVFIO)
	}
	return nil
}

// rdmaPlan decides whether the VF's RDMA device moves with the netdev.
func (p *Plugin) rdmaPlan(log *slog.Logger, c *NetConf, d *nic.Device) (bool, error) {
	if d.IsVFIO() {
		return false, nil
	}
	if d.RDMADevice == "" {
		if c.RDMAIsolation {
			return false, fmt.Errorf("rdmaIsolation is set but the VF has no RDMA device (is mlx5_ib loaded?)")
		}
		return false, nil
	}
	mode, err := p.RDMA.NetnsMode()
	switch {
	case err != nil && c.RDMAIsolation:
		return false, fmt.Errorf("rdmaIsolation is set but the RDMA netns mode cannot be read: %w", err)
	case err != nil:
		log.Warn("RDMA device not moved: RDMA netns mode unknown; it stays visible in the host netns", "rdma", d.RDMADevice, "err", err)
		return false, nil
	case mode == RDMAModeExclusive:
		return true, nil
	case c.RDMAIsolation:
		return false, fmt.Errorf("rdmaIsolation is set but the RDMA subsystem is in %q netns mode: run `rdma system set netns exclusive` (before any pod starts)", mode)
	}
	log.Info("RDMA device left in place: RDMA netns mode is shared, every netns sees it", "rdma", d.RDMADevice, "mode", mode)
	return false, nil
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

// attachLink moves the VF netdev (and its RDMA device) into the pod.
func (p *Plugin) attachLink(log *slog.Logger, c *NetConf, st *State, host, pod *netns.NS, args *skel.CmdArgs) error {
	alias := st.HostName
	cfg := netns.LinkConfig{Name: args.IfName, Alias: &alias}
	if c.MTU != nil {
		cfg.MTU = *c.MTU
	}
	if c.vf.MAC != nil {
		cfg.MAC = c.vf.MAC
	}
	st.LinkMoved = true
	if _, err := netns.Move(st.HostName, host, pod, cfg); err != nil {
		return fail(0, st.PCIAddress, "move "+st.HostName+" into the pod as "+args.IfName, err)
	}
	if st.RDMADevice != "" {
		st.RDMAMoved = true
		if err := p.RDMA.Move(st.RDMADevice, host, pod); err != nil {
			return fail(0, st.PCIAddress, "move RDMA device "+st.RDMADevice+" into the pod", err)
		}
	}
	log.Debug("netdev moved", "from", st.HostName, "to", args.IfName)
	return nil
}

func (p *Plugin) ipamDel(ctx context.Context, args *skel.CmdArgs, ipamType string, stdin []byte) error {
	if _, err := invoke.FindInPath(ipamType, filepath.SplitList(args.Path)); err != nil {
		// A plugin that is not installed allocated nothing; failing
		// would only make the runtime retry DEL forever.
		return nil
	}
	if _, err := ipamCall(ctx, "DEL", args, ipamType, stdin); err != nil {
		return fmt.Errorf("IPAM %s DEL: %w", ipamType, err)
	}
	return nil
}

// teardown undoes what st says ADD did or may have done, newest first, and
// tolerates steps that were never done. withIPAM also releases the IPAM
// allocation (ADD's rollback releases it itself).
func (p *Plugin) teardown(ctx context.Context, log *slog.Logger, st *State, host *netns.NS, args *skel.CmdArgs, withIPAM bool) error {
	var errs []error
	if withIPAM && st.IPAMType != "" {
		if err := p.ipamDel(ctx, args, st.IPAMType, args.StdinData); err != nil {
			errs = append(errs, err)
		}
	}
	if st.DeviceInfoFile != "" {
		if err := os.Remove(st.DeviceInfoFile); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove device-info file: %w", err))
		}
	}
	if !st.VFIO && (st.LinkMoved || st.RDMAMoved) {
		var pod *netns.NS
		if st.Netns != "" {
			if n, err := netns.Open(st.Netns); err == nil {
				pod = n
				defer pod.Close()
			} else {
				log.Info("pod netns gone; the kernel returned the VF to the host netns", "netns", st.Netns)
			}
		}
		if st.RDMAMoved && pod != nil {
			present, err := p.RDMA.Present(st.RDMADevice, pod)
			if err == nil && present {
				err = p.RDMA.Move(st.RDMADevice, pod, host)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("return RDMA device %s to the host: %w", st.RDMADevice, err))
			}
		}
		if st.LinkMoved {
			if err := p.restoreLink(log, st, host, pod); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if len(st.VFApplied) > 0 && st.VFOrig != nil {
		if err := restoreVF(p.NewPF(host.Handle()), st.PFNetdev, st.VFIndex, st.VFApplied, st.VFOrig); err != nil {
			errs = append(errs, fmt.Errorf("VF settings on PF %s: %w", st.PFNetdev, err))
		}
	}
	if len(errs) > 0 {
		return fail(0, st.PCIAddress, "restore", errors.Join(errs...))
	}
	return nil
}

// restoreLink brings the VF netdev back to the host under its original
// name, MAC, MTU and alias, from wherever it is: in the pod netns, or back
// in the host netns under its pod name after the netns was destroyed.
func (p *Plugin) restoreLink(log *slog.Logger, st *State, host, pod *netns.NS) error {
	alias := st.HostAlias
	cfg := netns.LinkConfig{Name: st.HostName, MTU: st.HostMTU, Alias: &alias}
	if st.PodMAC != "" {
		cfg.MAC, _ = net.ParseMAC(st.HostMAC)
	}
	if pod != nil {
		// Only the link ADD put there, which carries the VF's host name
		// as its alias: the pod may have another interface of that name
		// (ADD's move failing on it is how we got here, perhaps).
		if l, err := pod.Handle().LinkByName(st.IfName); err == nil && l.Attrs().Alias == st.HostName {
			if _, err := netns.Move(st.IfName, pod, host, cfg); err != nil {
				return fmt.Errorf("return %s to the host as %s: %w", st.IfName, st.HostName, err)
			}
			return p.restoreUp(st, host)
		}
	}
	name := p.hostNetdev(st, host)
	if name == "" {
		log.Warn("VF netdev not found in the pod or the host netns; was the VF removed?", "netdev", st.HostName)
		return nil
	}
	h := host.Handle()
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("look up %s: %w", name, err)
	}
	if name != st.HostName {
		if err := h.LinkSetDown(l); err != nil {
			return fmt.Errorf("set %s down: %w", name, err)
		}
		if err := h.LinkSetName(l, st.HostName); err != nil {
			return fmt.Errorf("rename %s to %s: %w", name, st.HostName, err)
		}
	}
	a := l.Attrs()
	if cfg.MAC != nil && a.HardwareAddr.String() != cfg.MAC.String() {
		if err := h.LinkSetHardwareAddr(l, cfg.MAC); err != nil {
			return fmt.Errorf("restore MAC of %s: %w", st.HostName, err)
		}
	}
	if cfg.MTU != 0 && a.MTU != cfg.MTU {
		if err := h.LinkSetMTU(l, cfg.MTU); err != nil {
			return fmt.Errorf("restore MTU of %s: %w", st.HostName, err)
		}
	}
	if a.Alias != st.HostAlias {
		if err := h.LinkSetAlias(l, st.HostAlias); err != nil {
			return fmt.Errorf("restore alias of %s: %w", st.HostName, err)
		}
	}
	return p.restoreUp(st, host)
}

func (p *Plugin) restoreUp(st *State, host *netns.NS) error {
	if !st.HostUp {
		return nil
	}
	l, err := host.Handle().LinkByName(st.HostName)
	if err == nil {
		err = host.Handle().LinkSetUp(l)
	}
	if err != nil {
		return fmt.Errorf("set %s up: %w", st.HostName, err)
	}
	return nil
}

// hostNetdev finds the VF's netdev in the host netns: by PCI address in
// sysfs (the kernel's own answer on a real node), else by the name and
// alias ADD gave it (a netdev the kernel returned from a destroyed netns
// keeps both), else under its original name (restored already).
func (p *Plugin) hostNetdev(st *State, host *netns.NS) string {
	h := host.Handle()
	ents, _ := os.ReadDir(filepath.Join(p.HostRoot, "sys/bus/pci/devices", st.PCIAddress, "net"))
	for _, e := range ents {
		if l, err := h.LinkByName(e.Name()); err == nil && (e.Name() == st.HostName || l.Attrs().Alias == st.HostName) {
			return e.Name()
		}
	}
	if l, err := h.LinkByName(st.IfName); err == nil && l.Attrs().Alias == st.HostName {
		return st.IfName
	}
	if _, err := h.LinkByName(st.HostName); err == nil {
		return st.HostName
	}
	return ""
}

// Del detaches: restores the VF and releases its address.
func (p *Plugin) Del(args *skel.CmdArgs) error {
	ctx := context.Background()
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
	store, st, err := p.attachment(c, args)
	if err != nil {
		return err
	}
	if st == nil {
		// Never attached, or detached already; IPAM DEL is idempotent.
		if c.IPAM.Type != "" {
			if err := p.ipamDel(ctx, args, c.IPAM.Type, args.StdinData); err != nil {
				return fail(0, "", "release address", err)
			}
		}
		log.Debug("nothing attached")
		return nil
	}
	return p.detach(ctx, log, store, st.PCIAddress, args, c.Name, true)
}

// attachment opens the state store and finds the state of the attachment
// args names on network c.Name (nil if there is none).
func (p *Plugin) attachment(c *NetConf, args *skel.CmdArgs) (*Store, *State, error) {
	store, err := NewStore(c.StateDir)
	if err != nil {
		return nil, nil, fail(types.ErrIOFailure, "", "open state", err)
	}
	st, err := findState(store, c, args.ContainerID, args.IfName)
	if err != nil {
		return nil, nil, fail(types.ErrIOFailure, "", "read state", err)
	}
	return store, st, nil
}

// findState returns the state of (containerID, ifName) on network c.Name,
// or nil.
func findState(store *Store, c *NetConf, containerID, ifName string) (*State, error) {
	if id := c.deviceID(); id != "" {
		st, err := store.Load(id)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			return nil, nil
		case err != nil:
			return nil, err
		case st.ContainerID == containerID && st.IfName == ifName && st.Network == c.Name:
			return st, nil
		}
		return nil, nil
	}
	st, err := store.Find(c.Name, containerID, ifName)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return st, err
}

// detach tears the attachment of vf down under its lock, if it is still
// the attachment of (args.ContainerID, args.IfName).
func (p *Plugin) detach(ctx context.Context, log *slog.Logger, store *Store, vf string, args *skel.CmdArgs, network string, withIPAM bool) error {
	lock, err := store.Lock(vf, LockTimeout)
	if err != nil {
		return fail(types.ErrTryAgainLater, vf, "lock", err)
	}
	removeLock := false
	defer func() { lock.Unlock(removeLock) }()
	st, err := store.Load(vf)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // a concurrent DEL finished it
	}
	if err != nil {
		return fail(types.ErrIOFailure, vf, "read state", err)
	}
	if st.ContainerID != args.ContainerID || st.IfName != args.IfName || st.Network != network {
		return nil
	}
	host, err := netns.Current()
	if err != nil {
		return fail(0, vf, "open host netns", err)
	}
	defer host.Close()
	log = log.With("vf", vf)
	if terr := p.teardown(ctx, log, st, host, args, withIPAM); terr != nil {
		st.DelAttempts++
		if st.DelAttempts < maxDelAttempts {
			if err := store.Save(st); err != nil {
				log.Error("save state", "err", err)
			}
			return terr
		}
		log.Error("giving up on restoring the VF after repeated failures; state dropped", "attempts", st.DelAttempts, "err", terr)
	}
	if err := store.Remove(vf); err != nil {
		return fail(types.ErrIOFailure, vf, "remove state", err)
	}
	removeLock = true
	log.Info("detached", "netdev", st.HostName)
	return nil
}
