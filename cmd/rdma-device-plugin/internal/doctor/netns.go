package doctor

import (
	"errors"
	"fmt"
)

// RDMA netns modes, as `rdma system show netns` names them.
const (
	ModeExclusive = "exclusive"
	ModeShared    = "shared"
)

// ErrNoRDMANetlink is what a Kernel returns when the kernel has no RDMA
// netlink (ib_core is not loaded).
var ErrNoRDMANetlink = errors.New("no RDMA netlink (is ib_core loaded?)")

// checkNetnsMode reports the RDMA subsystem's netns mode: over RDMA
// netlink when the running kernel is the node's, else (or when netlink is
// missing) from ib_core's netns_mode parameter, which is the same
// variable (Y = shared).
func (h *host) checkNetnsMode() {
	const name = "rdma-netns"
	mode, source := "", ""
	var nlErr error
	if h.opts.Kernel != nil {
		m, err := h.opts.Kernel.RDMANetnsMode()
		if err == nil {
			mode, source = m, "RDMA netlink"
		}
		nlErr = err
	}
	if mode == "" {
		switch v, err := read(h.sys("module", "ib_core", "parameters", "netns_mode")); {
		case err != nil:
		case v == "Y" || v == "1":
			mode, source = ModeShared, h.sys("module", "ib_core", "parameters", "netns_mode")
		case v == "N" || v == "0":
			mode, source = ModeExclusive, h.sys("module", "ib_core", "parameters", "netns_mode")
		}
	}
	switch mode {
	case "":
		why := "no RDMA netlink and no ib_core netns_mode parameter"
		if nlErr != nil {
			why = fmt.Sprintf("%v, and no %s", nlErr, h.sys("module", "ib_core", "parameters", "netns_mode"))
		} else if h.opts.Kernel == nil {
			why = "--host-root is not this machine's /, and it has no ib_core netns_mode parameter"
		}
		h.add(name, Skip, "", "RDMA netns mode not known: "+why, "")
	case ModeExclusive:
		h.add(name, OK, source,
			"exclusive: each RDMA device lives in one network namespace, and a pod sees only those moved into it with its VF (\"rdmaIsolation\": true in the NetworkAttachmentDefinition)", "")
	case ModeShared:
		h.add(name, OK, source,
			"shared (the default): every pod sees every RDMA device of the node but opens only the char devices it was given; for multi-tenant nodes prefer exclusive: options ib_core netns_mode=0 in /etc/modprobe.d and reboot (`rdma system set netns exclusive` fails with EBUSY once pods run)", "")
	default:
		h.addf(name, Warn, source, "", "unknown RDMA netns mode %q", mode)
	}
}
