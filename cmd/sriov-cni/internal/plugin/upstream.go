package plugin

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// This file undoes an attachment that upstream sriov-cni made before
// fastpath replaced it on the node (README, "Coming from the Network
// Operator", step 4): its DEL finds no state of fastpath's, but upstream's
// cache, <stateDir>/<ContainerID>-<IfName> (upstream's default directory
// is fastpath's default stateDir), holds what upstream changed and what it
// found before. The cache is translated into the State fastpath's ADD
// would have journaled (upstreamState) and the one teardown undoes it:
// the netdev back on the host under its original name, the VF's settings
// on the PF restored. Then the address is released and only then is the
// cache removed. A failed restore keeps the cache for the runtime's next
// DEL; the failures are counted in <cache>.fastpath-attempts (a decimal
// number) and, at maxDelAttempts, DEL gives up as it does on its own
// state. A cache that cannot be trusted is set aside as <cache>.bad and
// DEL goes on as without it, and so is one whose translation the kernel
// does not confirm (checkState: deviceID not a VF in sysfs, its Master and
// VFID not the VF's PF and index). GC undoes, the same way, the caches of this
// network's attachments that are not valid (gcUpstream).

// upstreamCache is what fastpath reads of upstream's cache: the JSON of
// its NetConf, whose untagged Go fields appear under their Go names. Every
// field is optional (upstream's versions differ): a missing one is left
// alone.
type upstreamCache struct {
	Name        string           `json:"name"`
	DeviceID    string           `json:"deviceID"`
	DPDKMode    bool             `json:"DPDKMode"`
	Master      string           `json:"Master"`
	VFID        *int             `json:"VFID"`
	OrigVfState upstreamVFState  `json:"OrigVfState"`
	Vlan        *int             `json:"vlan"`
	MAC         string           `json:"mac"`
	SpoofChk    string           `json:"spoofchk"`
	Trust       string           `json:"trust"`
	LinkState   string           `json:"link_state"`
	MinTxRate   *int             `json:"min_tx_rate"`
	MaxTxRate   *int             `json:"max_tx_rate"`
	Runtime     upstreamRuntimes `json:"runtimeConfig"`
	// ContIFNames is the attachment's CNI_IFNAME.
	ContIFNames string `json:"ContIFNames"`
}

type upstreamRuntimes struct {
	MAC string `json:"mac"`
}

// upstreamVFState is upstream's OrigVfState: the VF as upstream's ADD
// found it.
type upstreamVFState struct {
	HostIFName   string  `json:"HostIFName"`
	SpoofChk     *bool   `json:"SpoofChk"`
	Trust        *bool   `json:"Trust"`
	AdminMAC     *string `json:"AdminMAC"`
	EffectiveMAC *string `json:"EffectiveMAC"`
	Vlan         *int    `json:"Vlan"`
	VlanQoS      *int    `json:"VlanQoS"`
	VlanProto    *string `json:"VlanProto"`
	MinTxRate    *int    `json:"MinTxRate"`
	MaxTxRate    *int    `json:"MaxTxRate"`
	LinkState    *uint32 `json:"LinkState"`
}

// parseUpstreamCache decodes upstream's cache. Every error means the file
// cannot be trusted (ErrBadState).
func parseUpstreamCache(data []byte) (*upstreamCache, error) {
	uc := &upstreamCache{}
	if err := json.Unmarshal(data, uc); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadState, err)
	}
	o := &uc.OrigVfState
	switch {
	case !pci.ValidAddress(uc.DeviceID):
		return nil, fmt.Errorf("%w: deviceID %q is not a PCI address", ErrBadState, uc.DeviceID)
	case o.HostIFName != "" && ifname.Check(o.HostIFName) != nil:
		return nil, fmt.Errorf("%w: OrigVfState.HostIFName: %v", ErrBadState, ifname.Check(o.HostIFName))
	case uc.Master != "" && ifname.Check(uc.Master) != nil:
		return nil, fmt.Errorf("%w: Master: %v", ErrBadState, ifname.Check(uc.Master))
	case uc.VFID != nil && *uc.VFID < 0:
		return nil, fmt.Errorf("%w: VFID %d", ErrBadState, *uc.VFID)
	}
	if o.VlanProto != nil {
		if _, err := upstreamVlanProto(*o.VlanProto); err != nil {
			return nil, fmt.Errorf("%w: OrigVfState.VlanProto: %v", ErrBadState, err)
		}
	}
	return uc, nil
}

