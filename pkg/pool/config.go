// Package pool turns a node's discovered functions into the extended
// resources the device plugin advertises. It reads the two config formats
// users already have, verbatim and in one file:
//
//   - configList, from k8s-rdma-shared-dev-plugin (NicClusterPolicy
//     rdmaSharedDevicePlugin): each entry is a shared pool of HCAs that up to
//     rdmaHcaMax containers use at once;
//   - resourceList, from sriov-network-device-plugin (NicClusterPolicy
//     sriovDevicePlugin): each entry is an exclusive pool of VFs, one per
//     request.
//
// Keys match case-insensitively (the SR-IOV operator writes "IsRdma"), and
// every mistake is an error that names the field and the value.
package pool

import (
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/internal/ifname"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// Kind says how a pool's devices are handed out.
type Kind string

// Pool kinds.
const (
	// Exclusive pools give each request one whole VF.
	Exclusive Kind = "exclusive"
	// Shared pools give each container all of the pool's HCAs, up to
	// RdmaHcaMax containers at a time.
	Shared Kind = "shared"
)

// Allocation policies of an exclusive pool, used by GetPreferredAllocation.
const (
	PolicyPack   = "pack"   // VFs of as few PFs as possible
	PolicySpread = "spread" // one VF per PF (one per rail) first
)

// Defaults.
const (
	DefaultPrefix                 = "mellanox.com"
	DefaultPeriodicUpdateInterval = 60 * time.Second
	// MaxRdmaHcaMax bounds a shared pool's slots: each is a device in
	// every ListAndWatch message the kubelet receives.
	MaxRdmaHcaMax = 10000
)

// Config is a parsed pool config file.
type Config struct {
	// PeriodicUpdateInterval is how often the plugin rescans the node; 0
	// turns the periodic rescan off.
	PeriodicUpdateInterval time.Duration
	// Resources are the pools, configList entries first, in file order.
	Resources []Resource
	// Warnings are things that load but are probably not what was meant.
	Warnings []string
}

// Resource is one pool's definition.
type Resource struct {
	Prefix string // "mellanox.com"
	Name   string // "mlnx_sriov_rdma"
	Kind   Kind
	// RdmaHcaMax is how many containers may share a shared pool's HCAs.
	RdmaHcaMax int
	// ExcludeTopology stops the plugin reporting NUMA affinity.
	ExcludeTopology bool
	// AllocationPolicy is PolicyPack, PolicySpread or "" (pack).
	AllocationPolicy string
	// DeviceType is the resourceList deviceType ("netDevice" or
	// "accelerator"); "" for shared pools.
	DeviceType string
	// Selectors select the pool's functions: a function belongs to the
	// pool when any selector matches it.
	Selectors []Selector
	// Source is where the resource was defined ("resourceList[0]").
	Source string
}

// ResourceName is the extended resource, "mellanox.com/mlnx_sriov_rdma".
func (r *Resource) ResourceName() string { return r.Prefix + "/" + r.Name }

// Selector matches functions; every field that is set must match (a field
// matches when any of its values does).
type Selector struct {
	Vendors      []string // "15b3"
	Devices      []string // PCI device IDs, "101e"
	Drivers      []string
	PCIAddresses []string
	PFNames      []VFSet // VFs of the PF with this netdev
	RootDevices  []VFSet // VFs of the PF at this PCI address
	IfNames      []string
	LinkTypes    []string // rdma.LinkLayerInfiniBand or rdma.LinkLayerEthernet
	IsRdma       bool     // only functions with an RDMA device
}

// VFSet is a PF (by netdev name or PCI address) and, optionally, which of
// its VFs: "ens2f0#0-11" or "0000:86:00.0#0,2-7".
type VFSet struct {
	PF string
	// Ranges are inclusive VF index ranges; nil means every VF.
	Ranges [][2]int
}

// Contains reports whether VF index i is in the set.
func (s VFSet) Contains(i int) bool {
	if s.Ranges == nil {
		return true
	}
	for _, r := range s.Ranges {
		if i >= r[0] && i <= r[1] {
			return true
		}
	}
	return false
}

// ErrNoConfig is returned by Load when the file does not exist.
var ErrNoConfig = errors.New("pool config file does not exist")

// Load reads and parses a pool config file.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (pass --config with a configList/resourceList file, e.g. config.json of deployments/10-configmap.yaml)", ErrNoConfig, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read pool config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("pool config %s: %w", path, err)
	}
	return cfg, nil
}

