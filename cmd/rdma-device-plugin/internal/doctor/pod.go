package doctor

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// pod is what a pod's container sees, through /proc/PID.
type pod struct {
	env map[string]string
	// hcas are the RDMA devices whose uverbs node the container has and
	// can open (a char device with sysfs's major:minor), sorted.
	hcas []string
	// netdevs are the interfaces of its network namespace; vfs maps those
	// backed by a PCI function to its address.
	netdevs []string
	vfs     map[string]string
	// info is what the device plugin put in PCIDEVICE_*_INFO.
	info map[string]plugin.DeviceInfo
}

func readEnviron(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range bytes.Split(b, []byte{0}) {
		if k, v, ok := strings.Cut(string(kv), "="); ok && k != "" {
			env[k] = v
		}
	}
	return env, nil
}

// netDevNames lists the interfaces of /proc/PID/net/dev: the process's
// network namespace, readable without entering it.
func netDevNames(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, _, ok := strings.Cut(sc.Text(), ":"); ok && !strings.Contains(name, "|") {
			out = append(out, strings.TrimSpace(name))
		}
	}
	return out, sc.Err()
}

func (h *host) checkPod() {
	const name = "pod"
	pid := strconv.Itoa(h.opts.PodPID)
	proc := filepath.Join(h.opts.ProcRoot, pid)
	subject := "pid " + pid
	var p pod
	var err error
	p.env, err = readEnviron(filepath.Join(proc, "environ"))
	if h.denied(name, subject, err) {
		return
	}
	if err != nil {
		h.addf(name, Fail, subject, "run doctor on the node as root with the container's PID: crictl inspect --output go-template --template '{{.info.pid}}' <container>; the plugin's pod has no hostPID",
			"cannot read the container's environment: %v", err)
		return
	}
	h.podDevices(&p, proc, subject)
	if p.netdevs, err = netDevNames(filepath.Join(proc, "net", "dev")); err != nil {
		h.addf(name, Skip, subject, "", "cannot list the pod's interfaces: %v", err)
	}
	p.vfs = map[string]string{}
	for _, n := range p.netdevs {
		if l, err := os.Readlink(filepath.Join(proc, "root", "sys", "class", "net", n, "device")); err == nil {
			p.vfs[n] = filepath.Base(l)
		}
	}
	p.info = map[string]plugin.DeviceInfo{}
	for k, v := range p.env {
		if strings.HasPrefix(k, "PCIDEVICE_") && strings.HasSuffix(k, "_INFO") {
			var m map[string]plugin.DeviceInfo
			if json.Unmarshal([]byte(v), &m) == nil {
				for a, i := range m {
					p.info[a] = i
				}
			}
		}
	}
	h.podEnv(&p, subject)
	h.podNetdevs(&p, subject)
}

// podDevices finds the RDMA devices the container can open.
func (h *host) podDevices(p *pod, proc, subject string) {
	const name = "pod"
	devDir := filepath.Join(proc, "root", rdma.DevDir)
	ents, err := os.ReadDir(devDir)
	if h.denied(name, subject, err) {
		return
	}
	if err != nil && !os.IsNotExist(err) {
		h.addf(name, Fail, subject, "run doctor as root on the node", "cannot list the container's %s: %v", rdma.DevDir, err)
		return
	}
	byName := map[string]classDev{}
	for _, devs := range h.classDevs() {
		for _, c := range devs {
			byName[c.name] = c
		}
	}
	var broken []string
	hasCM := false
	for _, e := range ents {
		n := e.Name()
		if n == "rdma_cm" {
			hasCM = true
			continue
		}
		c, ok := byName[n]
		if !ok || !strings.HasPrefix(n, rdma.KindUverbs) {
			continue
		}
		if kind, detail := nodeProblem(devDir, n, c.devno); kind != "" {
			broken = append(broken, detail+" ("+kind+")")
			continue
		}
		p.hcas = append(p.hcas, c.ibdev)
	}
	slices.Sort(p.hcas)
	if len(broken) > 0 {
		h.addf(name, Fail, subject, "recreate the pod (its devices were set up before the node's RDMA devices changed)",
			"the container's %s cannot open %s", rdma.DevDir, strings.Join(broken, ", "))
	}
	if len(p.hcas) == 0 {
		h.addf(name, Fail, subject, "request the pool in resources.limits (e.g. mellanox.com/mlnx_sriov_rdma: 1); a privileged container does not get device-plugin devices added either",
			"the container has no usable %s/uverbs* device: NCCL finds no IB device (\"NET/IB : No device found\") and uses NET/Socket", rdma.DevDir)
		return
	}
	msg := fmt.Sprintf("the container can open %s", strings.Join(p.hcas, ", "))
	if !hasCM {
		h.addf(name, Warn, subject, "recreate the pod once rdma_ucm is loaded on the node", "%s but has no %s: RDMA CM users (UCX, MPI) fail", msg, rdma.RDMACMPath)
		return
	}
	h.add(name, OK, subject, msg+" and rdma_cm", "")
}

