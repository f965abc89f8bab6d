package main

import (
	"bytes"
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	podresv1 "k8s.io/kubelet/pkg/apis/podresources/v1"
)

// fakeKubelet serves canned PodResources answers over a real unix socket.
type fakeKubelet struct {
	podresv1.UnimplementedPodResourcesListerServer
	alloc *podresv1.AllocatableResourcesResponse
	list  *podresv1.ListPodResourcesResponse
}

func (f *fakeKubelet) GetAllocatableResources(context.Context, *podresv1.AllocatableResourcesRequest) (*podresv1.AllocatableResourcesResponse, error) {
	return f.alloc, nil
}

func (f *fakeKubelet) List(context.Context, *podresv1.ListPodResourcesRequest) (*podresv1.ListPodResourcesResponse, error) {
	return f.list, nil
}

func serve(t *testing.T, f *fakeKubelet) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	l, err := net.Listen("unix", sock)
	require.NoError(t, err)
	srv := grpc.NewServer()
	podresv1.RegisterPodResourcesListerServer(srv, f)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(srv.Stop)
	return sock
}

func TestRun(t *testing.T) {
	sock := serve(t, &fakeKubelet{
		alloc: &podresv1.AllocatableResourcesResponse{Devices: []*podresv1.ContainerDevices{
			{ResourceName: "mellanox.com/mlnx_sriov_rdma", DeviceIds: []string{"0000:40:00.1", "0000:18:00.1"}},
			{ResourceName: "mellanox.com/hca_shared_devices_a", DeviceIds: []string{"0000:18:00.0-0"}},
		}},
		list: &podresv1.ListPodResourcesResponse{PodResources: []*podresv1.PodResources{
			{Namespace: "default", Name: "rdma-e2e", Containers: []*podresv1.ContainerResources{
				{Name: "app", Devices: []*podresv1.ContainerDevices{
					{ResourceName: "mellanox.com/mlnx_sriov_rdma", DeviceIds: []string{"0000:18:00.1"}},
				}},
			}},
			{Namespace: "kube-system", Name: "other", Containers: []*podresv1.ContainerResources{
				{Name: "c", Devices: []*podresv1.ContainerDevices{
					{ResourceName: "mellanox.com/hca_shared_devices_a", DeviceIds: []string{"0000:18:00.0-0"}},
				}},
			}},
		}},
	})

	tests := []struct {
		name string
		args []string
		want string
	}{
		{
			name: "allocatable, every resource, sorted",
			args: []string{"allocatable"},
			want: "mellanox.com/hca_shared_devices_a\t0000:18:00.0-0\n" +
				"mellanox.com/mlnx_sriov_rdma\t0000:18:00.1\n" +
				"mellanox.com/mlnx_sriov_rdma\t0000:40:00.1\n",
		},
		{
			name: "allocatable, one resource",
			args: []string{"allocatable", "--resource", "mellanox.com/mlnx_sriov_rdma"},
			want: "mellanox.com/mlnx_sriov_rdma\t0000:18:00.1\nmellanox.com/mlnx_sriov_rdma\t0000:40:00.1\n",
		},
		{
			name: "allocatable, unknown resource prints nothing",
			args: []string{"allocatable", "--resource", "example.com/none"},
			want: "",
		},
		{
			name: "list, one pod",
			args: []string{"list", "--pod", "default/rdma-e2e"},
			want: "default/rdma-e2e\tapp\tmellanox.com/mlnx_sriov_rdma\t0000:18:00.1\n",
		},
		{
			name: "list, one resource",
			args: []string{"list", "--resource", "mellanox.com/hca_shared_devices_a"},
			want: "kube-system/other\tc\tmellanox.com/hca_shared_devices_a\t0000:18:00.0-0\n",
		},
		{
			name: "list, pod gone prints nothing",
			args: []string{"list", "--pod", "default/gone"},
			want: "",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(append([]string{"--socket", sock}, tt.args...), &stdout, &stderr)
			require.NoError(t, err, stderr.String())
			require.Equal(t, tt.want, stdout.String())
		})
	}
}

func TestRunErrors(t *testing.T) {
	sock := serve(t, &fakeKubelet{})
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"relative socket", []string{"--socket", "pod-resources/kubelet.sock", "list"}, "absolute path"},
		{"no command", []string{"--socket", sock}, "want a command"},
		{"unknown command", []string{"--socket", sock, "get"}, `unknown command "get"`},
		{"pod without namespace", []string{"--socket", sock, "list", "--pod", "rdma-e2e"}, "NAMESPACE/NAME"},
		{"no kubelet", []string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "allocatable"}, "GetAllocatableResources"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := run(tt.args, &stdout, &stderr)
			require.ErrorContains(t, err, tt.want)
			require.Empty(t, stdout.String())
		})
	}
}
