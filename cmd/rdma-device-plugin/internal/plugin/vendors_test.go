package plugin

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// Pools of Intel E810 (irdma) and Broadcom (bnxt_re) functions are served
// as ConnectX pools are: the container gets its function's char devices
// and NCCL_IB_HCA / UCX_NET_DEVICES name its RDMA device whatever its
// vendor; a pool of functions without an RDMA device (iavf VFs: irdma
// gives E810 VFs none in Linux 6.12) gets the netdev's PCI address and no
// NCCL variables, as does one of igbvf VFs on the sysfs captured from a
// real Linux 6.12 guest (make e2e-kernel).
func TestAllocateAnyVendor(t *testing.T) {
	for _, tc := range []struct {
		name, host, config string
		resource           string
		// want* are the allocation of the pool's first device.
		wantAddr string
		wantHCA  string // "" = no NCCL_IB_HCA
		wantDevs []string
	}{
		{"e810 vfs", "e810-irdma", `{"resourceList":[{"resourceName":"e810_vfs","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"drivers":["iavf"]}}]}`,
			"intel.com/e810_vfs", "0000:3b:01.0", "", nil},
		{"e810 rdma pf", "e810-irdma", `{"resourceList":[{"resourceName":"e810_rdma","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"isRdma":true}}]}`,
			"intel.com/e810_rdma", "0000:3b:00.1", "=irdma1:1", []string{"/dev/infiniband/uverbs1", "/dev/infiniband/rdma_cm"}},
		{"igb vfs on the real kernel's sysfs", "../sysfs-captured/igb-qemu", `{"resourceList":[{"resourceName":"igb_vfs","resourcePrefix":"intel.com","selectors":{"vendors":["8086"],"drivers":["igbvf"]}}]}`,
			"intel.com/igb_vfs", "0000:01:10.0", "", nil},
		{"bnxt rdma vfs", "bnxt-re", `{"resourceList":[{"resourceName":"bnxt_rdma","resourcePrefix":"broadcom.com","selectors":{"vendors":["14e4"],"drivers":["bnxt_en"],"isRdma":true}}]}`,
			"broadcom.com/bnxt_rdma", "0000:41:00.2", "=bnxt_re2:1", []string{"/dev/infiniband/uverbs2", "/dev/infiniband/rdma_cm"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfgPath := filepath.Join(t.TempDir(), "config.json")
			require.NoError(t, os.WriteFile(cfgPath, []byte(tc.config), 0o644))
			src, err := NewSource(cfgPath, nic.NewScanner(fixtureRoot(tc.host)), slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			h := newHarness(t, func(o *Options) { o.Scan = src.Scan })
			h.run()
			c := h.client(h.registered(tc.resource)[tc.resource].Endpoint)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
			require.NoError(t, err)
			lw, err := stream.Recv()
			require.NoError(t, err)
			require.NotEmpty(t, lw.Devices)
			var id string
			for _, d := range lw.Devices {
				require.Equal(t, pluginapi.Healthy, d.Health, d.ID)
				if d.ID == tc.wantAddr {
					id = d.ID
				}
			}
			require.NotEmpty(t, id, "%s is advertised: %v", tc.wantAddr, lw.Devices)
			resp, err := c.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				{DevicesIds: []string{id}}}})
			require.NoError(t, err)
			cr := resp.ContainerResponses[0]
			hca, ok := cr.Envs["NCCL_IB_HCA"]
			require.Equal(t, tc.wantHCA != "", ok, "NCCL_IB_HCA: %v", cr.Envs)
			require.Equal(t, tc.wantHCA, hca)
			var devs []string
			for _, d := range cr.Devices {
				devs = append(devs, d.ContainerPath)
			}
			for _, want := range tc.wantDevs {
				require.Contains(t, devs, want)
			}
			if tc.wantHCA == "" {
				require.Empty(t, devs, "a function without an RDMA device gets no char devices")
			}
		})
	}
}
