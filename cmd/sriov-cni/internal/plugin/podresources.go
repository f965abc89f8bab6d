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

	"github.com/fastpath-k8s/fastpath/pkg/pci"
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

// PodResources answers what one pod holds: the devices that device
// plugins allocated to it, by resource, and the VFs of fastpath's DRA
// driver in its claims. One call is one List of the kubelet's
// PodResources API: an ADD makes at most one.
type PodResources interface {
	Pod(ctx context.Context, namespace, pod string) (PodDevices, error)
}

// PodDevices is what the kubelet says one pod holds.
type PodDevices struct {
	// Resources are the device IDs that device plugins allocated to the
	// pod's containers, by resource name.
	Resources map[string][]string
	// DRAVFs are the PCI addresses of the VFs of fastpath's DRA driver in
	// the pod's claims.
	DRAVFs []string
}

// Of returns the devices of resource the pod holds or, when it has none
// (or resource is ""), its VFs of fastpath's DRA driver — the case of a
// pod whose resources.limits the scheduler turned into a claim (a
// DeviceClass with extendedResourceName): Multus v4.3.0 finds DRA devices
// by claim name only, and that claim's name is generated, so it passes no
// deviceID for the NetworkAttachmentDefinition's resourceName. Sorted,
// without repeats.
func (d PodDevices) Of(resource string) []string {
	ids := slices.Clone(d.Resources[resource])
	if resource == "" || len(ids) == 0 {
		ids = slices.Clone(d.DRAVFs)
	}
	sort.Strings(ids)
	return slices.Compact(ids)
}

// VFs returns every PCI address the pod holds: the device IDs of any
// resource that are PCI addresses, and its VFs of fastpath's DRA driver.
// Sorted, without repeats.
func (d PodDevices) VFs() []string {
	ids := slices.Clone(d.DRAVFs)
	for _, devs := range d.Resources {
		for _, id := range devs {
			if pci.ValidAddress(id) {
				ids = append(ids, id)
			}
		}
	}
	sort.Strings(ids)
	return slices.Compact(ids)
}

// kubeletPodResources asks the kubelet's PodResources API (v1, List) on a
// unix socket. List, not the per-pod Get: Get is GA only from Kubernetes
// 1.36 (feature gate KubeletPodResourcesGet: alpha and off in 1.27–1.33,
// beta and on in 1.34–1.35, where a node may turn it off), and the kubelet
// answers a Get it does not serve with the same kind of error as a pod it
// does not know. List answers on every kubelet; its cost, at 250 pods, is
// in docs/benchmarks.md (BenchmarkDeviceIDCheck).
type kubeletPodResources struct{ socket string }

// NewKubeletPodResources returns the real client for socket.
func NewKubeletPodResources(socket string) PodResources { return kubeletPodResources{socket: socket} }

func (k kubeletPodResources) Pod(ctx context.Context, namespace, pod string) (PodDevices, error) {
	if _, err := os.Stat(k.socket); errors.Is(err, fs.ErrNotExist) {
		return PodDevices{}, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("kubelet PodResources socket %s does not exist (is the kubelet running? set podResourcesSocket if it lives elsewhere)", k.socket), "")
	}
	conn, err := grpc.NewClient("unix://"+k.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return PodDevices{}, fmt.Errorf("PodResources %s: %w", k.socket, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := podresourcesapi.NewPodResourcesListerClient(conn).List(ctx, &podresourcesapi.ListPodResourcesRequest{})
	if err != nil {
		return PodDevices{}, types.NewError(types.ErrTryAgainLater, fmt.Sprintf("PodResources List on %s: %v", k.socket, err), "")
	}
	return podDevices(resp.GetPodResources(), namespace, pod), nil
}

// podDevices are the devices that device plugins gave the pod, by
// resource, and the VFs (PCI addresses) of fastpath's DRA driver in its
// claims.
func podDevices(pods []*podresourcesapi.PodResources, namespace, pod string) PodDevices {
	d := PodDevices{Resources: map[string][]string{}}
	for _, p := range pods {
		if p.GetNamespace() != namespace || p.GetName() != pod {
			continue
		}
		for _, c := range p.GetContainers() {
			for _, dev := range c.GetDevices() {
				d.Resources[dev.GetResourceName()] = append(d.Resources[dev.GetResourceName()], dev.GetDeviceIds()...)
			}
			for _, dr := range c.GetDynamicResources() {
				for _, r := range dr.GetClaimResources() {
					if r.GetDriverName() != DRADriver {
						continue
					}
					for _, cdi := range r.GetCdiDevices() {
						if addr, ok := draVF(cdi.GetName()); ok {
							d.DRAVFs = append(d.DRAVFs, addr)
						}
					}
				}
			}
		}
	}
	return d
}
