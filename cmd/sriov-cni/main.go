// Command sriov is fastpath's CNI plugin (installed as /opt/cni/bin/sriov):
// it moves an SR-IOV VF's netdev and RDMA device (any vendor's NIC:
// ConnectX, Intel E810, Broadcom, igb; docs/vendors.md) into the pod,
// applies the VF's settings on its PF, runs IPAM, and on DEL puts
// everything back.
package main

import (
	"os"
	"os/signal"
	"syscall"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/fastpath-k8s/fastpath/cmd/sriov-cni/internal/plugin"
)

func main() {
	// A runtime whose call timed out kills the delegating plugin (Multus
	// thin), which read this plugin's stdout and stderr through pipes; this
	// plugin goes on, orphaned. Go's default for a write to a broken pipe
	// on fd 1 or 2 is death by SIGPIPE, which skips every deferred unlock:
	// measured in make e2e-cluster's scale phase, a DEL that waited a
	// minute for whereabouts died copying whereabouts' stderr, leaving its
	// VF's and its attachment's lock files. Ignored, the write fails with
	// EPIPE (the log line is lost, nobody could read it) and the call
	// finishes its work (orphan_test.go).
	signal.Ignore(syscall.SIGPIPE)
	// The plugin refuses the host netns as CNI_NETNS itself, before ADD
	// changes anything; skel's own check runs only after ADD (a second
	// JSON document on stdout, the VF already renamed on the host) and
	// fails every DEL of such an attachment forever.
	_ = os.Setenv("CNI_NETNS_OVERRIDE", "1")
	p := plugin.New()
	testBuild(p)
	skel.PluginMainFuncs(p.Funcs(),
		// Every version upstream sriov-cni takes: a network written for it
		// in 0.1.0–0.3.0 must at least DEL (skel refuses CHECK, GC and
		// STATUS where the conf's version has none); ADD answers in that
		// version's result, or refuses what it cannot express.
		version.All,
		"fastpath sriov CNI: SR-IOV VFs of any vendor's NIC (ConnectX first) with their RDMA devices")
}
