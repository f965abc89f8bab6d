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
	// DefaultSharedPrefix is the resource prefix of a configList entry
	// without resourcePrefix, as in k8s-rdma-shared-dev-plugin:
	// "rdma/hca_shared_devices_a".
	DefaultSharedPrefix = "rdma"
	// DefaultExclusivePrefix is the resource prefix of a resourceList entry
	// without resourcePrefix, unless WithResourcePrefix gives another (as
	// sriov-network-device-plugin's --resource-prefix does; its own default,
	// intel.com, names no Mellanox/NVIDIA resource anyone asks for).
	DefaultExclusivePrefix        = "mellanox.com"
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
	// NCCLEnv says whether Allocate sets NCCL_IB_HCA and UCX_NET_DEVICES
	// for the pool's devices. At most one pool of a config does (see
	// Parse), so that a container holding devices of several pools never
	// gets two values for them.
	NCCLEnv bool
	// DeviceType is the resourceList deviceType ("netDevice" or
	// "accelerator"); "" for shared pools.
	DeviceType string
	// ServedBy is ServedByDevicePlugin or ServedByDRA (exclusive pools
	// only).
	ServedBy string
	// Selectors select the pool's functions: a function belongs to the
	// pool when any selector matches it.
	Selectors []Selector
	// Source is where the resource was defined ("resourceList[0]").
	Source string
}

// ResourceName is the extended resource, "mellanox.com/mlnx_sriov_rdma".
func (r *Resource) ResourceName() string { return r.Prefix + "/" + r.Name }

// ErrNoConfig is returned by Load when the file does not exist.
var ErrNoConfig = errors.New("pool config file does not exist")

// Option changes how a config is read.
type Option func(*options)

type options struct {
	exclusivePrefix string
}

// WithResourcePrefix sets the resource prefix of resourceList entries
// that give none (DefaultExclusivePrefix without it): what
// sriov-network-device-plugin's --resource-prefix does. configList
// entries keep DefaultSharedPrefix, as in k8s-rdma-shared-dev-plugin,
// which has no such flag.
func WithResourcePrefix(prefix string) Option {
	return func(o *options) { o.exclusivePrefix = prefix }
}

// CheckPrefix reports whether prefix can start an extended resource name
// (a DNS subdomain outside kubernetes.io).
func CheckPrefix(prefix string) error {
	if !dnsSubdomain.MatchString(prefix) || len(prefix) > 253 {
		return fmt.Errorf("resource prefix %q is not a DNS subdomain: want lower-case letters, digits, '-' and '.', like mellanox.com", prefix)
	}
	if prefix == "kubernetes.io" || strings.HasSuffix(prefix, ".kubernetes.io") {
		return fmt.Errorf("resource prefix %q: the kubernetes.io domain is reserved; extended resources need another prefix", prefix)
	}
	return nil
}

// Load reads and parses a pool config file.
func Load(path string, opts ...Option) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (pass --config with a configList/resourceList file, e.g. config.json of deployments/10-configmap.yaml)", ErrNoConfig, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read pool config: %w", err)
	}
	cfg, err := Parse(data, opts...)
	if err != nil {
		return nil, fmt.Errorf("pool config %s: %w", path, err)
	}
	return cfg, nil
}

var (
	topKeys = []string{"periodicUpdateInterval", "configList", "resourceList"}

	sharedKeys = []string{"resourceName", "resourcePrefix", "rdmaHcaMax", "selectors", "devices", "excludeTopology", "ncclEnv"}
	sharedSel  = []string{"vendors", "deviceIDs", "drivers", "ifNames", "linkTypes"}

	exclusiveKeys = []string{"resourceName", "resourcePrefix", "deviceType", "excludeTopology", "selectors", "allocationPolicy", "ncclEnv", "servedBy"}
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
		"servedby":         "servedBy applies to resourceList (exclusive) pools: DRA hands out whole VFs; shared HCAs are served by the device plugin",
	}
)

