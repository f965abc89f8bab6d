package dra

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// A claim's PCIDEVICE_<PREFIX>_<NAME>_INFO is the device plugin's
// (plugin.NewDeviceInfo): fastpath's fields and sriov-network-device-plugin's
// generic, rdma and vfio objects.
func TestClaimInfoEnvHasPeerKeys(t *testing.T) {
	snap, err := nic.NewScanner(filepath.Join("..", "..", "..", "..", "testdata", "sysfs", "edge")).Scan()
	require.NoError(t, err)
	res := &pool.Resource{Prefix: "mellanox.com", Name: "vfs", Kind: pool.Exclusive, ServedBy: pool.ServedByDRA}
	var devs []claimDevice
	for i := range snap.Devices {
		if a := snap.Devices[i].PCIAddress; a == "0000:86:00.1" || a == "0000:86:00.3" {
			devs = append(devs, claimDevice{res: res, dev: &snap.Devices[i]})
		}
	}
	require.Len(t, devs, 2)
	spec, err := claimSpec(CDIClass, devs, devs, rdma.RDMACMPath, "/")
	require.NoError(t, err)
	var info string
	for _, kv := range spec.ContainerEdits.Env {
		if v, ok := strings.CutPrefix(kv, "PCIDEVICE_MELLANOX_COM_VFS_INFO="); ok {
			info = v
		}
	}
	require.Equal(t, `{"0000:86:00.1":{"pciAddress":"0000:86:00.1","vfioDevices":["/dev/vfio/vfio","/dev/vfio/71"],`+
		`"pfPciAddress":"0000:86:00.0","pfNetdev":"ibp134s0","linkType":"InfiniBand","numaNode":-1,`+
		`"generic":{"deviceID":"0000:86:00.1"},"vfio":{"dev-mount":"/dev/vfio/71","mount":"/dev/vfio/vfio"}},`+
		`"0000:86:00.3":{"pciAddress":"0000:86:00.3","rdmaDevice":"mlx5_3",`+
		`"charDevices":["/dev/infiniband/uverbs3","/dev/infiniband/umad3","/dev/infiniband/issm3","/dev/infiniband/rdma_cm"],`+
		`"netdev":"ibp134s0v2","pfPciAddress":"0000:86:00.0","pfNetdev":"ibp134s0","linkType":"InfiniBand","numaNode":-1,`+
		`"generic":{"deviceID":"0000:86:00.3"},`+
		`"rdma":{"issm":"/dev/infiniband/issm3","rdma_cm":"/dev/infiniband/rdma_cm","rdma_dev":"mlx5_3","umad":"/dev/infiniband/umad3","uverbs":"/dev/infiniband/uverbs3"}}}`,
		info)
}
