package doctor

import (
	"strconv"
	"strings"
)

// ifList is an NCCL device list as NCCL_IB_HCA and NCCL_SOCKET_IFNAME take
// it: an optional leading "^" (exclude), then an optional "=" (exact
// names, not prefixes), then comma-separated entries, each "name" or (for
// HCAs) "name:port". NCCL parses it in parseStringList/matchIfList.
type ifList struct {
	exclude, exact bool
	entries        []ifEntry
}

type ifEntry struct {
	name string
	port int // -1: any port
}

func parseIfList(s string) ifList {
	var l ifList
	if rest, ok := strings.CutPrefix(s, "^"); ok {
		l.exclude, s = true, rest
	}
	if rest, ok := strings.CutPrefix(s, "="); ok {
		l.exact, s = true, rest
	}
	for _, e := range strings.Split(s, ",") {
		name, portStr, hasPort := strings.Cut(e, ":")
		if name == "" {
			continue
		}
		port := -1
		if hasPort {
			// NCCL reads the port with atoi, which stops at the first
			// non-digit (rail and plane fields follow in newer versions).
			digits := strings.TrimLeft(portStr, "0123456789")
			port, _ = strconv.Atoi(portStr[:len(portStr)-len(digits)])
		}
		l.entries = append(l.entries, ifEntry{name: name, port: port})
	}
	return l
}

// matchEntry reports which entry matches (name, port), or -1.
func (l ifList) matchEntry(name string, port int) int {
	for i, e := range l.entries {
		nameOK := name == e.name || (!l.exact && strings.HasPrefix(name, e.name))
		if nameOK && (e.port == -1 || port == -1 || e.port == port) {
			return i
		}
	}
	return -1
}

// selects reports whether NCCL uses (name, port) under this list; an empty
// list selects everything.
func (l ifList) selects(name string, port int) bool {
	if len(l.entries) == 0 {
		return true
	}
	return (l.matchEntry(name, port) >= 0) != l.exclude
}

// ncclEnvTrue is how NCCL reads a boolean parameter: an integer, non-zero
// is on.
func ncclEnvTrue(v string) bool {
	n, err := strconv.ParseInt(strings.TrimSpace(v), 0, 64)
	return err == nil && n != 0
}

// socketDefault is NCCL's choice of socket interfaces with
// NCCL_SOCKET_IFNAME unset: anything but loopback and docker*, ib*
// preferred.
func socketDefault(ifs []string) []string {
	var ib, other []string
	for _, n := range ifs {
		switch {
		case n == "lo" || strings.HasPrefix(n, "docker"):
		case strings.HasPrefix(n, "ib"):
			ib = append(ib, n)
		default:
			other = append(other, n)
		}
	}
	if len(ib) > 0 {
		return ib
	}
	return other
}