// Parse parses a pool config.
//
// The pool that sets NCCL_IB_HCA and UCX_NET_DEVICES (Resource.NCCLEnv)
// is the one whose entry says "ncclEnv": true; when none does, the first
// resourceList entry, or with no resourceList the first configList entry,
// unless that entry says "ncclEnv": false. Two entries saying true is an
// error: the kubelet keeps one of two values a container is given for a
// variable, whichever resource it merges first.
func Parse(data []byte, opts ...Option) (*Config, error) {
	o := options{exclusivePrefix: DefaultExclusivePrefix}
	for _, opt := range opts {
		opt(&o)
	}
	if err := CheckPrefix(o.exclusivePrefix); err != nil {
		return nil, fmt.Errorf("default for resourceList entries: %w", err)
	}
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
	var nccl []*bool // each resource's "ncclEnv", nil when not given
	if v := f["configList"]; v != nil {
		list, err := v.list()
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			r, env, err := parseShared(e, cfg)
			if err != nil {
				return nil, err
			}
			cfg.Resources = append(cfg.Resources, r)
			nccl = append(nccl, env)
		}
	}
	if v := f["resourceList"]; v != nil {
		list, err := v.list()
		if err != nil {
			return nil, err
		}
		for _, e := range list {
			r, env, err := parseExclusive(e, cfg, o.exclusivePrefix)
			if err != nil {
				return nil, err
			}
			cfg.Resources = append(cfg.Resources, r)
			nccl = append(nccl, env)
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
	if err := pickNCCLEnv(cfg, nccl); err != nil {
		return nil, err
	}
	return cfg, nil
}

// pickNCCLEnv sets Resource.NCCLEnv by the rule in Parse's comment and
// warns about each exclusive pool left without it.
func pickNCCLEnv(cfg *Config, given []*bool) error {
	pick := -1
	for i, v := range given {
		if v == nil || !*v {
			continue
		}
		if pick >= 0 {
			return fmt.Errorf("%s and %s both say \"ncclEnv\": true: only one pool may set NCCL_IB_HCA and UCX_NET_DEVICES (a container holding both would get one of the two values, whichever the kubelet merges first)",
				cfg.Resources[pick].Source, cfg.Resources[i].Source)
		}
		pick = i
	}
	if pick < 0 {
		first := 0 // configList entries come first: the first resourceList entry, or the first entry
		for i := range cfg.Resources {
			if cfg.Resources[i].Kind == Exclusive {
				first = i
				break
			}
		}
		if given[first] == nil {
			pick = first
		}
	}
	if pick >= 0 {
		cfg.Resources[pick].NCCLEnv = true
	}
	for i := range cfg.Resources {
		r := &cfg.Resources[i]
		if r.Kind != Exclusive || r.NCCLEnv || given[i] != nil {
			continue
		}
		holder := "no pool"
		if pick >= 0 {
			holder = cfg.Resources[pick].Source + " (" + cfg.Resources[pick].ResourceName() + ")"
		}
		cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s (%s) does not set NCCL_IB_HCA and UCX_NET_DEVICES: one pool per node does, %s; \"ncclEnv\": true on an entry picks it, \"ncclEnv\": false here silences this",
			r.Source, r.ResourceName(), holder))
	}
	return nil
}

// names reads resourceName and resourcePrefix and checks them.
func names(e *value, f map[string]*value, r *Resource, defaultPrefix string) error {
	v := f["resourceName"]
	if v == nil {
		return fmt.Errorf("%s: resourceName is required", e.name())
	}
	name, err := v.str()
	if err != nil {
		return err
	}
	r.Prefix = defaultPrefix
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
	if err := CheckPrefix(r.Prefix); err != nil {
		return fmt.Errorf("%s: %w", e.name(), err)
	}
	return nil
}

// Kubernetes' rules for the two halves of an extended resource name.
var (
	qualifiedName = regexp.MustCompile(`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`)
	dnsSubdomain  = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$`)
)

// parseShared parses a configList entry; the *bool is its "ncclEnv", nil
// when not given.
func parseShared(e *value, cfg *Config) (Resource, *bool, error) {
	r := Resource{Kind: Shared, Source: e.name(), ServedBy: ServedByDevicePlugin}
	o, err := e.object()
	if err != nil {
		return r, nil, err
	}
	f, err := o.fields(e.path, sharedKeys, sharedUnsupportedKeys)
	if err != nil {
		return r, nil, err
	}
	nccl, err := optTriBool(f["ncclEnv"])
	if err != nil {
		return r, nil, err
	}
	r, err = parseSharedFields(e, f, r, cfg)
	return r, nccl, err
}

func parseSharedFields(e *value, f map[string]*value, r Resource, cfg *Config) (Resource, error) {
	if err := names(e, f, &r, DefaultSharedPrefix); err != nil {
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

// parseExclusive parses a resourceList entry; the *bool is its
// "ncclEnv", nil when not given.
func parseExclusive(e *value, cfg *Config, prefix string) (Resource, *bool, error) {
	r := Resource{Kind: Exclusive, Source: e.name(), DeviceType: "netDevice", ServedBy: ServedByDevicePlugin}
	o, err := e.object()
	if err != nil {
		return r, nil, err
	}
	f, err := o.fields(e.path, exclusiveKeys, unsupportedExclusive)
	if err != nil {
		return r, nil, err
	}
	nccl, err := optTriBool(f["ncclEnv"])
	if err != nil {
		return r, nil, err
	}
	r, err = parseExclusiveFields(e, f, r, cfg, prefix)
	return r, nccl, err
}

func parseExclusiveFields(e *value, f map[string]*value, r Resource, cfg *Config, prefix string) (Resource, error) {
	var err error
	if err := names(e, f, &r, prefix); err != nil {
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
	if err := servedBy(f["servedBy"], &r); err != nil {
		return r, err
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

// optTriBool is nil for a key not given.
func optTriBool(v *value) (*bool, error) {
	if v == nil {
		return nil, nil
	}
	b, err := v.boolean()
	if err != nil {
		return nil, err
	}
	return &b, nil
}

func optBool(v *value) (bool, error) {
	if v == nil {
		return false, nil
	}
	return v.boolean()
}
