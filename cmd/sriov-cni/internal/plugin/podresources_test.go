package plugin

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet serves the PodResources List call on a unix socket, as the
// kubelet does.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	pods []*podresourcesapi.PodResources
}

func (k *kubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	return &podresourcesapi.ListPodResourcesResponse{PodResources: k.pods}, nil
}

func serveKubelet(t *testing.T, k *kubelet) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	g := grpc.NewServer()
	podresourcesapi.RegisterPodResourcesListerServer(g, k)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return sock
}

func podWith(ns, name string, devs ...*podresourcesapi.ContainerDevices) *podresourcesapi.PodResources {
	return &podresourcesapi.PodResources{Namespace: ns, Name: name, Containers: []*podresourcesapi.ContainerResources{
		{Name: "sidecar"},
		{Name: "trainer", Devices: devs},
	}}
}

func TestKubeletPodResources(t *testing.T) {
	sock := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{
		podWith("default", "other", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{"0000:18:00.4"}}),
		podWith("default", "trainer-0",
			&podresourcesapi.ContainerDevices{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-1"}},
			&podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{"0000:29:00.2", "0000:18:00.1"}}),
	}})
	ids, err := NewKubeletPodResources(sock).Devices(context.Background(), "default", "trainer-0", "mellanox.com/rails")
	require.NoError(t, err)
	require.Equal(t, []string{"0000:18:00.1", "0000:29:00.2"}, ids)
	ids, err = NewKubeletPodResources(sock).Devices(context.Background(), "kube-system", "trainer-0", "mellanox.com/rails")
	require.NoError(t, err)
	require.Empty(t, ids)

	_, err = NewKubeletPodResources(filepath.Join(t.TempDir(), "none.sock")).Devices(context.Background(), "default", "p", "r/x")
	require.Equal(t, types.ErrTryAgainLater, CNIError(err).Code)
	require.ErrorContains(t, err, "does not exist (is the kubelet running?")
}

// Without a deviceID the plugin asks the kubelet which VFs the pod holds
// and takes the first one not attached yet.
func TestAddResolvesVFThroughPodResources(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	a, b := e.standIn("ens1f1v0"), e.standIn("ens1f1v1")
	sock := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{
		podWith("default", "trainer-0", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{"0000:3b:01.3", "0000:3b:01.2"}}),
		podWith("default", "no-vf"),
	}})
	e.p.NewPodResources = NewKubeletPodResources
	conf := e.conf(`"resourceName":"mellanox.com/rails","podResourcesSocket":"` + sock + `"`)
	podNS := e.pod()

	r1, err := e.add(conf, podNS, "c1", "net1")
	require.NoError(t, err)
	require.Equal(t, "0000:3b:01.2", r1.Interfaces[0].PciID)
	r2, err := e.add(conf, podNS, "c1", "net2")
	require.NoError(t, err)
	require.Equal(t, "0000:3b:01.3", r2.Interfaces[0].PciID)
	_, err = e.add(conf, podNS, "c1", "net3")
	require.Equal(t, types.ErrTryAgainLater, CNIError(err).Code)
	require.ErrorContains(t, err, "0000:3b:01.2,0000:3b:01.3")
	require.ErrorContains(t, err, "VF is in use")

	require.NoError(t, e.del(conf, podNS, "c1", "net2"))
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(a, "0000:3b:01.2")
	e.requireRestored(b, "0000:3b:01.3")

	args := e.args(conf, podNS, "c2", "net1")
	args.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=no-vf"
	err = e.p.Add(args)
	require.Equal(t, types.ErrInvalidNetworkConfig, CNIError(err).Code)
	require.ErrorContains(t, err, "pod default/no-vf holds no mellanox.com/rails device")

	args.Args = ""
	err = e.p.Add(args)
	require.Equal(t, types.ErrInvalidEnvironmentVariables, CNIError(err).Code)

	err = e.p.Add(e.args(e.conf(""), podNS, "c3", "net1"))
	require.ErrorContains(t, err, "no deviceID")
}
