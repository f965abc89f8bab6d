//go:build !nodra

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
)

// draBuild says, in --version, whether this build serves DRA.
const draBuild = "with DRA"

// draFlags configure the DRA side of the daemon. They matter only when
// the config serves a pool through DRA ("servedBy": "dra").
type draFlags struct {
	kubeconfig, nodeName, pluginDir, registryDir, cdiDir string
}

func registerDRAFlags(fs *flag.FlagSet, f *draFlags) {
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "DRA: kubeconfig for the API server (default: the pod's service account)")
	fs.StringVar(&f.pluginDir, "dra-plugin-dir", dra.DefaultPluginDir, "DRA: the plugin's directory for dra.sock, the CNI's cni.sock, its checkpoint and the claims' device metadata files; the same path on the node")
	fs.StringVar(&f.registryDir, "dra-registry-dir", dra.DefaultRegistryDir, "DRA: the kubelet's plugin registration directory")
	fs.StringVar(&f.cdiDir, "dra-cdi-dir", dra.DefaultCDIDir, "DRA: where a CDI spec per prepared claim (and one per request, mounting its device metadata file) goes: the container runtime's CDI directory")
}

// withNode is f with the node's name (--node-name, a flag of both builds:
// registerNodeFlags).
func (f draFlags) withNode(name string) draFlags {
	f.nodeName = name
	return f
}

// draHook runs the DRA driver beside the device plugin when the config
// serves pools through DRA. Both take their pools from the same scans.
type draHook struct {
	driver *dra.Driver
	log    *slog.Logger
	cancel context.CancelCauseFunc

	mu    sync.Mutex // guards the field below
	fatal error
}

// startDRA starts the DRA driver when the first scan has pools served by
// DRA. It returns the context the daemon runs in (ended early when the
// DRA plugin fails), the scan function the device plugin's manager uses
// (it feeds the driver each rescan and config reload) and the hook,
// whose stop must be called.
func startDRA(ctx context.Context, f draFlags, hostRoot, nodeRoot, devInfoDir string, first plugin.Scan, scan plugin.ScanFunc, log *slog.Logger) (context.Context, plugin.ScanFunc, *draHook, error) {
	h := &draHook{log: log}
	if len(draPoolNames(first.Pools)) == 0 {
		return ctx, watchConfig(scan, log, "the DRA driver was not started with it: restart the plugin"), h, nil
	}
	client, err := kubeClient(f.kubeconfig)
	if err != nil {
		return nil, nil, nil, err
	}
	ctx, h.cancel = context.WithCancelCause(ctx)
	h.driver, err = dra.New(dra.Options{
		NodeName: f.nodeName, KubeClient: client, HostRoot: hostRoot, NodeRoot: nodeRoot,
		PluginDir: f.pluginDir, RegistryDir: f.registryDir, CDIDir: f.cdiDir, DevInfoDir: devInfoDir,
		Links: &plugin.NetlinkLinks{OnError: func(err error) {
			log.Warn("dra: netlink link subscription failed; VF health follows periodic rescans only", "err", err)
		}},
		Log: log,
		OnFatal: func(err error) {
			h.mu.Lock()
			h.fatal = err
			h.mu.Unlock()
			h.cancel(err)
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	h.driver.Update(first)
	if err := h.driver.Start(ctx); err != nil {
		return nil, nil, nil, err
	}
	return ctx, func(reload bool) (plugin.Scan, error) {
		s, err := scan(reload)
		if err == nil {
			h.driver.Update(s)
		}
		return s, err
	}, h, nil
}

// stop stops the DRA driver (prepared claims stay prepared) and returns
// why it failed, if it did.
func (h *draHook) stop() error {
	if h.driver == nil {
		return nil
	}
	h.driver.Stop()
	h.cancel(nil)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fatal != nil {
		return fmt.Errorf("dra: %w", h.fatal)
	}
	return nil
}

// kubeClient talks to the API server: with a kubeconfig file, or as the
// pod's service account.
func kubeClient(kubeconfig string) (kubernetes.Interface, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		cfg, err = rest.InClusterConfig()
		if errors.Is(err, rest.ErrNotInCluster) {
			err = fmt.Errorf("%w: the config serves pools through DRA, which needs the API server: run in a pod with a service account or pass --kubeconfig", err)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	cfg.UserAgent = "fastpath-rdma-device-plugin/" + dra.DriverName
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("dra: %w", err)
	}
	return client, nil
}

// draPrepared names the VFs of prepared DRA claims (the checkpoint in
// the DRA plugin directory), which provisioning must not take away.
func draPrepared(f draFlags) func() (map[string]string, error) {
	dir := f.pluginDir
	if dir == "" {
		dir = dra.DefaultPluginDir
	}
	return func() (map[string]string, error) { return dra.PreparedVFs(dir) }
}

// draPreparedUnder is draPrepared for the DRA plugin's default directory
// on the node under root (the uninstall's view of the node).
func draPreparedUnder(root string) func() (map[string]string, error) {
	return draPrepared(draFlags{pluginDir: filepath.Join(root, dra.DefaultPluginDir)})
}
