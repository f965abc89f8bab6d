package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sort"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// PodResources answers which devices of a resource a pod holds.
type PodResources interface {
	Devices(ctx context.Context, namespace, pod, resource string) ([]string, error)
}

// kubeletPodResources asks the kubelet's PodResources API (v1, List) on a
// unix socket.
type kubeletPodResources struct{ socket string }

// NewKubeletPodResources returns the real client for socket.
func NewKubeletPodResources(socket string) PodResources { return kubeletPodResources{socket: socket} }

func (k kubeletPodResources) Devices(ctx context.Context, namespace, pod, resource string) ([]string, error) {
	if _, err := os.Stat(k.socket); errors.Is(err, fs.ErrNotExist) {
		return nil, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("kubelet PodResources socket %s does not exist (is the kubelet running? set podResourcesSocket if it lives elsewhere)", k.socket), "")
	}
	conn, err := grpc.NewClient("unix://"+k.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, fmt.Errorf("PodResources %s: %w", k.socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return nil, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("PodResources List on %s: %v", k.socket, err), "")
	}
	var ids []string
	for _, p := range resp.GetPodResources() {
		if p.GetNamespace() != namespace || p.GetName() != pod {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
		}
	}
	sort.Strings(ids)
	return ids, nil
}
