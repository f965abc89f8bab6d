package doctor

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpath-k8s/fastpath/internal/words"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// port is an RDMA port as sysfs shows it.
type port struct {
	dev       string
	num       int
	linkLayer string
	state     string // "ACTIVE", after the "4: "
	phys      string // "LinkUp"
	smLID     string // "0x1"
}

// stateName turns "4: ACTIVE" into "ACTIVE".
func stateName(s string) string {
	if _, after, ok := strings.Cut(s, ":"); ok {
		return strings.TrimSpace(after)
	}
	return s
}

// ports reads the ports of an RDMA device.
func (h *host) ports(dev string) []port {
	ents, err := os.ReadDir(h.sys("class", "infiniband", dev, "ports"))
	if err != nil {
		return nil
	}
	var out []port
	for _, e := range ents {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		at := func(f string) string {
			v, _ := read(h.sys("class", "infiniband", dev, "ports", e.Name(), f))
			return v
		}
		out = append(out, port{dev: dev, num: n, linkLayer: at("link_layer"), state: stateName(at("state")),
			phys: stateName(at("phys_state")), smLID: at("sm_lid")})
	}
	return out
}

// problem says what keeps NCCL off a port ("" when nothing) and the fix
// (mlxlink on ConnectX, ethtool elsewhere).
// NCCL uses only ACTIVE ports of link layer InfiniBand or Ethernet.
func (p port) problem(netdev string, connectX bool) (msg, fix string) {
	noSM := p.linkLayer == rdma.LinkLayerInfiniBand && (p.smLID == "0x0" || p.smLID == "0")
	switch {
	case p.phys != "" && p.phys != "LinkUp":
		why := map[string]string{
			"Polling":                   "no link partner (cable, transceiver or switch port down)",
			"Disabled":                  "the port is disabled (by an admin, mlxlink, or the switch)",
			"Sleep":                     "the port is asleep (powered down)",
			"PortConfigurationTraining": "the link is training right now",
			"LinkErrorRecovery":         "the link is recovering from errors (flapping)",
		}[p.phys]
		if why == "" {
			why = "the physical link is not up"
		}
		if !connectX && p.phys == "Disabled" {
			why = "the port is disabled (by an admin or the switch)" // mlxlink is ConnectX's
		}
		fix := "check the cable and the switch port; mlxlink -d <pci> shows the link"
		if !connectX {
			fix = "check the cable and the switch port; ethtool " + cmp.Or(netdev, "<netdev>") + " shows the link"
		}
		if p.phys == "Disabled" && netdev != "" && p.linkLayer == rdma.LinkLayerEthernet {
			fix = "ip link set " + netdev + " up; if it stays down, check the switch port"
		}
		return fmt.Sprintf("state %s, phys_state %s: %s; NCCL skips a port that is not ACTIVE", p.state, p.phys, why), fix
	case noSM && p.state != "ACTIVE":
		return fmt.Sprintf("state %s with the link up and sm_lid 0x0: no subnet manager has configured the port (none runs on this fabric, or it cannot reach this port)", p.state),
			"run a subnet manager on the fabric (the switch's SM, UFM, or opensm on one node: systemctl start opensm); sminfo shows whether one answers"
	case noSM:
		return "sm_lid 0x0: no subnet manager known to the port", "check the fabric's subnet manager (sminfo)"
	case p.state != "" && p.state != "ACTIVE":
		fix := "wait for the port to come up; check the switch and dmesg"
		if p.linkLayer == rdma.LinkLayerEthernet && netdev != "" {
			fix = "ip link set " + netdev + " up"
		}
		return fmt.Sprintf("state %s (phys_state %s): NCCL skips ports that are not ACTIVE", p.state, p.phys), fix
	}
	return "", ""
}

