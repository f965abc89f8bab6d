package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/uninstall"
	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

const uninstallUsage = `usage: rdma-device-plugin uninstall [--host-root DIR] [--config FILE] [--report FILE] [flags]

Puts the node back as it was before fastpath's DaemonSet, once its
workload pods and the device plugin's DaemonSet are gone (the DaemonSet of
deployments/uninstall/ runs it on every node; docs/install.md#uninstall):

  - each PF whose VFs provisioning made goes back to the sriov_numvfs it
    had before (recorded when provisioning first changed it); a PF whose
    VFs pods still hold is left, and named;
  - then, when no VF of fastpath's is held: the sriov CNI binary that
    install-cni replaced is put back (kept as sriov.pre-fastpath), or
    fastpath's is removed and the report says none is left; the device
    plugin's device-info files (of the pools in --config) and CDI specs,
    the CNI's leftovers and provisioning's records are removed.

It prints a line per thing it did, and writes them to --report. The node
paths below are read under --host-root. Exit status 0: the node is as
before fastpath; 1: something is left (held VFs: delete those pods and run
it again).

`

func runUninstall(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("uninstall", uninstallUsage, stderr)
	hostRoot := fs.String("host-root", defaultHostRoot(), "directory that stands for / on the node (sysfs at DIR/sys, and the node paths below); default $FASTPATH_HOST_ROOT or /")
	config := fs.String("config", "", "the device plugin's pool config (the ConfigMap's config.json): its pools' device-info files are removed; empty: none are")
	cniBinDir := fs.String("cni-bin-dir", "/opt/cni/bin", "the node's CNI bin_dir, where install-cni put sriov; empty: leave it")
	devInfoDir := fs.String("devinfo-dir", defaultDevInfoDir, "the node's device-info directory the device plugin wrote to")
	cdiDir := fs.String("cdi-dir", defaultCDIDir, "the node's CDI directory the device plugin wrote its specs to; empty: leave it")
	stateDir := fs.String("provision-state-dir", provision.DefaultStateDir, "the node's provisioning state directory: what each PF had before fastpath")
	cniStateDir := fs.String("cni-state-dir", cnistate.DefaultDir, "the node's sriov CNI stateDir: a VF attached there is held")
	podResources := fs.String("pod-resources-socket", plugin.DefaultPodResourcesSocket, "the node's kubelet PodResources socket, asked which VFs pods hold; empty: do not ask")
	timeout := fs.Duration("provision-timeout", provision.DefaultTimeout, "how long one PF's VFs, made again, may take to show their netdevs")
	report := fs.String("report", "", "also write the report to FILE (in a pod: /dev/termination-log, which the pod's status shows)")
	if help, err := parseFlags(fs, args); help || err != nil {
		if errors.Is(err, errStrayArgument) {
			return fmt.Errorf("uninstall: %w", err)
		}
		return err
	}
	node := func(p string) string {
		if p == "" {
			return ""
		}
		return filepath.Join(*hostRoot, p)
	}
	c := uninstall.Config{HostRoot: *hostRoot, CNIBinDir: node(*cniBinDir), DevInfoDir: node(*devInfoDir), CDIDir: node(*cdiDir),
		StateDir: node(*stateDir), CNIStateDir: node(*cniStateDir), PodResources: node(*podResources),
		DRA: draPreparedUnder(*hostRoot), Timeout: *timeout, Log: slog.New(slog.NewTextHandler(stderr, nil))}
	if *config != "" {
		cfg, err := pool.Load(*config)
		if err != nil {
			return fmt.Errorf("uninstall: %w", err)
		}
		c.Pools = cfg.Resources
	}
	r, err := uninstall.Run(ctx, c)
	lines := r.Lines()
	if err != nil && !errors.Is(err, uninstall.ErrHeld) {
		lines = append(lines, "error: "+err.Error())
	}
	text := strings.Join(lines, "\n") + "\n"
	fmt.Fprint(stdout, text)
	if *report != "" {
		// The kubelet keeps the first 4096 bytes of a termination message.
		if werr := os.WriteFile(*report, []byte(text[:min(len(text), 4096)]), 0o644); werr != nil {
			err = errors.Join(err, fmt.Errorf("uninstall: write the report: %w", werr))
		}
	}
	if err == nil && !r.Done() {
		err = errors.New("uninstall: not done (see above)")
	}
	return err
}
