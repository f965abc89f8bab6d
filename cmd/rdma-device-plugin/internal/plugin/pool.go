// Package plugin serves fastpath's RDMA pools to the kubelet over the device
// plugin API v1beta1: one gRPC server per pool, registration, ListAndWatch,
// Allocate, GetPreferredAllocation, health from link events, periodic
// rescans and kubelet restarts. It consumes plain values (Pool, a list of
// nic.Device) produced by discovery; it never scans sysfs itself.
package plugin

import (
	"fmt"
	"strings"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// Kind says how a pool's devices are handed out.
type Kind string

// Pool kinds.
const (
	// Exclusive pools give each container whole VFs (one device per VF).
	Exclusive Kind = "exclusive"
	// Shared pools give every container all of the pool's HCAs, up to
	// RdmaHcaMax containers at a time.
	Shared Kind = "shared"
)

// Allocation policies for GetPreferredAllocation.
const (
	PolicyPack   = "pack"   // as few PFs as possible
	PolicySpread = "spread" // one VF per PF first (one per rail)
)

// Pool is one extended resource and the devices that back it.
type Pool struct {
	Prefix           string // "mellanox.com"
	Name             string // "mlnx_sriov_rdma"
	Kind             Kind
	RdmaHcaMax       int  // shared pools: how many containers may share the HCAs
	ExcludeTopology  bool // do not report NUMA TopologyInfo
	AllocationPolicy string
	// Devices are VFs for an exclusive pool, the HCAs (PFs) for a shared one.
	Devices []nic.Device
	// RDMACM is the node's rdma_cm (nic.Snapshot.RDMACM, a host path, ""
	// when the node has none): a container given one of the pool's RDMA
	// devices gets it too.
	RDMACM string
}

// ResourceName is the extended resource, "mellanox.com/mlnx_sriov_rdma".
func (p *Pool) ResourceName() string { return p.Prefix + "/" + p.Name }

// SocketName is the pool's socket file in the kubelet's device plugin
// directory: "<prefix>_<name>.sock". A resource prefix is a DNS subdomain,
// which has no "_", so the first "_" separates prefix from name and two
// pools with different prefixes or names never share a socket.
func SocketName(prefix, name string) string { return prefix + "_" + name + ".sock" }

// EnvName is the PCIDEVICE_<PREFIX>_<NAME> variable that lists a
// container's PCI addresses. Every byte outside [A-Za-z0-9] becomes "_" and
// letters are upper-cased, so the name is safe in any shell.
func EnvName(prefix, name string) string {
	return "PCIDEVICE_" + envPart(prefix) + "_" + envPart(name)
}

func envPart(s string) string {
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z':
			b.WriteByte(c - 'a' + 'A')
		case c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
			b.WriteByte(c)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}

// Validate checks what the serving side relies on.
func (p *Pool) Validate() error {
	if p.Prefix == "" || p.Name == "" {
		return fmt.Errorf("pool %q: resource prefix and name must be set", p.ResourceName())
	}
	if strings.ContainsAny(p.Prefix, "_/") {
		return fmt.Errorf("pool %s: resource prefix %q must be a DNS subdomain (no '_' or '/')", p.ResourceName(), p.Prefix)
	}
	if strings.ContainsAny(p.Name, "/") {
		return fmt.Errorf("pool %s: resource name %q must not contain '/'", p.ResourceName(), p.Name)
	}
	switch p.Kind {
	case Exclusive:
	case Shared:
		if p.RdmaHcaMax < 1 {
			return fmt.Errorf("pool %s: shared pool needs rdmaHcaMax >= 1, got %d", p.ResourceName(), p.RdmaHcaMax)
		}
	default:
		return fmt.Errorf("pool %s: unknown kind %q", p.ResourceName(), p.Kind)
	}
	switch p.AllocationPolicy {
	case "", PolicyPack, PolicySpread:
	default:
		return fmt.Errorf("pool %s: allocationPolicy %q: want %q or %q", p.ResourceName(), p.AllocationPolicy, PolicyPack, PolicySpread)
	}
	return nil
}