func (h *host) checkPorts() {
	const name = "port"
	// PFs first: a PF whose port is down takes its VFs' ports with it,
	// and is reported once for all of them.
	type subject struct {
		d   nic.Device
		vfs int // pool VFs behind this PF
	}
	var subjects []subject
	index := map[string]int{}
	addSubject := func(d nic.Device) int {
		if i, ok := index[d.RDMADevice]; ok {
			return i
		}
		index[d.RDMADevice] = len(subjects)
		subjects = append(subjects, subject{d: d})
		return len(subjects) - 1
	}
	for _, d := range h.targets {
		if d.RDMADevice == "" {
			continue
		}
		if d.IsVF() {
			if pf, ok := h.snap.Device(d.PFAddress); ok && pf.RDMADevice != "" {
				subjects[addSubject(*pf)].vfs++
			}
		}
	}
	for _, d := range h.targets {
		if d.RDMADevice != "" {
			addSubject(d)
		}
	}
	badPF := map[string]string{} // PF address -> its problem
	// A VF's port down while its PF's is up is said once for the VFs of
	// that PF with the same problem, not once a VF.
	type vfGroup struct {
		pf, msg, fix string
		first        nic.Device // whose address and netdev fix names
		subjects     []string
	}
	var vfGroups []*vfGroup
	n, ib := 0, 0
	for _, s := range subjects {
		for _, p := range h.ports(s.d.RDMADevice) {
			n++
			if p.linkLayer == rdma.LinkLayerInfiniBand {
				ib++
			}
			msg, fix := p.problem(s.d.Netdev, isConnectX(&s.d))
			if msg == "" {
				continue
			}
			if s.d.IsVF() && badPF[s.d.PFAddress] != "" {
				continue // said on its PF
			}
			subj := fmt.Sprintf("%s port %d (%s %s)", p.dev, p.num, s.d.PCIAddress, orDash(s.d.Netdev))
			if s.d.IsVF() {
				k := slices.IndexFunc(vfGroups, func(g *vfGroup) bool { return g.pf == s.d.PFAddress && g.msg == msg })
				if k < 0 {
					k = len(vfGroups)
					vfGroups = append(vfGroups, &vfGroup{pf: s.d.PFAddress, msg: msg, fix: strings.ReplaceAll(fix, "<pci>", s.d.PCIAddress), first: s.d})
				}
				vfGroups[k].subjects = append(vfGroups[k].subjects, subj)
				continue
			}
			badPF[s.d.PCIAddress] = msg
			fix = strings.ReplaceAll(fix, "<pci>", s.d.PCIAddress)
			if s.vfs > 0 {
				msg += fmt.Sprintf(", and the %s of the pools behind it are down with it", plural(s.vfs, "VF", "VFs"))
			}
			h.add(name, Fail, subj, msg, fix)
		}
	}
	for _, g := range vfGroups {
		if len(g.subjects) == 1 {
			h.add(name, Fail, g.subjects[0], g.msg, g.fix)
			continue
		}
		fix := strings.ReplaceAll(g.fix, g.first.PCIAddress, "<each>")
		if g.first.Netdev != "" {
			fix = strings.ReplaceAll(fix, g.first.Netdev, "<each>")
		}
		h.add(name, Fail, words.List(g.subjects, 4), fmt.Sprintf("%d VFs of %s, whose own port is up: %s", len(g.subjects), g.pf, g.msg), fix)
	}
	if n > 0 && !h.failed(name) {
		sm := ""
		if ib > 0 {
			sm = "; the InfiniBand ones have a subnet manager"
		}
		h.addf(name, OK, "", "", "%s ACTIVE and LinkUp%s", plural(n, "port", "ports"), sm)
	}
}

// failed reports whether a check of that name has failed so far.
func (h *host) failed(name string) bool {
	return slices.ContainsFunc(h.checks, func(c Check) bool { return c.Name == name && c.Status == Fail })
}

// gidEntry is one slot of a port's GID table.
type gidEntry struct {
	index  int
	ip     net.IP
	typ    string // "IB/RoCE v1", "RoCE v2"; "" for an empty slot
	netdev string
}

// gidTable reads a port's GID table; empty slots (zero GID, no type) are
// left out.
func (h *host) gidTable(dev string, port int) []gidEntry {
	dir := h.sys("class", "infiniband", dev, "ports", strconv.Itoa(port))
	ents, err := os.ReadDir(dir + "/gids")
	if err != nil {
		return nil
	}
	var out []gidEntry
	for _, e := range ents {
		i, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		g, _ := read(dir + "/gids/" + e.Name())
		ip := parseGID(g)
		typ, err := read(dir + "/gid_attrs/types/" + e.Name())
		if ip == nil || ip.IsUnspecified() || err != nil {
			continue // the kernel answers EINVAL for an empty slot's attributes
		}
		nd, _ := read(dir + "/gid_attrs/ndevs/" + e.Name())
		out = append(out, gidEntry{index: i, ip: ip, typ: typ, netdev: nd})
	}
	slices.SortFunc(out, func(a, b gidEntry) int { return a.index - b.index })
	return out
}

// parseGID parses a GID as sysfs writes it (%pI6: eight groups of four
// hex digits); nil when malformed.
func parseGID(s string) net.IP {
	parts := strings.Split(s, ":")
	if len(parts) != 8 {
		return nil
	}
	ip := make(net.IP, 16)
	for i, p := range parts {
		v, err := strconv.ParseUint(p, 16, 16)
		if len(p) != 4 || err != nil {
			return nil
		}
		ip[2*i], ip[2*i+1] = byte(v>>8), byte(v)
	}
	return ip
}

