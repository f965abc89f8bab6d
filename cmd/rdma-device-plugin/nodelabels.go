package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/nodeinfo"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
)

// nodeFlags say which node this is, for the policies' nodeSelector (and,
// in the build with DRA, the node whose ResourceSlices it publishes).
type nodeFlags struct {
	labels, name string
}

func registerNodeFlags(fs *flag.FlagSet, f *nodeFlags) {
	fs.StringVar(&f.labels, "node-labels", os.Getenv("FASTPATH_NODE_LABELS"), "this node's labels (k=v,k=v) for the policies' nodeSelector; empty: read them from the API server when --node-name is set in a pod, else unknown and every policy applies (default $FASTPATH_NODE_LABELS)")
	fs.StringVar(&f.name, "node-name", os.Getenv("NODE_NAME"), "this node's name (default $NODE_NAME, from the downward API): without --node-labels, the policies' nodeSelector is matched against this Node's labels, read with the pod's service account; with DRA, the node of its ResourceSlices")
}

func parseLabels(s string) (map[string]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	out := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("--node-labels: %q is not key=value", kv)
		}
		out[k] = v
	}
	return out, nil
}

// nodeEnv is where the process learns which pod it runs in: its
// environment (KUBERNETES_SERVICE_HOST/PORT) and the service account
// directory (token, ca.crt).
type nodeEnv struct {
	getenv  func(string) string
	saDir   string
	timeout time.Duration
}

// podEnv is the process's own.
func podEnv() nodeEnv {
	return nodeEnv{getenv: os.Getenv, saDir: nodeinfo.ServiceAccountDir, timeout: nodeinfo.DefaultTimeout}
}

// resolve finds this node's labels: --node-labels when given; else, with
// --node-name in a pod, the Node's labels from the API server; else none
// (unknown: every policy applies, as when run by hand on a node). The
// error is a --node-labels that does not parse.
func (f nodeFlags) resolve(ctx context.Context, env nodeEnv) (provisioner.NodeLabels, error) {
	if strings.TrimSpace(f.labels) != "" {
		l, err := parseLabels(f.labels)
		return provisioner.NodeLabels{Labels: l, Source: "--node-labels"}, err
	}
	if f.name == "" {
		return provisioner.NodeLabels{Source: "unknown (no --node-labels or --node-name): every policy applies"}, nil
	}
	c, err := nodeinfo.InCluster(env.getenv, env.saDir, env.timeout)
	if errors.Is(err, nodeinfo.ErrNotInCluster) {
		return provisioner.NodeLabels{Source: "unknown (--node-name " + f.name + ", but not in a pod): every policy applies"}, nil
	}
	if err == nil {
		var l map[string]string
		if l, err = c.Labels(ctx, f.name); err == nil {
			return provisioner.NodeLabels{Labels: l, Source: "node " + f.name + " (API server)"}, nil
		}
	}
	return provisioner.NodeLabels{Source: "node " + f.name + ": unreadable", Err: fmt.Errorf("node %s: labels: %w", f.name, err)}, nil
}