var (
	topKeys = []string{"periodicUpdateInterval", "configList", "resourceList"}

	sharedKeys = []string{"resourceName", "resourcePrefix", "rdmaHcaMax", "selectors", "devices", "excludeTopology"}
	sharedSel  = []string{"vendors", "deviceIDs", "drivers", "ifNames", "linkTypes"}

	exclusiveKeys = []string{"resourceName", "resourcePrefix", "deviceType", "excludeTopology", "selectors", "allocationPolicy"}
	exclusiveSel  = []string{"vendors", "devices", "drivers", "pciAddresses", "pfNames", "rootDevices", "linkTypes", "isRdma"}

	// Keys of the upstream formats that fastpath understands but does not
	// serve, with the reason.
	unsupportedExclusive = map[string]string{
		"rdmahcamax":     "rdmaHcaMax applies to configList (shared) pools; a resourceList pool hands out whole VFs",
		"additionalinfo": "additionalInfo is not supported: fastpath puts each device's details in PCIDEVICE_<RESOURCE>_INFO",
	}
	unsupportedSelector = map[string]string{
		"ddpprofiles":  "ddpProfiles select Intel DDP profiles and can never match a Mellanox/NVIDIA function",
		"needvhostnet": "needVhostNet is not supported: fastpath does not hand out /dev/vhost-net",
		"vdpatype":     "vdpaType is not supported: fastpath does not hand out vDPA devices",
		"pkeys":        "pKeys is not supported: partition keys are not read during discovery",
		"acpiindexes":  "acpiIndexes is not supported",
		"auxtypes":     "auxTypes is not supported: scalable functions are not discovered",
	}
	sharedUnsupportedKeys = map[string]string{
		"allocationpolicy": "allocationPolicy applies to resourceList (exclusive) pools; a shared pool gives every container all its HCAs",
		"devicetype":       "deviceType applies to resourceList (exclusive) pools",
	}
)

// Parse parses a pool config.
func Parse(data []byte) (*Config, error) {
	root, err := decode(data)
	if err != nil {
		return nil, err
	}
	top, err := root.object()
	if err != nil {
		return nil, err
	}
	f, err := top.fields("", topKeys, nil)
	if err != nil {
		return nil, err
	}
	cfg := &Config{PeriodicUpdateInterval: DefaultPeriodicUpdateInterval}
	if v := f["periodicUpdateInterval"]; v != nil {
		secs, err := v.integer()
		if err != nil {
			return nil, err
		}
		if secs < 0 || secs > 86400*7 {
			return nil, fmt.Errorf("%s: %d seconds: want 0 (off) to 604800", v.path, secs)
		}
		cfg.PeriodicUpdateInterval = time.Duration(secs) * time.Second
	}
	if v := f["configList"]; v != nil {
		list, err := v.list()
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			r, err := parseShared(e, cfg)
			if err != nil {
				return nil, err
			}
			cfg.Resources = append(cfg.Resources, r)
		}
	}
	if v := f["resourceList"]; v != nil {
		list, err := v.list()
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			r, err := parseExclusive(e, cfg)
			if err != nil {
				return nil, err
			}
			cfg.Resources = append(cfg.Resources, r)
		}
	}
	if len(cfg.Resources) == 0 {
		return nil, errors.New("config defines no pools: add a configList (shared HCAs) and/or a resourceList (exclusive VFs) entry")
	}
	seen := map[string]string{}
	for _, r := range cfg.Resources {
		name := r.ResourceName()
		if prev, ok := seen[name]; ok {
			return nil, fmt.Errorf("%s: duplicate resource %q (already defined by %s)", r.Source, name, prev)
		}
		seen[name] = r.Source
	}
	return cfg, nil
}

