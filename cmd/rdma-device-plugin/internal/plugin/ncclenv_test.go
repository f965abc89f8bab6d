package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// kubeletMerge is what the kubelet does with the Allocate responses of the
// resources one container holds (pkg/kubelet/cm/devicemanager,
// podDevices.deviceRunContainerOptions, v1.37): it walks them in map
// order, keeps the first value of each variable and of each device's
// container path, and only logs a conflicting one. It returns the merged
// environment and the conflicts the kubelet would log.
func kubeletMerge(resps []*pluginapi.ContainerAllocateResponse) (map[string]string, []string) {
	envs, devs := map[string]string{}, map[string]string{}
	var conflicts []string
	for _, r := range resps {
		for k, v := range r.Envs {
			if e, ok := envs[k]; ok {
				if e != v {
					conflicts = append(conflicts, fmt.Sprintf("env %s: %q and %q", k, e, v))
				}
				continue
			}
			envs[k] = v
		}
		for _, d := range r.Devices {
			if h, ok := devs[d.ContainerPath]; ok {
				if h != d.HostPath {
					conflicts = append(conflicts, fmt.Sprintf("device %s: %s and %s", d.ContainerPath, h, d.HostPath))
				}
				continue
			}
			devs[d.ContainerPath] = d.HostPath
		}
	}
	return envs, conflicts
}

// permutations calls f with every order of n items.
func permutations(n int, f func(order []int)) {
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	var rec func(k int)
	rec = func(k int) {
		if k == n {
			f(order)
			return
		}
		for i := k; i < n; i++ {
			order[k], order[i] = order[i], order[k]
			rec(k + 1)
			order[k], order[i] = order[i], order[k]
		}
	}
	rec(0)
}

// A container holding devices of every pool of a config, merged by the
// kubelet in any order, never sees two values of NCCL_IB_HCA or
// UCX_NET_DEVICES (or of any other variable or device path): one pool per
// config sets them (pool.Resource.NCCLEnv).
func TestOneNCCLEnvPerContainer(t *testing.T) {
	for _, tc := range []struct {
		config string
		host   string
		nccl   string // the pool that sets NCCL_IB_HCA
	}{
		{"combined.json", "dgx-h100", "mellanox.com/mlnx_sriov_rdma"},
		{"rail-spread.json", "dgx-h100", "mellanox.com/rail_vfs"},
		{"rdma-shared.json", "dgx-h100", "rdma/hca_shared_devices_a"},
		{"sriov-dp.json", "dgx-h100", "mellanox.com/mlnx_sriov_rdma"},
	} {
		t.Run(tc.config, func(t *testing.T) {
			cfgPath, err := filepath.Abs(filepath.Join("..", "..", "..", "..", "testdata", "config", tc.config))
			require.NoError(t, err)
			src, err := NewSource(cfgPath, nic.NewScanner(fixtureRoot(tc.host)), slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			h := newHarness(t, func(o *Options) { o.Scan = src.Scan })
			h.run()
			first, err := src.Scan(false) // what the manager serves
			require.NoError(t, err)
			var resources []string
			for _, p := range first.Pools {
				resources = append(resources, p.ResourceName())
			}
			regs := h.registered(resources...)

			// One device of each pool for the same container.
			var resps []*pluginapi.ContainerAllocateResponse
			for _, r := range resources {
				c := h.client(regs[r].Endpoint)
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
				require.NoError(t, err)
				lw, err := stream.Recv()
				require.NoError(t, err)
				cancel()
				require.NotEmpty(t, lw.Devices, r)
				resp, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
					{DevicesIds: []string{lw.Devices[0].ID}}}})
				require.NoError(t, err, r)
				cr := resp.ContainerResponses[0]
				_, sets := cr.Envs["NCCL_IB_HCA"]
				require.Equal(t, r == tc.nccl, sets, "%s sets NCCL_IB_HCA", r)
				_, sets = cr.Envs["UCX_NET_DEVICES"]
				require.Equal(t, r == tc.nccl, sets, "%s sets UCX_NET_DEVICES", r)
				resps = append(resps, cr)
			}
			var want map[string]string
			permutations(len(resps), func(order []int) {
				in := make([]*pluginapi.ContainerAllocateResponse, len(order))
				for i, j := range order {
					in[i] = resps[j]
				}
				envs, conflicts := kubeletMerge(in)
				require.Empty(t, conflicts, "merge order %v", order)
				require.True(t, strings.HasPrefix(envs["NCCL_IB_HCA"], "=mlx5_"), envs["NCCL_IB_HCA"])
				if want == nil {
					want = envs
				}
				require.Equal(t, want, envs, "the container's environment does not depend on the merge order")
			})
		})
	}
}

// The model of the kubelet's merge is checked on the case the rule
// prevents: two pools that both set the variables conflict.
func TestKubeletMergeSeesConflicts(t *testing.T) {
	a := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NCCL_IB_HCA": "=mlx5_12:1", "A": "1"}}
	b := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{"NCCL_IB_HCA": "=mlx5_8:1", "B": "2"}}
	envs, conflicts := kubeletMerge([]*pluginapi.ContainerAllocateResponse{a, b})
	require.Equal(t, map[string]string{"NCCL_IB_HCA": "=mlx5_12:1", "A": "1", "B": "2"}, envs, "first wins")
	require.Equal(t, []string{`env NCCL_IB_HCA: "=mlx5_12:1" and "=mlx5_8:1"`}, conflicts)
}
