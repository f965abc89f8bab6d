package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// DRADriver is fastpath's DRA driver (cmd/rdma-device-plugin's
// dra.DriverName). A VF it prepared for a claim is named, after the "="
// of its CDI device, by its PCI address; its CDI class is "vf", or
// "vf-admin-<claim UID>" for an admin-access claim. The driver's other
// CDI devices (the device metadata files, class "metadata") are no VFs.
const DRADriver = "rdma.fastpath-k8s.io"

// draVF returns the PCI address that a CDI device name of DRADriver's
// gives a VF, false for a name of another of its classes.
func draVF(cdiName string) (string, bool) {
	kind, addr, ok := strings.Cut(cdiName, "=")
	if !ok {
		return "", false
	}
	class, ok := strings.CutPrefix(kind, DRADriver+"/")
	if !ok || class != "vf" && !strings.HasPrefix(class, "vf-admin-") {
		return "", false
	}
	return addr, true
}

// PodResources answers which devices of a resource a pod holds: those the
// device plugin of resource allocated to it, or, when it has none (or
// resource is ""), the VFs of fastpath's DRA driver in its claims — the
// case of a pod whose resources.limits the scheduler turned into a claim
// (a DeviceClass with extendedResourceName): Multus v4.3.0 finds DRA
// devices by claim name only, and that claim's name is generated, so it
// passes no deviceID for the NetworkAttachmentDefinition's resourceName.
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
	ids, vfs := podDevices(resp.GetPodResources(), namespace, pod, resource)
	if len(ids) == 0 {
		ids = vfs
	}
	sort.Strings(ids)
	return slices.Compact(ids), nil
}

// podDevices are the devices of resource that the device plugin gave the
// pod, and the VFs (PCI addresses) of fastpath's DRA driver in its claims.
func podDevices(pods []*podresourcesapi.PodResources, namespace, pod, resource string) (ids, vfs []string) {
	for _, p := range pods {
		if p.GetNamespace() != namespace || p.GetName() != pod {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, d := range c.GetDevices() {
				if resource != "" && d.GetResourceName() == resource {
					ids = append(ids, d.GetDeviceIds()...)
				}
			}
			for _, dr := range c.GetDynamicResources() {
				for _, r := range dr.GetClaimResources() {
					if r.GetDriverName() != DRADriver {
						continue
					}
					for _, cdi := range r.GetCdiDevices() {
						if addr, ok := draVF(cdi.GetName()); ok {
							vfs = append(vfs, addr)
						}
					}
				}
			}
		}
	}
	return ids, vfs
}
