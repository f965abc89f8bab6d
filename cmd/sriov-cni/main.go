// Command sriov is fastpath's CNI plugin (installed as /opt/cni/bin/sriov):
// it moves a ConnectX SR-IOV VF's netdev and RDMA device into the pod,
// applies the VF's settings on its PF, runs IPAM, and on DEL puts
// everything back.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/fastpath-k8s/fastpath/cmd/sriov-cni/internal/plugin"
)

func main() {
	skel.PluginMainFuncs(plugin.New().Funcs(),
		version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0"),
		"fastpath sriov CNI: ConnectX SR-IOV VFs with their RDMA devices")
}
