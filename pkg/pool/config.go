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
	"io"
	"os"
	"slices"
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
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s (pass --config with a configList/resourceList file, e.g. config.json of deployments/10-configmap.yaml)", ErrNoConfig, path)
	}
	if err != nil {
		return nil, fmt.Errorf("read pool config: %w", err)
	}
	// Never more than the limit and a byte, whatever the file's size:
	// Parse refuses what is over.
	data, err := io.ReadAll(io.LimitReader(f, MaxConfigSize+1))
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("read pool config: %w", err)
	}
	cfg, err := Parse(data, opts...)
	if err != nil {
		return nil, fmt.Errorf("pool config %s: %w", path, err)
	}
	return cfg, nil
}

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
	if err := checkNames(cfg); err != nil {
		return nil, err
	}
	if err := pickNCCLEnv(cfg, nccl); err != nil {
		return nil, err
	}
	return cfg, nil
}

// VendorPrefixes are the resource prefixes docs/pool-config.md names: each
// format's default (rdma, mellanox.com), sriov-network-device-plugin's
// (intel.com) and the other vendors' pools' (broadcom.com). Another loads
// with a warning: a prefix is a namespace other device plugins share.
var VendorPrefixes = []string{"rdma", "mellanox.com", "intel.com", "broadcom.com"}

// gpuResources are the GPU device plugins' resource names (NVIDIA's,
// its MIG slices', AMD's, Intel's): a pool of that name would be counted
// against the same node capacity, and the kubelet takes one plugin's
// registration for the other's.
var gpuResources = []string{"nvidia.com/gpu", "nvidia.com/mig-", "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe"}

// checkNames refuses a pool named as a GPU resource and warns about a
// prefix outside VendorPrefixes.
func checkNames(cfg *Config) error {
	for _, r := range cfg.Resources {
		name := r.ResourceName()
		for _, g := range gpuResources {
			if name == g || strings.HasSuffix(g, "-") && strings.HasPrefix(name, g) {
				return fmt.Errorf("%s: resource %q is a GPU device plugin's resource name: the kubelet would take this pool's registration and the GPU plugin's for one another; name the pool otherwise (e.g. mellanox.com/%s)", r.Source, name, r.Name)
			}
		}
		if !slices.Contains(VendorPrefixes, r.Prefix) {
			cfg.Warnings = append(cfg.Warnings, fmt.Sprintf("%s (%s): resource prefix %q is none of %s: check that no other device plugin on the node (the GPU operator's nvidia.com/…, a vendor's own) serves a resource of this name, or the two collide",
				r.Source, name, r.Prefix, strings.Join(VendorPrefixes, ", ")))
		}
	}
	return nil
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
