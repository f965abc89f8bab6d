// Command rdma-device-plugin is fastpath's kubelet device plugin for
// SR-IOV VFs of any vendor's NIC, ConnectX first, and shared HCAs.
//
//	rdma-device-plugin [flags]              serve the pools to the kubelet
//	rdma-device-plugin discover [flags]     print what the node has
//	rdma-device-plugin doctor [flags]       say why NCCL would not use RDMA here
//	rdma-device-plugin provision [flags]    create the VFs SriovNetworkNodePolicies ask for
//	rdma-device-plugin install-cni [flags]  install the sriov CNI binary (the init container)
//	rdma-device-plugin uninstall [flags]    put the node back as before fastpath
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"syscall"
)

func main() {
	// Nothing reads a heap profile here (no pprof endpoint); sampling one
	// only keeps its bucket table and stacks resident.
	runtime.MemProfileRate = 0
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		code := 1
		var ec interface{ ExitCode() int }
		if errors.As(err, &ec) {
			code = ec.ExitCode()
		}
		if err.Error() != "" {
			fmt.Fprintf(os.Stderr, "rdma-device-plugin: %v\n", err)
		}
		os.Exit(code)
	}
}

// subcommands are the top-level --help's list, in run's order; each has a
// --help of its own.
var subcommands = []struct{ name, summary string }{
	{"serve", "serve the pools to the kubelet (the default: no subcommand)"},
	{"discover", "show what the node has and which pool gets what"},
	{"doctor", "say why NCCL would not use RDMA here, and the fix"},
	{"provision", "create the VFs SriovNetworkNodePolicies ask for"},
	{"install-cni", "install the sriov CNI binary into the node's CNI bin_dir (the init container)"},
	{"uninstall", "put the node back as before fastpath: VFs, the sriov CNI binary, files (deployments/uninstall)"},
}

// run dispatches to a subcommand; no subcommand means serve.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		switch args[0] {
		case "discover":
			return runDiscover(ctx, args[1:], stdout, stderr)
		case "doctor":
			return runDoctor(ctx, args[1:], stdout, stderr)
		case "provision":
			return runProvision(ctx, args[1:], stdout, stderr)
		case "install-cni":
			return runInstallCNI(ctx, args[1:], stdout, stderr)
		case "uninstall":
			return runUninstall(ctx, args[1:], stdout, stderr)
		case "serve":
			return runServe(ctx, args[1:], stdout, stderr)
		}
	}
	return runServe(ctx, args, stdout, stderr)
}
