package pool

import (
	"fmt"
	"strings"
)

// The kubelet APIs a pool can be served by: a pool is served by exactly
// one of them, so that no VF is ever handed out twice.
const (
	// ServedByDevicePlugin serves the pool as an extended resource over
	// the device plugin API (the default).
	ServedByDevicePlugin = "devicePlugin"
	// ServedByDRA publishes the pool's VFs in ResourceSlices for Dynamic
	// Resource Allocation (resource.k8s.io/v1).
	ServedByDRA = "dra"
)

// MaxDRAResourceName is the longest resource name a DRA pool may have: it
// is published as a device attribute, whose string values are at most 64
// bytes long.
const MaxDRAResourceName = 64

// servedBy reads an exclusive pool's servedBy.
func servedBy(v *value, r *Resource) error {
	if v == nil {
		return nil
	}
	s, err := v.str()
	if err != nil {
		return err
	}
	switch strings.ToLower(s) {
	case "", strings.ToLower(ServedByDevicePlugin):
		r.ServedBy = ServedByDevicePlugin
	case ServedByDRA:
		r.ServedBy = ServedByDRA
		if n := len(r.ResourceName()); n > MaxDRAResourceName {
			return fmt.Errorf("%s: resource name %q is %d bytes long: a pool served by DRA publishes it as a device attribute, at most %d bytes; shorten resourcePrefix or resourceName",
				v.path, r.ResourceName(), n, MaxDRAResourceName)
		}
	default:
		return fmt.Errorf("%s: %q: want %q (the kubelet device plugin API, the default) or %q (Dynamic Resource Allocation)", v.path, s, ServedByDevicePlugin, ServedByDRA)
	}
	return nil
}
