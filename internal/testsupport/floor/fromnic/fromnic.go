//go:build linux

// Package fromnic takes a floor pass's VFs (package floor) from a scan of
// package nic, for the benchmarks that set a scan against the floor and
// the floor's own tests. It is apart from package floor so that
// test/regfloor, which makes passes, links no fastpath discovery code.
// Like all of internal/testsupport it stands beside the tests, above
// every layer it imports; no production binary links it.
package fromnic

import (
	"fmt"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// VFs are the VFs of snap as a floor pass reads them; an error names a VF
// that lacks a piece the pass reads (a netdev, an RDMA device, a char
// device, a VF index).
func VFs(snap *nic.Snapshot) ([]floor.VF, error) {
	var vfs []floor.VF
	for _, d := range snap.Devices {
		if !d.IsVF() {
			continue
		}
		v := floor.VF{Address: d.PCIAddress, PF: d.PFAddress, Index: d.VFIndex, Netdev: d.Netdev, RDMA: d.RDMADevice, Port: 1}
		for _, c := range d.CharDevices {
			switch c.Kind {
			case rdma.KindUmad:
				v.Umad = c.Name
			case rdma.KindUverbs:
				v.Uverbs = c.Name
			}
		}
		if v.Netdev == "" || v.RDMA == "" || v.Umad == "" || v.Uverbs == "" || v.Index < 0 {
			return nil, fmt.Errorf("VF %s is missing a piece a floor pass reads: %+v", d.PCIAddress, v)
		}
		vfs = append(vfs, v)
	}
	return vfs, nil
}