func upstreamVlanProto(s string) (int, error) {
	switch strings.ToLower(s) {
	case "", "802.1q":
		return sriov.VlanProto8021Q, nil
	case "802.1ad":
		return sriov.VlanProto8021AD, nil
	}
	return 0, fmt.Errorf("%q: want 802.1q or 802.1ad", s)
}

// restorePlan is the VF settings on the PF upstream changed and whose
// values before are in the cache, in the order ADD applies them, with
// those values over base (the VF's settings now, for what the cache does
// not hold of a setting that takes several values).
func (uc *upstreamCache) restorePlan(base sriov.VFConfig) ([]sriov.Setting, *sriov.VFConfig) {
	o, orig := &uc.OrigVfState, base
	var out []sriov.Setting
	if uc.Vlan != nil && o.Vlan != nil {
		orig.Vlan, orig.QoS, orig.Proto = *o.Vlan, 0, sriov.VlanProto8021Q
		if o.VlanQoS != nil {
			orig.QoS = *o.VlanQoS
		}
		if o.VlanProto != nil {
			orig.Proto, _ = upstreamVlanProto(*o.VlanProto)
		}
		out = append(out, sriov.SettingVlan)
	}
	if (uc.MAC != "" || uc.Runtime.MAC != "") && o.AdminMAC != nil {
		orig.MAC = *o.AdminMAC
		out = append(out, sriov.SettingMAC)
	}
	if uc.SpoofChk != "" && o.SpoofChk != nil {
		orig.SpoofChk = *o.SpoofChk
		out = append(out, sriov.SettingSpoofChk)
	}
	if uc.Trust != "" && o.Trust != nil {
		orig.Trust = *o.Trust
		out = append(out, sriov.SettingTrust)
	}
	if uc.LinkState != "" && o.LinkState != nil {
		orig.LinkState = *o.LinkState
		out = append(out, sriov.SettingLinkState)
	}
	if (uc.MinTxRate != nil || uc.MaxTxRate != nil) && (o.MinTxRate != nil || o.MaxTxRate != nil) {
		if o.MinTxRate != nil {
			orig.MinTxRate = *o.MinTxRate
		}
		if o.MaxTxRate != nil {
			orig.MaxTxRate = *o.MaxTxRate
		}
		out = append(out, sriov.SettingTxRate)
	}
	return out, &orig
}

// upstreamPath is where upstream caches the attachment (containerID,
// ifName), or "" when those cannot name a file in the state dir.
func (s *Store) upstreamPath(containerID, ifName string) string {
	name := containerID + "-" + ifName
	if containerID == "" || ifName == "" || strings.HasPrefix(name, ".") || filepath.Base(name) != name {
		return ""
	}
	return filepath.Join(s.dir, name)
}

// readUpstream reads upstream's cache at path: fs.ErrNotExist when there
// is none, ErrBadState when it cannot be trusted.
func readUpstream(path string) (*upstreamCache, error) {
	data, err := readOwnFile(path, "upstream cache "+path)
	if err != nil {
		return nil, err
	}
	uc, err := parseUpstreamCache(data)
	if err != nil {
		return nil, fmt.Errorf("upstream cache %s: %w", path, err)
	}
	return uc, nil
}

// loadUpstream reads upstream's cache of the attachment. A cache that
// cannot be trusted is set aside as <cache>.bad and logged; like a cache
// that cannot be read, it is then as if absent (nil): a foreign file never
// wedges a DEL.
func (s *Store) loadUpstream(log *slog.Logger, args *skel.CmdArgs) (*upstreamCache, string) {
	path := s.upstreamPath(args.ContainerID, args.IfName)
	if path == "" {
		return nil, ""
	}
	uc, err := readUpstream(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, ""
	case errors.Is(err, ErrBadState):
		s.setAsideUpstream(log, path, err)
		return nil, ""
	case err != nil:
		log.Error("upstream sriov-cni's cache unreadable; DEL goes on without it", "err", err)
		return nil, ""
	}
	return uc, path
}

func (s *Store) setAsideUpstream(log *slog.Logger, path string, why error) {
	to, err := setAside(path)
	if err != nil {
		log.Error("upstream sriov-cni's cache cannot be trusted, nor set aside; DEL goes on without it", "err", why, "setAsideErr", err)
		return
	}
	log.Error("upstream sriov-cni's cache cannot be trusted; set aside, DEL goes on without it", "err", why, "to", to)
}

