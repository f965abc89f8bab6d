package doctor

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
)

// logCause maps an NCCL_DEBUG=INFO line to what it means. The patterns
// follow NCCL's own messages (src/transport/net_ib, misc/ibvwrap).
type logCause struct {
	re     *regexp.Regexp
	status Status
	// cause and fix may use $1… of re.
	cause, fix string
	// when, if set, decides from the submatches whether the line counts.
	when func(m []string) bool
}

const podFix = "run rdma-device-plugin doctor --pod <container PID> on the node: it shows the container's devices, NCCL_IB_HCA and the ports"

// ncclLogPatterns are compiled on first use, by doctor's nccl-log check:
// the daemon links this package but never reads an NCCL log, and its
// start should not pay for compiling them.
type ncclLogPatterns struct {
	causes                []logCause
	usingNet, ibUsing, so *regexp.Regexp
}

var ncclLog = sync.OnceValue(func() *ncclLogPatterns {
	return &ncclLogPatterns{causes: logCauses(),
		usingNet: regexp.MustCompile(`Using network (\S+)`),
		ibUsing:  regexp.MustCompile(`NET/IB ?: ?Using (.*?)(?:\s*\[RO\])?\s*(?:;|$)`),
		so:       regexp.MustCompile(`NET/Socket ?: ?Using (.*)`),
	}
})

func logCauses() []logCause {
	return []logCause{
		{re: regexp.MustCompile(`NCCL_IB_DISABLE set by environment to (\d+)`), status: Fail,
			cause: "NCCL_IB_DISABLE=$1 turned the IB transport off", fix: "remove NCCL_IB_DISABLE from the pod spec (or the image's /etc/nccl.conf)",
			when: func(m []string) bool { return ncclEnvTrue(m[1]) }},
		{re: regexp.MustCompile(`NCCL_NET set by environment to ([^\s.]+)`), status: Fail,
			cause: "NCCL_NET=$1 chose the socket transport", fix: "remove NCCL_NET from the pod spec",
			when: func(m []string) bool { return strings.EqualFold(m[1], "Socket") }},
		{re: regexp.MustCompile(`Failed to open libibverbs`), status: Fail,
			cause: "the container image has no libibverbs, so NCCL cannot use any RDMA device",
			fix:   "install rdma-core's user space in the image: libibverbs1 and ibverbs-providers (Debian, Ubuntu) or libibverbs (RHEL)"},
		{re: regexp.MustCompile(`NET/IB ?: ?Unable to open device (\S+)`), status: Fail,
			cause: "NCCL could not open $1: its /dev/infiniband/uverbs node is not in the container (NCCL_IB_HCA names a device the pod was not given?)",
			fix:   podFix},
		{re: regexp.MustCompile(`NET/IB ?: ?No IP interface found`), status: Fail,
			cause: "NET/IB found no IP interface for its out-of-band connection: NCCL_SOCKET_IFNAME matches none of the pod's interfaces",
			fix:   "set NCCL_SOCKET_IFNAME to an interface the pod has (or unset it)"},
		{re: regexp.MustCompile(`NET/IB ?: ?No device found`), status: Fail,
			cause: "NCCL found no ACTIVE port on an RDMA device it could open: no device in the container, NCCL_IB_HCA selecting none of them, or their ports down",
			fix:   podFix},
		{re: regexp.MustCompile(`ibv_modify_qp failed with (?:error )?(?:110|Connection timed out)`), status: Fail,
			cause: "a queue pair could not reach its peer: on RoCE, a GID that does not route (no RoCE v2 GID for the pod's address, or a pinned NCCL_IB_GID_INDEX) or a fabric that drops RoCE; on InfiniBand, no path from the subnet manager",
			fix:   "run rdma-device-plugin doctor on both nodes (roce-gid, port); leave NCCL_IB_GID_INDEX unset; test the path with ib_write_bw between the two pods"},
		{re: regexp.MustCompile(`ibv_modify_qp failed with (?:error )?(?:101|Network is unreachable)`), status: Fail,
			cause: "no route to the peer's GID: the pods' RoCE addresses are on networks that do not reach each other",
			fix:   "give the pods' VFs addresses that route to each other (the NetworkAttachmentDefinition's IPAM); check the GID NCCL logs"},
		{re: regexp.MustCompile(`ibv_modify_qp failed with (?:error )?(?:22|Invalid argument)`), status: Fail,
			cause: "the device rejected the queue pair's attributes: an invalid partition key index (NCCL_IB_PKEY) or GID index (NCCL_IB_GID_INDEX)",
			fix:   "unset NCCL_IB_PKEY and NCCL_IB_GID_INDEX, or set them to indexes the port has (/sys/class/infiniband/<dev>/ports/1/pkeys, gids)"},
		{re: regexp.MustCompile(`ibv_query_gid failed`), status: Fail,
			cause: "NCCL asked for a GID the port does not have (NCCL_IB_GID_INDEX beyond its table)",
			fix:   "unset NCCL_IB_GID_INDEX"},
		{re: regexp.MustCompile(`Got completion (?:from peer \S+ )?with (?:status=|error )12\b`), status: Fail,
			cause: "transport retry counter exceeded: packets were lost between the nodes (RoCE without lossless configuration, a GID that does not route, or an IB link or route problem)",
			fix:   "test the path with ib_write_bw between the two pods; on RoCE check PFC/ECN on the switches"},
		{re: regexp.MustCompile(`NCCL_IB_GID_INDEX set by environment to (-?\d+)`), status: Warn,
			cause: "NCCL_IB_GID_INDEX=$1 is pinned: it goes wrong when the GID table changes (addresses added in another order, another node)",
			fix:   "unset NCCL_IB_GID_INDEX: NCCL picks the RoCE v2 IPv4 GID of each port"},
		{re: regexp.MustCompile(`GPU Direct RDMA Disabled for HCA \d+ '([^']+)'`), status: Warn,
			cause: "GPUDirect RDMA is off for $1: traffic is staged through host memory (nvidia_peermem not loaded and no DMA-BUF, or the NIC is far from the GPU)",
			fix:   "modprobe nvidia_peermem on the node (GPU operator: enable it), or use the open GPU kernel modules for DMA-BUF; doctor's gpu-affinity shows NIC distance"},
	}
}

