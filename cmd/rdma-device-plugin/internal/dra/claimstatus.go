package dra

import (
	"context"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	resourceapply "k8s.io/client-go/applyconfigurations/resource/v1"
)

// The network data the CNI gives (netdata.go) goes into the claim's status
// too (KEP-4817, status.devices[].networkData; DRAResourceClaimDeviceStatus
// is GA in v1.37, no gate to set), where controllers and users see which
// interface and addresses a pod's VF got. Unlike the metadata file it is
// not needed before the containers start, so it is written after the CNI
// has its answer: the API server's time is not the CNI's. It is applied
// server-side with the driver as field manager: the driver owns its own
// devices' entries, which it writes whole each time (every VF of the claim
// that has network data), and another driver's entries are untouched.
// The API server drops them when the claim is deallocated. The driver's
// ServiceAccount needs resourceclaims/status (patch) and, for the
// granular status authorization (DRAResourceClaimGranularStatusAuthorization,
// beta and on in v1.37), the verb associated-node:patch on
// resourceclaims/driver named after the driver (deployments' rbac.yaml).

// claimStatusTimeout bounds one status write.
const claimStatusTimeout = 10 * time.Second

// writeClaimStatus applies, in the background, the network data of the
// claim's VFs as the checkpoint has them when its turn comes: writes of
// one driver are serialized, so the last one applies the latest data.
func (d *Driver) writeClaimStatus(uid types.UID) {
	go func() {
		d.statusMu.Lock()
		defer d.statusMu.Unlock()
		d.mu.Lock()
		rec := d.cp.Claims[uid]
		var ac *resourceapply.ResourceClaimApplyConfiguration
		if rec != nil {
			ac = claimStatus(uid, rec)
		}
		d.mu.Unlock()
		if ac == nil {
			return // unprepared meanwhile: its status goes with its allocation
		}
		ctx, cancel := context.WithTimeout(context.Background(), claimStatusTimeout)
		defer cancel()
		_, err := d.opts.KubeClient.ResourceV1().ResourceClaims(rec.Namespace).ApplyStatus(ctx, ac, metav1.ApplyOptions{FieldManager: DriverName, Force: true})
		switch {
		case apierrors.IsForbidden(err):
			d.log.Warn("dra: claim status not written: the driver's ServiceAccount may not (resourceclaims/status patch, and associated-node:patch on resourceclaims/driver "+DriverName+")",
				"claim", rec.Namespace+"/"+rec.Name, "err", err)
		case err != nil:
			d.log.Warn("dra: claim status not written", "claim", rec.Namespace+"/"+rec.Name, "err", err)
		default:
			d.log.Debug("dra: claim status has its VFs' network data", "claim", rec.Namespace+"/"+rec.Name)
		}
	}()
}

// claimStatus is the driver's part of a claim's status: an entry per VF
// with network data.
func claimStatus(uid types.UID, rec *preparedClaim) *resourceapply.ResourceClaimApplyConfiguration {
	st := resourceapply.ResourceClaimStatus()
	seen := map[string]bool{}
	for _, pd := range rec.Devices {
		nd := pd.NetworkData
		if nd == nil || seen[pd.Pool+"/"+pd.Device] {
			continue
		}
		seen[pd.Pool+"/"+pd.Device] = true
		net := resourceapply.NetworkDeviceData().WithInterfaceName(nd.InterfaceName).WithIPs(nd.IPs...)
		if nd.HardwareAddress != "" {
			net.WithHardwareAddress(nd.HardwareAddress)
		}
		st.WithDevices(resourceapply.AllocatedDeviceStatus().WithDriver(DriverName).WithPool(pd.Pool).WithDevice(pd.Device).WithNetworkData(net))
	}
	return resourceapply.ResourceClaim(rec.Name, rec.Namespace).WithUID(uid).WithStatus(st)
}