// names reads resourceName and resourcePrefix and checks them.
func names(e *value, f map[string]*value, r *Resource) error {
	v := f["resourceName"]
	if v == nil {
		return fmt.Errorf("%s: resourceName is required", e.name())
	}
	name, err := v.str()
	if err != nil {
		return err
	}
	r.Prefix = DefaultPrefix
	if p := f["resourcePrefix"]; p != nil {
		s, err := p.str()
		if err != nil {
			return err
		}
		if s != "" {
			r.Prefix = s
		}
	}
	// sriov-network-device-plugin accepts "prefix/name" in resourceName.
	if i := strings.IndexByte(name, '/'); i >= 0 {
		if f["resourcePrefix"] != nil {
			return fmt.Errorf("%s: %q has a prefix and resourcePrefix is also set: give one", v.path, name)
		}
		r.Prefix, name = name[:i], name[i+1:]
	}
	r.Name = name
	if !qualifiedName.MatchString(name) || len(name) > 63 {
		return fmt.Errorf("%s: %q is not a valid resource name: want up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit", v.path, name)
	}
	if !dnsSubdomain.MatchString(r.Prefix) || len(r.Prefix) > 253 {
		return fmt.Errorf("%s: resource prefix %q is not a DNS subdomain: want lower-case letters, digits, '-' and '.', like mellanox.com", e.name(), r.Prefix)
	}
	if r.Prefix == "kubernetes.io" || strings.HasSuffix(r.Prefix, ".kubernetes.io") {
		return fmt.Errorf("%s: resource prefix %q: the kubernetes.io domain is reserved; extended resources need another prefix", e.name(), r.Prefix)
	}
	return nil
}

