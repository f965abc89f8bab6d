package main

import (
	"context"
	"errors"
	"io"
	"log/slog"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/installcni"
)

const installCNIUsage = `usage: rdma-device-plugin install-cni [--from /usr/bin/sriov] --to DIR

Installs the sriov CNI binary into the node's CNI bin_dir as DIR/sriov, and
nothing else: the DaemonSet's init container runs it as root. It writes a
temporary file and renames it over sriov, refuses a sriov that is a link or
not a regular file, logs what it replaced (size, sha256, its answer to
CNI_COMMAND=VERSION), and keeps a sriov that is not fastpath's as
DIR/sriov.pre-fastpath (once, never overwritten) for an uninstall.

`

func runInstallCNI(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("install-cni", installCNIUsage, stderr)
	from := fs.String("from", "/usr/bin/sriov", "the CNI binary to install")
	to := fs.String("to", "", "the node's CNI bin_dir, as mounted in this container (e.g. /host/opt/cni/bin)")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *to == "" {
		return errors.New("install-cni: --to is required: the node's CNI bin_dir as this container mounts it")
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	_, err := installcni.Install(ctx, *from, *to, log)
	return err
}
