package plugin

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func fixtureDevice(t *testing.T, host, addr string) nic.Device {
	t.Helper()
	for _, d := range scanFixture(t, host).Devices {
		if d.PCIAddress == addr {
			return d
		}
	}
	t.Fatalf("%s: no device %s", host, addr)
	return nic.Device{}
}

// PCIDEVICE_<PREFIX>_<NAME>_INFO carries, next to fastpath's fields, the
// objects sriov-network-device-plugin's info providers write (generic,
// rdma, vfio; pkg/infoprovider), with their keys, so that a pod reading
// .["<pci>"].rdma.uverbs after the migration still finds its device.
func TestInfoEnvHasPeerKeys(t *testing.T) {
	noIssm := fixtureDevice(t, "edge", "0000:af:00.2") // a RoCE VF, here without issm
	var cds []rdma.CharDevice
	for _, c := range noIssm.CharDevices {
		if c.Kind != rdma.KindIssm {
			cds = append(cds, c)
		}
	}
	noIssm.CharDevices = cds
	tests := []struct {
		name   string
		dev    nic.Device
		rdmaCM string
		want   string
	}{
		{"RDMA VF", fixtureDevice(t, "dgx-h100", "0000:18:00.1"), rdma.RDMACMPath,
			`{"0000:18:00.1":{"pciAddress":"0000:18:00.1","rdmaDevice":"mlx5_12",` +
				`"charDevices":["/dev/infiniband/uverbs14","/dev/infiniband/umad12","/dev/infiniband/issm12","/dev/infiniband/rdma_cm"],` +
				`"netdev":"ibp24s0v0","pfPciAddress":"0000:18:00.0","pfNetdev":"ibp24s0","linkType":"InfiniBand","numaNode":0,` +
				`"generic":{"deviceID":"0000:18:00.1"},` +
				`"rdma":{"issm":"/dev/infiniband/issm12","rdma_cm":"/dev/infiniband/rdma_cm","rdma_dev":"mlx5_12","umad":"/dev/infiniband/umad12","uverbs":"/dev/infiniband/uverbs14"}}}`},
		{"RDMA VF without issm, node without rdma_cm", noIssm, "",
			`{"0000:af:00.2":{"pciAddress":"0000:af:00.2","rdmaDevice":"mlx5_4",` +
				`"charDevices":["/dev/infiniband/uverbs4","/dev/infiniband/umad4"],` +
				`"netdev":"enp175s0f0v0","pfPciAddress":"0000:af:00.0","pfNetdev":"enp175s0f0np0","linkType":"Ethernet","numaNode":1,` +
				`"generic":{"deviceID":"0000:af:00.2"},` +
				`"rdma":{"rdma_dev":"mlx5_4","umad":"/dev/infiniband/umad4","uverbs":"/dev/infiniband/uverbs4"}}}`},
		{"vfio-pci VF", fixtureDevice(t, "edge", "0000:86:00.1"), rdma.RDMACMPath,
			`{"0000:86:00.1":{"pciAddress":"0000:86:00.1","vfioDevices":["/dev/vfio/vfio","/dev/vfio/71"],` +
				`"pfPciAddress":"0000:86:00.0","pfNetdev":"ibp134s0","linkType":"InfiniBand","numaNode":-1,` +
				`"generic":{"deviceID":"0000:86:00.1"},` +
				`"vfio":{"dev-mount":"/dev/vfio/71","mount":"/dev/vfio/vfio"}}}`},
		{"VF without RDMA device", fixtureDevice(t, "edge", "0000:86:00.4"), rdma.RDMACMPath,
			`{"0000:86:00.4":{"pciAddress":"0000:86:00.4","netdev":"ibp134s0v3","pfPciAddress":"0000:86:00.0","pfNetdev":"ibp134s0","linkType":"InfiniBand","numaNode":-1,` +
				`"generic":{"deviceID":"0000:86:00.4"}}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := pool.Pool{Resource: pool.Resource{Prefix: "mellanox.com", Name: "rails", Kind: pool.Exclusive}, Devices: []nic.Device{tt.dev}}
			s := &server{root: "/"}
			cr := s.containerResponse(served{pool: p, rdmaCM: tt.rdmaCM}, []*nic.Device{&p.Devices[0]})
			require.Equal(t, tt.want, cr.Envs["PCIDEVICE_MELLANOX_COM_RAILS_INFO"])
		})
	}
}
