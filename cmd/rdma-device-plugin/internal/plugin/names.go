// Package plugin serves fastpath's RDMA pools to the kubelet over the device
// plugin API v1beta1: a Source scans the host and builds the pools
// (pkg/nic, pkg/pool), and the Manager diffs each scan against what it
// serves — one gRPC server per pool, registration, ListAndWatch, Allocate,
// GetPreferredAllocation, health from link events, periodic rescans,
// config reloads and kubelet restarts. Besides the Source, the only sysfs
// the package reads is whether an allocated VF's PCI function still
// exists (health).
package plugin

import "strings"

// SocketName is the pool's socket file in the kubelet's device plugin
// directory: "<prefix>_<name>.sock". A resource prefix is a DNS subdomain
// (pkg/pool checks it), which has no "_", so the first "_" separates
// prefix from name and two pools with different prefixes or names never
// share a socket.
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