// removeUpstream removes upstream's cache and fastpath's attempt count.
func removeUpstream(path string) error {
	_ = os.Remove(path + upstreamAttemptsSuffix)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("remove upstream sriov-cni's cache: %w", err)
	}
	return nil
}

// upstreamAttemptsSuffix names the file beside upstream's cache that
// counts DELs that failed to restore its VF.
const upstreamAttemptsSuffix = ".fastpath-attempts"

func upstreamAttempts(path string) int {
	b, err := os.ReadFile(path + upstreamAttemptsSuffix)
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return 0
	}
	return n
}

// upstreamState translates upstream's cache of the attachment args names
// into the State fastpath's ADD would have journaled for it, so that the
// one teardown undoes it: the netdev moved into the pod (unless DPDK mode
// bound the VF to vfio-pci), its host name and, when upstream set a MAC,
// the MAC it had (EffectiveMAC); the VF settings on the PF that upstream
// changed and whose values before the cache holds (restorePlan), on the PF
// sysfs names, else the cache's Master and VFID. Upstream moves no RDMA
// device and sets no alias, MTU or device-info file. Its address is not
// in the State: it is released once the VF is home (delUpstream).
func (p *Plugin) upstreamState(log *slog.Logger, uc *upstreamCache, c *NetConf, args *skel.CmdArgs, host *netns.NS) *State {
	o := &uc.OrigVfState
	st := &State{Version: StateVersion, Phase: PhaseAdded, Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName,
		Netns: args.Netns, PCIAddress: uc.DeviceID, VFIO: uc.DPDKMode, LinkMoved: !uc.DPDKMode, HostName: o.HostIFName}
	if mac := cmp.Or(uc.MAC, uc.Runtime.MAC); mac != "" && o.EffectiveMAC != nil {
		st.PodMAC, st.HostMAC = mac, *o.EffectiveMAC
	}
	d, err := nic.NewScanner(p.HostRoot).Device(uc.DeviceID)
	switch {
	case err == nil && d.PFNetdev != "":
		st.PFAddress, st.PFNetdev, st.VFIndex = d.PFAddress, d.PFNetdev, d.VFIndex
	case uc.Master != "" && uc.VFID != nil:
		st.PFNetdev, st.VFIndex = uc.Master, *uc.VFID
	default:
		log.Warn("PF of the VF unknown: not in sysfs, and upstream's cache names no Master and VFID", "sysfsErr", err)
	}
	base := sriov.VFConfig{Proto: sriov.VlanProto8021Q}
	if st.PFNetdev != "" {
		if now, err := p.NewPFLink(host.Handle()).VF(st.PFNetdev, st.VFIndex); err == nil {
			base = now
		}
	}
	if settings, orig := uc.restorePlan(base); len(settings) > 0 {
		st.VFApplied, st.VFOrig = settings, orig
	}
	return st
}

// delUpstream undoes, with vf's lock held and no state of fastpath's for
// vf, the attachment upstream sriov-cni made, when its cache is there and
// names vf: its translation (upstreamState) goes through teardown, then
// its address is released and the cache removed. It reports whether there
// was such a cache; when there was, err is DEL's answer.
func (p *Plugin) delUpstream(ctx context.Context, log *slog.Logger, c *NetConf, store *Store, args *skel.CmdArgs, lock *Lock, vf string) (bool, error) {
	uc, path := store.loadUpstream(log, args)
	if uc == nil {
		return false, nil
	}
	if uc.DeviceID != vf {
		store.setAsideUpstream(log, path, fmt.Errorf("%w: names VF %s, DEL is of VF %s", ErrBadState, uc.DeviceID, vf))
		return false, nil
	}
	log = log.With("upstreamCache", path)
	log.Info("attachment made by upstream sriov-cni: undoing it from its cache", "dpdk", uc.DPDKMode, "hostName", uc.OrigVfState.HostIFName)
	host, err := netns.Current()
	if err != nil {
		return true, fail(0, vf, "open host netns", err)
	}
	defer host.Close()

	st := p.upstreamState(log, uc, c, args, host)
	if err := p.checkState(st); err != nil {
		// Not the kernel's VF, PF and index (evidence.go): nothing the
		// cache names is acted on.
		store.setAsideUpstream(log, path, fmt.Errorf("upstream cache %s: %w", path, err))
		return false, nil
	}
	if restoreErr, _ := p.teardown(ctx, log, store, st, host, args, lock); restoreErr != nil {
		n := upstreamAttempts(path) + 1
		if n < maxDelAttempts {
			if err := os.WriteFile(path+upstreamAttemptsSuffix, []byte(strconv.Itoa(n)+"\n"), 0o600); err != nil {
				log.Error("count of failed DELs not saved", "err", err)
			}
			return true, restoreErr
		}
		log.Error("giving up on restoring the VF upstream sriov-cni attached after repeated failures; its cache dropped",
			"attempts", n, "err", restoreErr)
	}

	var ipamErr error
	if c.IPAM.Type != "" {
		if err := p.ipamDel(ctx, args, c.IPAM.Type, lock); err != nil {
			pr := &Pending{Network: c.Name, ContainerID: args.ContainerID, IfName: args.IfName, Netns: args.Netns,
				IPAMType: c.IPAM.Type, PCIAddress: vf}
			if prev, perr := store.LoadPending(c.Name, args.ContainerID, args.IfName); perr == nil {
				pr = prev
			}
			if ipamErr = store.pend(log, pr, err); !errors.Is(ipamErr, ErrIPAMPending) {
				// Not recorded: the cache keeps the address for the next DEL.
				return true, ipamErr
			}
		} else if err := store.RemovePending(c.Name, args.ContainerID, args.IfName); err != nil {
			log.Warn("pending address release record left", "err", err)
		}
	}
	if err := removeUpstream(path); err != nil {
		return true, errors.Join(ipamErr, fail(types.ErrIOFailure, vf, "remove upstream cache", err))
	}
	log.Info("detached upstream sriov-cni's attachment")
	return true, ipamErr
}