// ErrNoLink is what a Kernel returns for a netdev that is not in its
// network namespace.
var ErrNoLink = errors.New("no such network interface in this network namespace")

// checkRoCEGIDs: NCCL (NCCL_IB_GID_INDEX unset) picks, per RoCE port, the
// RoCE v2 GID of an IPv4 address (NCCL_IB_ADDR_FAMILY, NCCL_IB_ROCE_VERSION_NUM
// defaults); without one it falls back to a link-local GID that does not
// route between nodes.
func (h *host) checkRoCEGIDs() {
	const name = "roce-gid"
	checked, elsewhere := 0, 0
	// Missing GIDs are said once a PF (its own and its VFs' netdevs):
	// one cause (RoCE v2 off, addresses on a bond above them) misses
	// them on every VF alike.
	type missing struct{ subject, netdev, addr string }
	byPF := map[string][]missing{}
	var pfs, unread []string
	var readErr error
	for _, d := range h.targets {
		if d.LinkType != rdma.LinkLayerEthernet || d.RDMADevice == "" || d.Netdev == "" {
			continue
		}
		table := h.gidTable(d.RDMADevice, 1)
		addrs := map[string]bool{}
		for _, g := range table {
			if v4 := g.ip.To4(); v4 != nil && g.netdev == d.Netdev {
				addrs[v4.String()] = true
			}
		}
		if h.opts.Kernel != nil {
			got, err := h.opts.Kernel.IPv4Addrs(d.Netdev)
			switch {
			case errors.Is(err, ErrNoLink):
				elsewhere++
			case err != nil:
				unread, readErr = append(unread, d.Netdev), err
			}
			for _, a := range got {
				addrs[a] = true
			}
		}
		checked++
		sorted := slices.Sorted(maps.Keys(addrs))
		for _, a := range sorted {
			ip := net.ParseIP(a)
			if slices.ContainsFunc(table, func(g gidEntry) bool { return g.typ == "RoCE v2" && g.netdev == d.Netdev && g.ip.Equal(ip) }) {
				continue
			}
			pf := cmp.Or(d.PFAddress, d.PCIAddress)
			if byPF[pf] == nil {
				pfs = append(pfs, pf)
			}
			byPF[pf] = append(byPF[pf], missing{fmt.Sprintf("%s port 1 (%s)", d.RDMADevice, d.Netdev), d.Netdev, a})
		}
	}
	const fix = "the kernel adds the GIDs of an address configured on the netdev itself (not on a bond or bridge above it): re-add it (ip addr del/add), and check that RoCE v2 is enabled (cma_roce_mode); do not pin NCCL_IB_GID_INDEX"
	const effect = "NCCL falls back to a GID that does not route between nodes, and connections time out (ibv_modify_qp failed with 110)"
	for _, pf := range pfs {
		m := byPF[pf]
		if len(m) == 1 {
			h.addf(name, Fail, m[0].subject, fix, "%s has %s but its port has no RoCE v2 GID for it: %s", m[0].netdev, m[0].addr, effect)
			continue
		}
		var subjects, have []string
		for _, x := range m {
			if !slices.Contains(subjects, x.subject) {
				subjects = append(subjects, x.subject)
			}
			have = append(have, x.netdev+" "+x.addr)
		}
		h.addf(name, Fail, words.List(subjects, 4), fix, "%d addresses on the netdevs of %s have no RoCE v2 GID on their ports (%s): %s", len(m), pf, words.List(have, 4), effect)
	}
	if len(unread) > 0 {
		whose := "their"
		if len(unread) == 1 {
			whose = "its"
		}
		h.addf(name, Skip, words.List(unread, 4), "", "cannot read %s addresses: %v", whose, readErr)
	}
	switch {
	case checked == 0:
	case h.opts.Kernel == nil:
		h.addf(name, Skip, "", "run doctor with --host-root / in the node's network namespace (the plugin's pod has hostNetwork)",
			"%s: only the addresses in their GID tables were checked; the running kernel was not asked for their addresses (--host-root is not this machine's /)",
			plural(checked, "RoCE netdev", "RoCE netdevs"))
	case !h.failed(name):
		msg := fmt.Sprintf("%s: every IPv4 address has its RoCE v2 GID", plural(checked-elsewhere, "RoCE netdev", "RoCE netdevs"))
		if elsewhere > 0 {
			msg += fmt.Sprintf(" (%d more are in pods' network namespaces)", elsewhere)
		}
		h.add(name, OK, "", msg, "")
	}
}
