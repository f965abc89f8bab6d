//go:build !nodra

package main

import (
	"context"
	"flag"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
)

// Built without the nodra tag, regfloor carries what a device plugin that
// can also serve DRA links: the kubelet plugin library of
// k8s.io/dynamic-resource-allocation and the client-go clientset it takes.
// -dra starts it (in-cluster config, the driver name given); without
// -dra, as BenchmarkDaemonRSSDRA runs it, it is linked in and not
// started, as the daemon's DRA driver is under a config that serves no
// pool through DRA.
var draDriver = flag.String("dra", "", "also start a DRA kubelet plugin under this driver name (in-cluster config, NODE_NAME)")

func init() { startDRA = startDRAPlugin }

// draFloor is the least DRA driver: it prepares nothing.
type draFloor struct{}

func (draFloor) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	out := make(map[types.UID]kubeletplugin.PrepareResult, len(claims))
	for _, c := range claims {
		out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("regfloor prepares nothing")}
	}
	return out, nil
}

func (draFloor) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := make(map[types.UID]error, len(claims))
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (draFloor) HandleError(context.Context, error, string) {}

func (draFloor) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func startDRAPlugin(ctx context.Context, node string) (func(), error) {
	if *draDriver == "" {
		return func() {}, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, err
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	h, err := kubeletplugin.Start(ctx, draFloor{}, kubeletplugin.DriverName(*draDriver),
		kubeletplugin.KubeClient(client), kubeletplugin.NodeName(node))
	if err != nil {
		return nil, err
	}
	return h.Stop, nil
}
