package doctor

import (
	"errors"
	"fmt"

	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// checkProvision says, for each PF a SriovNetworkNodePolicy owns, whether
// the node has what the policy asks for and, when not, why: VFs in use,
// numVfs above sriov_totalvfs, SR-IOV off in the firmware (sriov_totalvfs
// 0: how users of sriov-network-device-plugin hit it, its issue #601), a
// port of the other link type, or simply not provisioned yet.
func (h *host) checkProvision() {
	plan := h.opts.Plan
	if plan.LabelsErr != nil {
		h.add("provision", Fail, "node labels", "the policies with a nodeSelector are not applied: "+plan.LabelsErr.Error(),
			"the plugin reads its Node's labels with its service account: NODE_NAME from the downward API, the token mounted and RBAC get on nodes (deployments/components/provision has them), or pass --node-labels")
	}
	for _, w := range plan.Warnings {
		h.add("provision", Warn, h.opts.PolicyPath, w, "fix the policy's nicSelector or nodeSelector, or drop the policy")
	}
	for _, pf := range plan.PFs {
		subject := pf.Address
		if pf.Netdev != "" {
			subject += " (" + pf.Netdev + ")"
		}
		// mlxconfig is ConnectX's; other vendors' firmware has its own tool.
		mlx := true
		if d, ok := h.snap.Device(pf.Address); ok {
			mlx = isConnectX(d)
		}
		have := fmt.Sprintf("policy %s wants %d VFs, the PF has %d (sriov_totalvfs %d)", pf.Policy, pf.Want, pf.NumVFs, pf.TotalVFs)
		switch {
		case errors.Is(pf.Refused, provision.ErrFirmware):
			fix := fmt.Sprintf("mlxconfig -d %s set SRIOV_EN=1 NUM_OF_VFS=%d, then reboot (or mlxfwreset); the plugin creates the VFs at its next start", pf.Address, max(pf.Want, 8))
			if !mlx {
				fix = fmt.Sprintf("enable SR-IOV for %s in the server's BIOS/UEFI and in the NIC's firmware (its vendor's tool), then reboot; the plugin creates the VFs at its next start", pf.Address)
			}
			h.add("provision", Fail, subject, have+": SR-IOV is off in the NIC's firmware", fix)
		case errors.Is(pf.Refused, provision.ErrTotalVFs):
			fix := fmt.Sprintf("lower numVfs to %d or less, or mlxconfig -d %s set NUM_OF_VFS=%d and reboot", pf.TotalVFs, pf.Address, pf.Want)
			if !mlx {
				fix = fmt.Sprintf("lower numVfs to %d or less (sriov_totalvfs is what the NIC's firmware allows)", pf.TotalVFs)
			}
			h.add("provision", Fail, subject, have+": numVfs is above what the firmware allows", fix)
		case errors.Is(pf.Refused, provision.ErrBusy):
			h.add("provision", Warn, subject, pf.Refused.Error(),
				"the plugin retries every 30 s and changes the PF once those pods are gone; drain the node to do it now")
		case errors.Is(pf.Refused, provision.ErrLinkType), pf.Refused != nil:
			fix := "make the policy's linkType match the port, or change the port's link type with mlxconfig"
			if !mlx {
				fix = "make the policy's linkType match the port"
			}
			h.add("provision", Fail, subject, pf.Refused.Error(), fix)
		case pf.External && pf.NumVFs < pf.Want:
			h.add("provision", Fail, subject, have+" (externallyManaged: fastpath creates none)",
				fmt.Sprintf("create them: echo %d > /sys/bus/pci/devices/%s/sriov_numvfs", pf.Want, pf.Address))
		case len(pf.Steps) > 0:
			h.add("provision", Warn, subject, have+": not provisioned yet ("+pf.Summary()+")",
				"start the plugin with --policy (it provisions before registering), or run rdma-device-plugin provision --policy FILE")
		default:
			h.add("provision", OK, subject, fmt.Sprintf("%d VFs, as policy %s says", pf.NumVFs, pf.Policy), "")
		}
	}
}