// Kubernetes' rules for the two halves of an extended resource name.
var (
	qualifiedName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

func parseShared(e *value, cfg *Config) (Resource, error) {
	r := Resource{Kind: Shared, Source: e.name()}
	o, err := e.object()
	if err != nil {
		return r, err
	}
	f, err := o.fields(e.path, sharedKeys, sharedUnsupportedKeys)
	if err != nil {
		return r, err
	}
	if err := names(e, f, &r); err != nil {
		return r, err
	}
	v := f["rdmaHcaMax"]
	if v == nil {
		return r, fmt.Errorf("%s: rdmaHcaMax is required: how many containers may share the pool's HCAs (at least 1)", e.name())
	}
	n, err := v.integer()
	if err != nil {
		return r, err
	}
	if n < 1 || n > MaxRdmaHcaMax {
		return r, fmt.Errorf("%s: %d: want 1 to %d containers sharing the HCAs", v.path, n, MaxRdmaHcaMax)
	}
	r.RdmaHcaMax = int(n)
	if r.ExcludeTopology, err = optBool(f["excludeTopology"]); err != nil {
		return r, err
	}
	var sel Selector
	if v := f["selectors"]; v != nil {
		o, err := v.object()
		if err != nil {
			return r, fmt.Errorf("%w (a configList entry has one selectors object)", err)
		}
		sf, err := o.fields(v.path, sharedSel, unsupportedSelector)
		if err != nil {
			return r, err
		}
		if sel, err = selector(sf, cfg); err != nil {
			return r, err
		}
	}
	// The legacy format lists interface names in "devices".
	if v := f["devices"]; v != nil {
		if len(sel.IfNames) > 0 {
			return r, fmt.Errorf("%s: give the interfaces either in devices (legacy) or in selectors.ifNames, not both", v.path)
		}
		if sel.IfNames, err = ifNames(v); err != nil {
			return r, err
		}
	}
	if sel.empty() {
		return r, fmt.Errorf("%s: no selectors: a shared pool must say which HCAs it takes (e.g. selectors.vendors, deviceIDs, ifNames)", e.name())
	}
	r.Selectors = []Selector{sel}
	return r, nil
}

func parseExclusive(e *value, cfg *Config) (Resource, error) {
	r := Resource{Kind: Exclusive, Source: e.name(), DeviceType: "netDevice"}
	o, err := e.object()
	if err != nil {
		return r, err
	}
	f, err := o.fields(e.path, exclusiveKeys, unsupportedExclusive)
	if err != nil {
		return r, err
	}
	if err := names(e, f, &r); err != nil {
		return r, err
	}
	if v := f["deviceType"]; v != nil {
		s, err := v.str()
		if err != nil {
			return r, err
		}
		switch strings.ToLower(s) {
		case "netdevice", "":
		case "accelerator":
			r.DeviceType = "accelerator"
		case "auxnetdevice":
			return r, fmt.Errorf("%s: %q is not supported: scalable functions are not discovered; use netDevice VFs", v.path, s)
		default:
			return r, fmt.Errorf("%s: %q: want netDevice or accelerator", v.path, s)
		}
	}
	if r.ExcludeTopology, err = optBool(f["excludeTopology"]); err != nil {
		return r, err
	}
	if v := f["allocationPolicy"]; v != nil {
		s, err := v.str()
		if err != nil {
			return r, err
		}
		switch s {
		case PolicyPack, PolicySpread:
			r.AllocationPolicy = s
		default:
			return r, fmt.Errorf("%s: %q: want %q (VFs of as few PFs as possible) or %q (one VF per PF)", v.path, s, PolicyPack, PolicySpread)
		}
	}
	v := f["selectors"]
	if v == nil {
		return r, fmt.Errorf("%s: selectors are required: say which VFs the pool takes (e.g. vendors, devices, pfNames)", e.name())
	}
	// One selector object, or a list of them.
	var objs []*value
	if _, ok := v.v.(*object); ok {
		objs = []*value{v}
	} else if objs, err = v.list(); err != nil {
		return r, fmt.Errorf("%s: want a selector object or a list of them, got %s", v.path, kindOf(v.v))
	}
	if len(objs) == 0 {
		return r, fmt.Errorf("%s: empty list: give at least one selector", v.path)
	}
	for _, sv := range objs {
		o, err := sv.object()
		if err != nil {
			return r, err
		}
		sf, err := o.fields(sv.path, exclusiveSel, unsupportedSelector)
		if err != nil {
			return r, err
		}
		sel, err := selector(sf, cfg)
		if err != nil {
			return r, err
		}
		if sel.empty() {
			return r, fmt.Errorf("%s: empty selector would take every Mellanox function; name at least one of %s", sv.name(), strings.Join(exclusiveSel, ", "))
		}
		r.Selectors = append(r.Selectors, sel)
	}
	return r, nil
}

func optBool(v *value) (bool, error) {
	if v == nil {
		return false, nil
	}
	return v.boolean()
}

func (s *Selector) empty() bool {
	return len(s.Vendors) == 0 && len(s.Devices) == 0 && len(s.Drivers) == 0 && len(s.PCIAddresses) == 0 &&
		len(s.PFNames) == 0 && len(s.RootDevices) == 0 && len(s.IfNames) == 0 && len(s.LinkTypes) == 0 && !s.IsRdma
}

// notDrivers are kernel modules people put in "drivers" that no PCI
// function is ever bound to.
var notDrivers = map[string]string{
	"mlx5_ib":   "mlx5_ib is the RDMA module, not a PCI driver",
	"mlx5_en":   "mlx5_en is part of mlx5_core, not a PCI driver",
	"ib_uverbs": "ib_uverbs is the RDMA verbs module, not a PCI driver",
	"ib_core":   "ib_core is the RDMA core module, not a PCI driver",
	"rdma_ucm":  "rdma_ucm is the RDMA CM module, not a PCI driver",
	"mlx4_ib":   "mlx4_ib is the RDMA module, not a PCI driver",
}

func selector(f map[string]*value, cfg *Config) (Selector, error) {
	var s Selector
	var err error
	if v := f["vendors"]; v != nil {
		if s.Vendors, err = hexIDs(v); err != nil {
			return s, err
		}
		mellanox := false
		for _, id := range s.Vendors {
			if id == pci.VendorMellanox {
				mellanox = true
			}
		}
		if !mellanox {
			return s, fmt.Errorf("%s: %q can never match: fastpath serves Mellanox/NVIDIA NIC functions only (vendor 15b3)", v.path, s.Vendors)
		}
		if len(s.Vendors) > 1 {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s: only vendor 15b3 can match; the others are ignored", v.path))
		}
	}
	for _, k := range []string{"devices", "deviceIDs"} {
		if v := f[k]; v != nil {
			if s.Devices, err = hexIDs(v); err != nil {
				return s, err
			}
		}
	}
	if v := f["drivers"]; v != nil {
		if s.Drivers, err = v.strings(); err != nil {
			return s, err
		}
		for i, d := range s.Drivers {
			if why, ok := notDrivers[d]; ok {
				return s, fmt.Errorf("%s[%d]: %q can never match: %s; Mellanox VFs are bound to mlx5_core (or vfio-pci for DPDK)", v.path, i, d, why)
			}
			if d == "" {
				return s, fmt.Errorf("%s[%d]: empty driver name", v.path, i)
			}
		}
	}
	if v := f["pciAddresses"]; v != nil {
		list, err := v.strings()
		if err != nil {
			return s, err
		}
		for i, a := range list {
			a = strings.ToLower(strings.TrimSpace(a))
			if !pci.ValidAddress(a) {
				return s, fmt.Errorf("%s[%d]: %q is not a PCI address (want DDDD:BB:DD.F, e.g. 0000:18:00.1)", v.path, i, list[i])
			}
			s.PCIAddresses = append(s.PCIAddresses, a)
		}
	}
	if v := f["pfNames"]; v != nil {
		if s.PFNames, err = vfSets(v, false); err != nil {
			return s, err
		}
	}
	if v := f["rootDevices"]; v != nil {
		if s.RootDevices, err = vfSets(v, true); err != nil {
			return s, err
		}
	}
	if v := f["ifNames"]; v != nil {
		if s.IfNames, err = ifNames(v); err != nil {
			return s, err
		}
	}
	if v := f["linkTypes"]; v != nil {
		list, err := v.strings()
		if err != nil {
			return s, err
		}
		for i, l := range list {
			switch strings.ToLower(l) {
			case "ether", "ethernet", "eth", "roce":
				s.LinkTypes = append(s.LinkTypes, rdma.LinkLayerEthernet)
			case "infiniband", "ib":
				s.LinkTypes = append(s.LinkTypes, rdma.LinkLayerInfiniBand)
			default:
				return s, fmt.Errorf("%s[%d]: %q: want ether or infiniband", v.path, i, l)
			}
		}
	}
	if v := f["isRdma"]; v != nil {
		if s.IsRdma, err = v.boolean(); err != nil {
			return s, err
		}
	}
	return s, nil
}

func hexIDs(v *value) ([]string, error) {
	list, err := v.strings()
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(list))
	for i, s := range list {
		id := strings.ToLower(strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(s), "0x"), "0X"))
		if len(id) != 4 || strings.Trim(id, "0123456789abcdef") != "" {
			return nil, fmt.Errorf("%s[%d]: %q is not a PCI ID: want 4 hex digits, e.g. 15b3 or 101e", v.path, i, s)
		}
		out = append(out, id)
	}
	return out, nil
}

