package dra

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// CDI vendor and class of the VFs: device "rdma.fastpath-k8s.io/vf=<bdf>".
// Multus (v4.3.0) takes what follows "=" in the CDI names that the
// kubelet's PodResources API lists for a claim as the deviceID it hands to
// the CNI, so the name of a VF's CDI device is its PCI address.
//
// A VF has one such name, and every claim's spec that defines it defines
// the same qualified name: the CDI cache drops a name that two spec files
// define (a conflict), and the runtime then fails to start any container
// that references it. Only admin access lets a second claim prepare a VF
// that a claim holds, so a claim with an admin-access result names its
// devices in a class of its own, AdminCDIClass, and "vf" stays the name of
// the one claim that holds a VF exclusively.
const (
	CDIVendor = DriverName
	CDIClass  = "vf"
	CDIKind   = CDIVendor + "/" + CDIClass
)

// adminCDIClassPrefix starts the CDI class of an admin-access claim.
const adminCDIClassPrefix = "vf-admin-"

// AdminCDIClass is the CDI class of the devices of a claim with an
// admin-access result: "vf-admin-<claim UID>", which no other claim can
// define. What follows "=" stays the VF's PCI address.
func AdminCDIClass(claim types.UID) string { return adminCDIClassPrefix + string(claim) }

// CDIDeviceID is the fully qualified CDI name of the VF at pciAddress in
// class (cdiClass: CDIClass for a claim without admin access).
func CDIDeviceID(class, pciAddress string) string {
	return parser.QualifiedName(CDIVendor, class, pciAddress)
}

// cdiClass is the CDI class of a claim's devices: CDIClass, or the
// claim's own AdminCDIClass when admin is set.
func cdiClass(claim types.UID, admin bool) (string, error) {
	if !admin {
		return CDIClass, nil
	}
	class := AdminCDIClass(claim)
	if err := parser.ValidateClassName(class); err != nil {
		return "", fmt.Errorf("cdi: claim UID %q cannot name a CDI class: %w", claim, err)
	}
	return class, nil
}

// CDISpecName is the file name of a claim's CDI spec: one transient spec
// per claim, named after its UID (whatever the class of its devices, so
// the name is the same for an admin-access claim), removed on Unprepare.
func CDISpecName(claim types.UID) string {
	return cdi.GenerateTransientSpecName(CDIVendor, CDIClass, string(claim)) + ".json"
}

// rdmaPort is the port of an mlx5 device (one port per function).
const rdmaPort = 1

// claimDevice is one VF of a claim being prepared.
type claimDevice struct {
	res *pool.Resource
	dev *nic.Device
}

// claimSpec is the CDI spec of one claim, of the given CDI class: a CDI
// device per VF of devs with exactly that VF's char devices (or its vfio
// group) and, for the claim as a whole, the node's rdma_cm (a host path,
// "" when none) when one of devs has an RDMA device, and the environment
// the device plugin's Allocate gives a container for the VFs of env —
// PCIDEVICE_<PREFIX>_<NAME>(_INFO) per pool, NCCL_IB_HCA and
// UCX_NET_DEVICES naming all of them of the pool that sets them
// (pool.Resource.NCCLEnv) at once. env is devs, or a superset of it in
// the order every claim of the pod uses (see envPeers). Host paths are
// under root, the node's.
func claimSpec(class string, devs, env []claimDevice, rdmaCM, root string) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{Kind: CDIVendor + "/" + class}
	needCM := false
	for _, c := range devs {
		d := c.dev
		var nodes []*cdispec.DeviceNode
		for _, p := range devicePaths(d) {
			nodes = append(nodes, &cdispec.DeviceNode{Path: p, HostPath: hostPath(root, p), Permissions: "rw"})
		}
		if d.UsesRDMA() && rdmaCM != "" {
			needCM = true
		}
		spec.Devices = append(spec.Devices, cdispec.Device{Name: d.PCIAddress, ContainerEdits: cdispec.ContainerEdits{DeviceNodes: nodes}})
	}
	addrs := map[string][]string{} // env name → PCI addresses
	infos := map[string]map[string]plugin.DeviceInfo{}
	var envOrder, hcas []string
	for _, c := range env {
		d := c.dev
		cm := ""
		if d.UsesRDMA() {
			cm = rdmaCM
		}
		name := plugin.EnvName(c.res.Prefix, c.res.Name)
		if _, ok := addrs[name]; !ok {
			envOrder = append(envOrder, name)
			infos[name] = map[string]plugin.DeviceInfo{}
		}
		addrs[name] = append(addrs[name], d.PCIAddress)
		infos[name][d.PCIAddress] = plugin.NewDeviceInfo(d, cm)
		if c.res.NCCLEnv && d.UsesRDMA() {
			hcas = append(hcas, fmt.Sprintf("%s:%d", d.RDMADevice, rdmaPort))
		}
	}
	edits := &cdispec.ContainerEdits{}
	if needCM {
		edits.DeviceNodes = []*cdispec.DeviceNode{{Path: rdmaCM, HostPath: hostPath(root, rdmaCM), Permissions: "rw"}}
	}
	for _, name := range envOrder {
		info, err := json.Marshal(infos[name])
		if err != nil {
			return nil, err
		}
		edits.Env = append(edits.Env, name+"="+strings.Join(addrs[name], ","), name+"_INFO="+string(info))
	}
	if len(hcas) > 0 {
		// NCCL's exact-match syntax ("=" first: mlx5_1 does not also
		// match mlx5_12), as the device plugin's Allocate writes it.
		edits.Env = append(edits.Env, "NCCL_IB_HCA=="+strings.Join(hcas, ","), "UCX_NET_DEVICES="+strings.Join(hcas, ","))
	}
	if len(edits.Env) > 0 || len(edits.DeviceNodes) > 0 {
		spec.ContainerEdits = *edits
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, fmt.Errorf("cdi: %w", err)
	}
	spec.Version = v
	return spec, nil
}

// devicePaths are the device nodes of one VF alone (host paths, without
// any root): its vfio group for a vfio-pci VF, else its RDMA char devices.
func devicePaths(d *nic.Device) []string {
	if d.IsVFIO() {
		return d.VFIODevices
	}
	return d.CharDevicePaths()
}

func hostPath(root, path string) string {
	if root == "" || root == "/" {
		return path
	}
	return filepath.Join(root, path)
}

// cdiStaging is the driver's staging directory inside the CDI directory
// (internal/cdiwrite); the device plugin, in the same process, has its
// own.
const cdiStaging = ".fastpath-dra-staging"