// upstreamAttachment is an attachment upstream sriov-cni's cache describes.
type upstreamAttachment struct {
	ContainerID, IfName string
	cache               *upstreamCache
}

// upstreamAttachments lists the attachments of network whose caches
// upstream sriov-cni left in the state dir: files named
// <ContainerID>-<ContIFNames> that parse as its cache and name network.
// Anything else there, fastpath's own files first, is not looked at.
func (s *Store) upstreamAttachments(network string) ([]upstreamAttachment, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("state dir %s: %w", s.dir, err)
	}
	var out []upstreamAttachment
	for _, e := range ents {
		name := e.Name()
		if !e.Type().IsRegular() || strings.HasPrefix(name, ".") || ownSuffix(name) {
			continue
		}
		uc, err := readUpstream(filepath.Join(s.dir, name))
		if err != nil {
			s.log.Debug("not upstream sriov-cni's cache; left alone", "file", name, "err", err)
			continue
		}
		cid, ok := strings.CutSuffix(name, "-"+uc.ContIFNames)
		if uc.Name != network || !ok || cid == "" || ifname.Check(uc.ContIFNames) != nil {
			continue
		}
		out = append(out, upstreamAttachment{ContainerID: cid, IfName: uc.ContIFNames, cache: uc})
	}
	return out, nil
}

// ownSuffix reports whether name is one of the files fastpath keeps in the
// state dir (Store, Pending) or beside upstream's caches.
func ownSuffix(name string) bool {
	for _, suf := range []string{".json", ".lock", ".netns", ".bad", ".pending", upstreamAttemptsSuffix} {
		if strings.HasSuffix(name, suf) {
			return true
		}
	}
	return false
}

// gcUpstream undoes, as their DELs would, the attachments of network c
// that upstream sriov-cni made and that are not valid: a pod lost without
// a DEL leaves upstream's cache, and its VF's settings, behind. The pod's
// netns is not in the cache: the netdev is found on the host, where the
// kernel returned it when that netns went, or in the pinned netns of a
// killed DEL.
func (p *Plugin) gcUpstream(ctx context.Context, log *slog.Logger, c *NetConf, store *Store, args *skel.CmdArgs, valid map[types.GCAttachment]bool) error {
	atts, err := store.upstreamAttachments(c.Name)
	if err != nil {
		return err
	}
	var errs []error
	for _, a := range atts {
		if valid[types.GCAttachment{ContainerID: a.ContainerID, IfName: a.IfName}] {
			continue
		}
		del := &skel.CmdArgs{ContainerID: a.ContainerID, IfName: a.IfName, Path: args.Path, StdinData: args.StdinData}
		if err := p.detach(ctx, log, c, store, a.cache.DeviceID, del); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("collected upstream sriov-cni's stale attachment", "vf", a.cache.DeviceID, "container", shortID(a.ContainerID), "ifname", a.IfName)
	}
	return errors.Join(errs...)
}
