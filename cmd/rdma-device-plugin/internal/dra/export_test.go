package dra

import (
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// Resources is what the driver publishes for pools when the VFs in
// unhealthy (PCI address → reason) are not usable.
func Resources(poolName string, pools []pool.Pool, unhealthy map[string]string, taint bool) resourceslice.DriverResources {
	return driverResources(poolName, entries(pools), func(e *entry) health {
		if r, ok := unhealthy[e.dev.PCIAddress]; ok {
			return health{reason: r}
		}
		return health{ok: true}
	}, taint)
}

// SamePublication is samePublication.
var SamePublication = samePublication

// SetFailpoint makes d call f at each step boundary of Prepare (before
// Start).
func SetFailpoint(d *Driver, f func(string)) { d.failpoint = f }