// podEnv checks the variables that steer NCCL and UCX.
func (h *host) podEnv(p *pod, subject string) {
	const name = "nccl-env"
	env := p.env
	if v, ok := env["NCCL_IB_DISABLE"]; ok && ncclEnvTrue(v) {
		h.addf(name, Fail, subject, "remove NCCL_IB_DISABLE from the pod spec (or the image's /etc/nccl.conf)", "NCCL_IB_DISABLE=%s: NCCL never tries IB and uses NET/Socket", v)
	}
	if v := env["NCCL_NET"]; v != "" {
		switch {
		case strings.EqualFold(v, "Socket"):
			h.addf(name, Fail, subject, "remove NCCL_NET from the pod spec", "NCCL_NET=%s forces the socket transport", v)
		case !strings.EqualFold(v, "IB"):
			h.addf(name, Warn, subject, "unset NCCL_NET unless the image ships that plugin (libnccl-net*.so)", "NCCL_NET=%s: NCCL fails unless a network plugin of that name loads", v)
		}
	}
	h.podHCA(p, subject)
	if v, ok := env["UCX_NET_DEVICES"]; ok && v != "all" {
		var unknown []string
		for _, e := range strings.Split(v, ",") {
			dev, _, isRDMA := strings.Cut(e, ":")
			if isRDMA && !slices.Contains(p.hcas, dev) {
				unknown = append(unknown, e)
			}
		}
		if len(unknown) > 0 {
			h.addf(name, Warn, subject, "remove UCX_NET_DEVICES from the pod spec: the device plugin sets it to the pod's own devices",
				"UCX_NET_DEVICES=%s names %s, which the container cannot open (it has %s)", v, strings.Join(unknown, ", "), strings.Join(p.hcas, ", "))
		}
	}
	if v, ok := env["NCCL_SOCKET_IFNAME"]; ok && len(p.netdevs) > 0 {
		l := parseIfList(v)
		var chosen []string
		for _, n := range p.netdevs {
			if l.selects(n, -1) {
				chosen = append(chosen, n)
			}
		}
		if len(chosen) == 0 {
			h.addf(name, Fail, subject, "set it to an interface the pod has, or unset it",
				"NCCL_SOCKET_IFNAME=%s matches none of the pod's interfaces (%s): NCCL cannot bootstrap, and NET/IB needs one too for its out-of-band connection (\"NET/IB : No IP interface found.\")",
				v, strings.Join(p.netdevs, ", "))
		}
	}
	if v, ok := env["NCCL_IB_GID_INDEX"]; ok && len(p.hcas) > 0 {
		h.podGIDIndex(p, v, subject)
	}
}

// podHCA checks NCCL_IB_HCA against the RDMA devices the container can
// open. The kubelet keeps a pod spec's own value over the device
// plugin's, so a hand-written NCCL_IB_HCA from another node wins.
func (h *host) podHCA(p *pod, subject string) {
	const name = "nccl-env"
	v, ok := p.env["NCCL_IB_HCA"]
	if !ok || len(p.hcas) == 0 {
		return
	}
	l := parseIfList(v)
	var used, unused []string
	for _, d := range p.hcas {
		if l.selects(d, 1) {
			used = append(used, d)
		} else {
			unused = append(unused, d)
		}
	}
	want := h.pluginHCA(p)
	override := ""
	if want != "" && v != want {
		override = fmt.Sprintf(" It is not the device plugin's value (%s): the pod spec sets its own NCCL_IB_HCA, and the kubelet keeps the pod spec's value over the plugin's.", want)
	}
	fix := "remove NCCL_IB_HCA from the pod spec: the device plugin sets it to exactly the container's devices"
	if len(used) == 0 {
		h.addf(name, Fail, subject, fix, "NCCL_IB_HCA=%s selects none of the container's RDMA devices (%s): NCCL finds no device and uses NET/Socket.%s",
			v, strings.Join(p.hcas, ", "), override)
		return
	}
	var problems []string
	if !l.exclude {
		for _, e := range l.entries {
			matched := slices.ContainsFunc(p.hcas, func(d string) bool {
				return d == e.name || (!l.exact && strings.HasPrefix(d, e.name))
			})
			if !matched {
				problems = append(problems, fmt.Sprintf("%s is not in the container", e.name))
			} else if !l.exact && !slices.Contains(p.hcas, e.name) {
				problems = append(problems, fmt.Sprintf("%s is a prefix (no \"=\"), so it matches every device starting with it", e.name))
			}
		}
	}
	if len(unused) > 0 {
		problems = append(problems, fmt.Sprintf("it leaves out %s, which the pod was given", strings.Join(unused, ", ")))
	}
	if len(problems) > 0 {
		h.addf(name, Warn, subject, fix, "NCCL_IB_HCA=%s: %s; NCCL uses %s.%s", v, strings.Join(problems, "; "), strings.Join(used, ", "), override)
		return
	}
	h.addf(name, OK, subject, "", "NCCL_IB_HCA=%s selects exactly the container's RDMA devices", v)
}

