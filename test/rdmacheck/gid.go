package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// gidEntry is one filled slot of an RDMA port's GID table, as sysfs shows
// it: ports/N/gids/I, gid_attrs/types/I, gid_attrs/ndevs/I.
type gidEntry struct {
	Index  int
	IP     net.IP
	Type   string // "IB/RoCE v1" or "RoCE v2"
	Netdev string
}

func (g gidEntry) String() string {
	return fmt.Sprintf("[%d] %s %s %s", g.Index, g.IP, g.Type, g.Netdev)
}

// readGIDs reads the filled slots of the GID table of the port whose sysfs
// directory is port (<sys>/class/infiniband/<dev>/ports/1). The kernel
// shows an empty slot as the zero GID and answers EINVAL for its
// attributes: such slots are left out.
func readGIDs(port string) ([]gidEntry, error) {
	ents, err := os.ReadDir(filepath.Join(port, "gids"))
	if err != nil {
		return nil, fmt.Errorf("GID table %s: %w", port, err)
	}
	var out []gidEntry
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(port, "gids", e.Name()))
		if err != nil {
			return nil, fmt.Errorf("GID table %s: %w", port, err)
		}
		ip := net.ParseIP(strings.TrimSpace(string(b)))
		if ip == nil || ip.IsUnspecified() {
			continue
		}
		typ, err := os.ReadFile(filepath.Join(port, "gid_attrs", "types", e.Name()))
		if err != nil {
			continue // emptied while read
		}
		nd, _ := os.ReadFile(filepath.Join(port, "gid_attrs", "ndevs", e.Name()))
		out = append(out, gidEntry{Index: i, IP: ip, Type: strings.TrimSpace(string(typ)), Netdev: strings.TrimSpace(string(nd))})
	}
	slices.SortFunc(out, func(a, b gidEntry) int { return a.Index - b.Index })
	return out, nil
}

// roceV2GID is the RoCE v2 GID the kernel derives from ip on netdev: the
// one NCCL picks for an IPv4 address (its IPv4-mapped form).
func roceV2GID(table []gidEntry, ip net.IP, netdev string) (gidEntry, bool) {
	for _, g := range table {
		if g.Type == "RoCE v2" && g.Netdev == netdev && g.IP.Equal(ip) {
			return g, true
		}
	}
	return gidEntry{}, false
}

// errNoGID is waitGID's answer when the GID never came.
var errNoGID = errors.New("no RoCE v2 GID")

// waitGID waits up to timeout for ip's RoCE v2 GID on netdev in the port's
// table (the kernel fills it from a work queue after the address is added)
// and returns it, or errNoGID with the table as it was last read.
func waitGID(port string, ip net.IP, netdev string, timeout time.Duration) (gidEntry, error) {
	deadline := time.Now().Add(timeout)
	for {
		table, err := readGIDs(port)
		if err != nil {
			return gidEntry{}, err
		}
		if g, ok := roceV2GID(table, ip, netdev); ok {
			return g, nil
		}
		if time.Now().After(deadline) {
			return gidEntry{}, fmt.Errorf("%w for %s on %s after %s; the table: %v", errNoGID, ip, netdev, timeout, table)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
