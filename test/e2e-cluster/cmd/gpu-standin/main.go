// Command gpu-standin is the stand-in GPU DRA driver of make e2e-cluster's
// DRA phase: it publishes the fixture host's GPUs (vendor 10de) with
// Kubernetes' own deviceattribute pcieRoot, registers with the kubelet as
// a DRA plugin and prepares claims with a CDI spec (an environment
// variable naming the GPU). No GPU needed; not for production.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/klog/v2"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/gpustandin"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpu-standin: %v\n", err)
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	hostRoot := flag.String("host-root", "/", "the host whose /sys lists the GPUs")
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	node := flag.String("node-name", "", "this node")
	pluginDir := flag.String("plugin-dir", kubeletplugin.KubeletPluginsDir+"/"+gpustandin.DriverName, "dra.sock's directory")
	registryDir := flag.String("registry-dir", kubeletplugin.KubeletRegistryDir, "the kubelet's plugin registration directory")
	cdiDir := flag.String("cdi-dir", kubeletplugin.DefaultCDIDir, "CDI spec directory")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	gpus, err := gpustandin.GPUs(*hostRoot)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(*pluginDir, 0o750); err != nil {
		return err
	}
	d, err := gpustandin.NewDriver(*node, *cdiDir, log)
	if err != nil {
		return err
	}
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(log.Handler()))
	helper, err := kubeletplugin.Start(ctx, d, kubeletplugin.DriverName(gpustandin.DriverName), kubeletplugin.KubeClient(client),
		kubeletplugin.NodeName(*node), kubeletplugin.PluginDataDirectoryPath(*pluginDir), kubeletplugin.RegistrarDirectoryPath(*registryDir),
		kubeletplugin.HealthService(false))
	if err != nil {
		return err
	}
	defer helper.Stop()
	if err := helper.PublishResources(ctx, d.Resources(gpus)); err != nil {
		return err
	}
	log.Info("gpu stand-in: serving", "gpus", len(gpus), "node", *node)
	<-ctx.Done()
	return nil
}