func ifNames(v *value) ([]string, error) {
	list, err := v.strings()
	if err != nil {
		return nil, err
	}
	for i, n := range list {
		if err := ifname.Check(n); err != nil {
			return nil, fmt.Errorf("%s[%d]: %w", v.path, i, err)
		}
	}
	return list, nil
}

// vfSets parses pfNames ("ens2f0", "ens2f0#0-11") or rootDevices
// ("0000:86:00.0#0,2-7").
func vfSets(v *value, pciAddr bool) ([]VFSet, error) {
	list, err := v.strings()
	if err != nil {
		return nil, err
	}
	out := make([]VFSet, 0, len(list))
	for i, s := range list {
		at := fmt.Sprintf("%s[%d]", v.path, i)
		pf, spec, hasRange := strings.Cut(s, "#")
		set := VFSet{PF: pf}
		if pciAddr {
			set.PF = strings.ToLower(pf)
			if !pci.ValidAddress(set.PF) {
				return nil, fmt.Errorf("%s: %q: %q is not a PCI address (rootDevices takes the PF's DDDD:BB:DD.F; interface names go in pfNames)", at, s, pf)
			}
		} else {
			if pci.ValidAddress(strings.ToLower(pf)) {
				return nil, fmt.Errorf("%s: %q is a PCI address: put it in rootDevices; pfNames takes the PF's netdev name", at, s)
			}
			if err := ifname.Check(pf); err != nil {
				return nil, fmt.Errorf("%s: %q: %w", at, s, err)
			}
		}
		if hasRange {
			if set.Ranges, err = ranges(spec); err != nil {
				return nil, fmt.Errorf("%s: %q: %w", at, s, err)
			}
		}
		out = append(out, set)
	}
	return out, nil
}

// maxVFIndex is above any PF's sriov_totalvfs.
const maxVFIndex = 4095

func ranges(spec string) ([][2]int, error) {
	if spec == "" {
		return nil, errors.New("empty VF range after '#': want e.g. 0-11 or 0,2-7")
	}
	var out [][2]int
	for _, part := range strings.Split(spec, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := vfIndex(lo, part)
		if err != nil {
			return nil, err
		}
		b := a
		if isRange {
			if b, err = vfIndex(hi, part); err != nil {
				return nil, err
			}
			if b < a {
				return nil, fmt.Errorf("VF range %q is reversed (want low-high)", part)
			}
		}
		out = append(out, [2]int{a, b})
	}
	return out, nil
}

func vfIndex(s, part string) (int, error) {
	if s == "" || len(s) > 4 || strings.Trim(s, "0123456789") != "" {
		return 0, fmt.Errorf("VF range %q: %q is not a VF index (want a number 0-%d)", part, s, maxVFIndex)
	}
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	if n > maxVFIndex {
		return 0, fmt.Errorf("VF range %q: index %d is above %d", part, n, maxVFIndex)
	}
	return n, nil
}