// pluginHCA is the NCCL_IB_HCA the device plugin set for the pod's devices
// (from PCIDEVICE_*_INFO), "" when there is none.
func (h *host) pluginHCA(p *pod) string {
	var hcas []string
	for _, i := range p.info {
		if i.RDMADevice != "" {
			hcas = append(hcas, i.RDMADevice+":1")
		}
	}
	if len(hcas) == 0 {
		return ""
	}
	slices.SortFunc(hcas, func(a, b string) int {
		return strings.Compare(p.addrOf(a), p.addrOf(b))
	})
	return "=" + strings.Join(hcas, ",")
}

// addrOf is the PCI address of the device-info entry of "mlx5_12:1".
func (p *pod) addrOf(hca string) string {
	dev, _, _ := strings.Cut(hca, ":")
	for a, i := range p.info {
		if i.RDMADevice == dev {
			return a
		}
	}
	return ""
}

// podGIDIndex checks a pinned NCCL_IB_GID_INDEX against each RoCE device's
// GID table on the node.
func (h *host) podGIDIndex(p *pod, v, subject string) {
	const name = "nccl-env"
	idx, err := strconv.Atoi(v)
	if err != nil || idx < 0 {
		return
	}
	for _, d := range p.hcas {
		if ports := h.ports(d); len(ports) == 0 || ports[0].linkLayer != rdma.LinkLayerEthernet {
			continue
		}
		table := h.gidTable(d, 1)
		i := slices.IndexFunc(table, func(g gidEntry) bool { return g.index == idx })
		fix := "unset NCCL_IB_GID_INDEX: NCCL then picks the RoCE v2 IPv4 GID of each port itself, which stays right when addresses change"
		switch {
		case i < 0:
			h.addf(name, Fail, subject, fix, "NCCL_IB_GID_INDEX=%d, but GID %d of %s is empty (in the node's table)", idx, idx, d)
		case table[i].typ != "RoCE v2" || table[i].ip.To4() == nil:
			h.addf(name, Fail, subject, fix, "NCCL_IB_GID_INDEX=%d is %s %s on %s, not a RoCE v2 IPv4 GID: connections between nodes fail", idx, table[i].typ, table[i].ip, d)
		default:
			h.addf(name, Warn, subject, fix, "NCCL_IB_GID_INDEX=%d is pinned; it is right on %s today (RoCE v2 %s)", idx, d, table[i].ip)
		}
	}
}

// podNetdevs checks that each VF the container can use RDMA on has its
// netdev in the pod's network namespace (the CNI attached it).
func (h *host) podNetdevs(p *pod, subject string) {
	const name = "pod"
	if p.netdevs == nil {
		return
	}
	attached := map[string]string{} // PCI address -> pod interface
	for n, a := range p.vfs {
		attached[a] = n
	}
	for _, dev := range p.hcas {
		var fn string
		var linkType string
		for _, d := range h.snap.Devices {
			if d.RDMADevice == dev {
				fn, linkType = d.PCIAddress, d.LinkType
			}
		}
		for a, i := range p.info {
			if i.RDMADevice == dev {
				fn, linkType = a, i.LinkType
			}
		}
		if fn == "" {
			continue
		}
		if n, ok := attached[fn]; ok {
			h.addf(name, OK, subject, "", "%s (%s) is the pod's %s", dev, fn, n)
			continue
		}
		st, why := Warn, "NCCL's IB transport works without it, but IPoIB traffic and the CNI's addresses are missing"
		if linkType == rdma.LinkLayerEthernet {
			st, why = Fail, "on RoCE, NCCL needs the VF's IP address for a routable GID"
		}
		h.addf(name, st, subject, "add the annotation k8s.v1.cni.cncf.io/networks: <the sriov NetworkAttachmentDefinition> to the pod",
			"%s's VF %s has no netdev in the pod's network namespace (interfaces: %s): the CNI did not attach it. %s",
			dev, fn, strings.Join(p.netdevs, ", "), why)
	}
}
