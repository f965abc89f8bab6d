package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DefaultPodResourcesSocket is where the kubelet serves its PodResources
// API.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// PodDevices tells which devices live pods hold: the kubelet is the source
// of truth for that, not the Allocate calls the plugin has seen (a pod that
// ended released its devices; a restarted plugin saw no Allocate at all).
type PodDevices interface {
	// Held returns the IDs of the devices of resources that containers of
	// the kubelet's pods hold.
	Held(ctx context.Context, resources map[string]bool) (map[string]bool, error)
}

// ErrNoPodResources is returned when the kubelet's PodResources socket
// does not exist.
var ErrNoPodResources = errors.New("kubelet PodResources socket does not exist")

// KubeletPodResources asks the kubelet's PodResources API (v1, List) on a
// unix socket.
type KubeletPodResources struct{ Socket string }

var _ PodDevices = KubeletPodResources{}

// Held lists the kubelet's pods and collects their devices of resources.
func (k KubeletPodResources) Held(ctx context.Context, resources map[string]bool) (map[string]bool, error) {
	held := map[string]bool{}
	err := k.each(ctx, func(_ *podresourcesapi.PodResources, d *podresourcesapi.ContainerDevices) {
		if resources[d.GetResourceName()] {
			for _, id := range d.GetDeviceIds() {
				held[id] = true
			}
		}
	})
	return held, err
}

// Holders lists the kubelet's pods and names the pod ("pod ns/name")
// that holds each device, by device ID (a VF's is its PCI address).
func (k KubeletPodResources) Holders(ctx context.Context) (map[string]string, error) {
	out := map[string]string{}
	err := k.each(ctx, func(p *podresourcesapi.PodResources, d *podresourcesapi.ContainerDevices) {
		for _, id := range d.GetDeviceIds() {
			out[id] = "pod " + p.GetNamespace() + "/" + p.GetName()
		}
	})
	return out, err
}

// each calls f for every device of every container of the kubelet's pods.
func (k KubeletPodResources) each(ctx context.Context, f func(*podresourcesapi.PodResources, *podresourcesapi.ContainerDevices)) error {
	if _, err := os.Stat(k.Socket); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%w: %s", ErrNoPodResources, k.Socket)
	}
	conn, err := grpc.NewClient("unix://"+k.Socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return fmt.Errorf("PodResources %s: %w", k.Socket, err)
	}
	defer conn.Close()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return fmt.Errorf("PodResources %s: List: %w", k.Socket, err)
	}
	for _, p := range resp.GetPodResources() {
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				f(p, d)
			}
		}
	}
	return nil
}