func (h *host) checkNCCLLog() {
	const name = "nccl-log"
	path := h.opts.NCCLLog
	f, err := os.Open(path)
	if h.denied(name, path, err) {
		return
	}
	if err != nil {
		h.addf(name, Fail, path, "", "cannot read the log: %v", err)
		return
	}
	defer f.Close()
	type hit struct {
		line, count int
		text        string
		m           []string
	}
	pat := ncclLog()
	hits := make([]*hit, len(pat.causes))
	network, ibDevs, sockDevs := "", "", ""
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		if m := pat.usingNet.FindStringSubmatch(line); m != nil && network == "" {
			network = m[1]
		}
		if m := pat.ibUsing.FindStringSubmatch(line); m != nil && ibDevs == "" {
			ibDevs = strings.TrimSpace(m[1])
		}
		if m := pat.so.FindStringSubmatch(line); m != nil && sockDevs == "" {
			sockDevs = strings.TrimSpace(m[1])
		}
		for i, c := range pat.causes {
			m := c.re.FindStringSubmatch(line)
			if m == nil || (c.when != nil && !c.when(m)) {
				continue
			}
			if hits[i] == nil {
				hits[i] = &hit{line: n, text: strings.TrimSpace(line), m: m}
			}
			hits[i].count++
		}
	}
	if err := sc.Err(); err != nil {
		h.addf(name, Fail, path, "", "reading the log: %v", err)
		return
	}
	causes := 0
	for i, hh := range hits {
		if hh == nil {
			continue
		}
		c := pat.causes[i]
		expand := func(s string) string {
			for j := len(hh.m) - 1; j >= 1; j-- {
				s = strings.ReplaceAll(s, fmt.Sprintf("$%d", j), hh.m[j])
			}
			return s
		}
		if c.status == Fail {
			causes++
		}
		times := ""
		if hh.count > 1 {
			times = fmt.Sprintf(" (%d times)", hh.count)
		}
		h.addf(name, c.status, fmt.Sprintf("%s:%d", path, hh.line), expand(c.fix), "%s%s — %q", expand(c.cause), times, cut(hh.text, 160))
	}
	usedSocket := strings.EqualFold(network, "Socket") || (network == "" && ibDevs == "" && sockDevs != "")
	switch {
	case usedSocket && causes == 0:
		h.addf(name, Fail, path, "run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see why; "+podFix,
			"NCCL used NET/Socket (%s) and the log does not say why", orDash(sockDevs))
	case usedSocket:
		h.addf(name, Fail, path, "fix the causes above", "NCCL used NET/Socket (%s), for the reasons above", orDash(sockDevs))
	case ibDevs != "" || strings.HasPrefix(network, "IB"):
		h.addf(name, OK, path, "", "NCCL used network %s: %s", orDash(network), orDash(ibDevs))
	case network == "":
		h.add(name, Skip, path, "no \"Using network\" line: not an NCCL_DEBUG=INFO log, or NCCL never initialised", "run the job with NCCL_DEBUG=INFO")
	default:
		h.addf(name, OK, path, "", "NCCL used network %s", network)
	}
}

// cut shortens s to n bytes for a message.
func cut(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
