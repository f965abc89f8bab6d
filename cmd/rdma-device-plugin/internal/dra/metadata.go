package dra

import (
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	metadatav1beta1 "k8s.io/dynamic-resource-allocation/api/metadata/v1beta1"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// Device metadata (KEP-5304): with kubeletplugin.EnableDeviceMetadata the
// helper writes, for each request of a prepared claim, a metadata file
// under the plugin directory (dra-device-metadata/<ns>_<claim>/<request>/
// metadata.json) and a CDI spec of its own in the CDI directory
// ("rdma.fastpath-k8s.io/metadata=<claim UID>_<request>") that bind-mounts
// it read-only into the claim's containers at
// /var/run/kubernetes.io/dra-device-attributes/{resourceclaims/<claim>|
// resourceclaimtemplates/<pod's claim name>}/<request>/
// rdma.fastpath-k8s.io-metadata.json. Unprepare removes both (the helper,
// after the driver's Unprepare succeeds).
//
// The file lists each VF of the request with the attributes its
// ResourceSlice device has (resource.kubernetes.io/pciBusID, pcieRoot,
// numaNode, rdmaDevice, pfPciAddress, pfNetdev, netdev, vfIndex, linkType,
// driver, the Multus ones) and the ones only a workload needs, below.
// netdev is the VF's name in the host netns at Prepare: the name the pod
// sees (the NAD's, "net1"), its MAC and addresses are given by Multus and
// the CNI after Prepare; the CNI tells the driver once its ADD is through
// and the driver rewrites the request's file with the VF's NetworkData
// then (netdata.go), before the pod's containers start.

// MetadataCDIKind is the CDI kind of the helper's metadata specs: a
// request's metadata device is "<MetadataCDIKind>=<claim UID>_<request>",
// which the kubelet lists in PodResources beside the VFs' own.
const MetadataCDIKind = DriverName + "/metadata"

// metadataVersions are the metadata API versions the files are written in.
var metadataVersions = []schema.GroupVersion{metadatav1beta1.SchemeGroupVersion}

// Attributes in the metadata file only (a workload's, not a scheduler's).
const (
	// MetaUverbs is the VF's uverbs char device in the container
	// ("/dev/infiniband/uverbs14"), what libibverbs opens.
	MetaUverbs = "uverbs"
	// MetaCharDevices are all of the VF's device nodes in the container,
	// comma-separated: its uverbs, umad and issm devices, or its vfio
	// group and /dev/vfio/vfio for a VF bound to vfio-pci.
	MetaCharDevices = "charDevices"
	// MetaRDMACM is the node's rdma_cm, which the claim's spec gives the
	// container beside the VF's own devices.
	MetaRDMACM = "rdmaCM"
)

// deviceMetadata is the metadata of one VF: its slice attributes and its
// device nodes. rdmaCM is the node's rdma_cm, "" when it has none.
func deviceMetadata(e *entry, rdmaCM string) map[string]resourceapi.DeviceAttribute {
	out := make(map[string]resourceapi.DeviceAttribute, len(e.attrs)+3)
	for k, v := range e.attrs {
		out[string(k)] = v
	}
	str := func(name, v string) {
		if v != "" {
			out[name] = resourceapi.DeviceAttribute{StringValue: &v}
		}
	}
	for _, c := range e.dev.CharDevices {
		if c.Kind == rdma.KindUverbs && !e.dev.IsVFIO() {
			str(MetaUverbs, c.Path)
		}
	}
	str(MetaCharDevices, strings.Join(devicePaths(e.dev), ","))
	if e.dev.UsesRDMA() {
		str(MetaRDMACM, rdmaCM)
	}
	return out
}

// withMetadata is a prepared device as the helper is told of it: with its
// metadata (attributes, and network data once the CNI gave it) when it has
// some.
func withMetadata(d kubeletplugin.Device, attrs map[string]resourceapi.DeviceAttribute, net *resourceapi.NetworkDeviceData) kubeletplugin.Device {
	if len(attrs) > 0 || net != nil {
		d.Metadata = &kubeletplugin.DeviceMetadata{Attributes: attrs, NetworkData: net}
	}
	return d
}
