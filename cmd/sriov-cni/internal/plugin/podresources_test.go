package plugin

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// kubelet serves the PodResources List call on a unix socket, as the
// kubelet does, and counts the calls.
type kubelet struct {
	podresourcesapi.UnimplementedPodResourcesListerServer
	pods  []*podresourcesapi.PodResources
	lists atomic.Int32
}

func (k *kubelet) List(context.Context, *podresourcesapi.ListPodResourcesRequest) (*podresourcesapi.ListPodResourcesResponse, error) {
	k.lists.Add(1)
	return &podresourcesapi.ListPodResourcesResponse{PodResources: k.pods}, nil
}

func serveKubelet(t testing.TB, k *kubelet) string {
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

// devices asks pr for the pod's devices of resource, as the resourceName
// lookup of ADD does.
func devices(pr PodResources, namespace, pod, resource string) ([]string, error) {
	d, err := pr.Pod(context.Background(), namespace, pod)
	return d.Of(resource), err
}

func TestKubeletPodResources(t *testing.T) {
	sock := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{
		podWith("default", "other", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{"0000:18:00.4"}}),
		podWith("default", "trainer-0",
			&podresourcesapi.ContainerDevices{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-1"}},
			&podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{"0000:29:00.2", "0000:18:00.1"}}),
	}})
	ids, err := devices(NewKubeletPodResources(sock), "default", "trainer-0", "mellanox.com/rails")
	require.NoError(t, err)
	require.Equal(t, []string{"0000:18:00.1", "0000:29:00.2"}, ids)
	ids, err = devices(NewKubeletPodResources(sock), "kube-system", "trainer-0", "mellanox.com/rails")
	require.NoError(t, err)
	require.Empty(t, ids)

	_, err = devices(NewKubeletPodResources(filepath.Join(t.TempDir(), "none.sock")), "default", "p", "r/x")
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
	e.p.Node.PodResourcesSocket = sock
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

	args = e.args(e.conf(`"podResourcesSocket":"`+sock+`"`), podNS, "c3", "net1")
	args.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=no-vf"
	err = e.p.Add(args)
	require.Equal(t, types.ErrInvalidNetworkConfig, CNIError(err).Code)
	require.ErrorContains(t, err, "no deviceID, and pod default/no-vf holds no VF of DRA driver rdma.fastpath-k8s.io")
}

// dra is a container's claim with VFs of fastpath's DRA driver (and a GPU
// of another driver), as the kubelet lists it: with the device metadata
// (KEP-5304) CDI device that the driver's kubelet-plugin helper adds to
// the first device of a request, which names no VF.
func dra(claim string, vfs ...string) *podresourcesapi.DynamicResource {
	r := &podresourcesapi.ClaimResource{DriverName: DRADriver, PoolName: "node-a"}
	for i, a := range vfs {
		r.CdiDevices = append(r.CdiDevices, &podresourcesapi.CDIDevice{Name: DRADriver + "/vf=" + a})
		if i == 0 {
			r.CdiDevices = append(r.CdiDevices, &podresourcesapi.CDIDevice{Name: DRADriver + "/metadata=" + claim + "-uid_vf"})
		}
	}
	gpu := &podresourcesapi.ClaimResource{DriverName: "gpu.nvidia.com", CdiDevices: []*podresourcesapi.CDIDevice{{Name: "k8s.gpu.nvidia.com/gpu=0000:19:00.0"}}}
	return &podresourcesapi.DynamicResource{ClaimName: claim, ClaimNamespace: "default", ClaimResources: []*podresourcesapi.ClaimResource{gpu, r}}
}

// A pod whose resources.limits the scheduler served through DRA (a
// DeviceClass with extendedResourceName) holds its VF in a claim with a
// generated name: Multus passes no deviceID, and the NAD's resourceName
// is no device plugin resource of the pod. The VFs are then the pod's VFs
// of fastpath's DRA driver, and only those.
func TestKubeletPodResourcesDRA(t *testing.T) {
	withClaims := podWith("default", "trainer-0")
	withClaims.Containers[1].DynamicResources = []*podresourcesapi.DynamicResource{dra("trainer-0-extended-resources-x7k2p", "0000:29:00.2", "0000:18:00.1")}
	withClaims.Containers[0].DynamicResources = []*podresourcesapi.DynamicResource{dra("trainer-0-extended-resources-x7k2p", "0000:29:00.2", "0000:18:00.1")}
	both := podWith("default", "both", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{"0000:3b:01.2"}})
	both.Containers[1].DynamicResources = []*podresourcesapi.DynamicResource{dra("c", "0000:18:00.1")}
	sock := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{withClaims, both}})
	for _, tc := range []struct {
		pod, resource string
		want          []string
	}{
		{"trainer-0", "", []string{"0000:18:00.1", "0000:29:00.2"}},                             // once each, though two containers list the claim
		{"trainer-0", "mellanox.com/mlnx_sriov_rdma", []string{"0000:18:00.1", "0000:29:00.2"}}, // no device plugin device of it
		{"both", "mellanox.com/rails", []string{"0000:3b:01.2"}},                                // the device plugin's first
		{"both", "", []string{"0000:18:00.1"}},
	} {
		ids, err := devices(NewKubeletPodResources(sock), "default", tc.pod, tc.resource)
		require.NoError(t, err)
		require.Equal(t, tc.want, ids, "%s %q", tc.pod, tc.resource)
	}
}

// The seed's NAD (no resourceName in its config) behind Multus, which
// passes no deviceID for a VF the pod got through DRA: ADD attaches the
// pod's VF of fastpath's DRA driver.
func TestAddResolvesDRAVFWithoutResourceName(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	a := e.standIn("ens1f1v0")
	p := podWith("default", "nccl-seed")
	p.Containers[1].DynamicResources = []*podresourcesapi.DynamicResource{dra("nccl-seed-extended-resources-abcde", "0000:3b:01.2")}
	sock := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{p}})
	e.p.NewPodResources = NewKubeletPodResources
	e.p.Node.PodResourcesSocket = sock
	conf := e.conf(`"podResourcesSocket":"` + sock + `"`)
	podNS := e.pod()
	args := e.args(conf, podNS, "c1", "net1")
	args.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=nccl-seed"
	var out bytes.Buffer
	e.p.Stdout = &out
	require.NoError(t, e.p.Add(args))
	require.Contains(t, out.String(), `"pciID": "0000:3b:01.2"`)
	require.NoError(t, e.del(conf, podNS, "c1", "net1"))
	e.requireRestored(a, "0000:3b:01.2")
}

// Only the driver's VF classes name VFs: not its metadata devices, not
// another vendor's, not a name without "=".
func TestDRAVFNames(t *testing.T) {
	for _, tc := range []struct {
		name, want string
		ok         bool
	}{
		{"rdma.fastpath-k8s.io/vf=0000:18:00.1", "0000:18:00.1", true},
		{"rdma.fastpath-k8s.io/vf-admin-3f0c-uid=0000:18:00.1", "0000:18:00.1", true},
		{"rdma.fastpath-k8s.io/metadata=3f0c-uid_vf", "", false},
		{"k8s.gpu.nvidia.com/gpu=0000:19:00.0", "", false},
		{"rdma.fastpath-k8s.io/vf", "", false},
	} {
		got, ok := draVF(tc.name)
		require.Equal(t, tc.ok, ok, tc.name)
		require.Equal(t, tc.want, got, tc.name)
	}
}
