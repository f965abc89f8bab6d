package gpustandin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// CDI kind of the stand-in's GPUs. A GPU's CDI device is named after its
// DRA device ("gpu-0000-19-00-0"), which sorts after any PCI address: in
// a claim that also holds a VF, Multus (v4.3.0, which sorts a claim's CDI
// names) hands the VF's to the CNI first.
const (
	CDIVendor = DriverName
	CDIClass  = "gpu"
)

// EnvPCIBusID is the variable a container gets for its GPU: a stand-in
// for what a real GPU's CDI spec gives (device nodes, libraries).
const EnvPCIBusID = "E2E_GPU_PCI_BUS_ID"

// Driver is the stand-in GPU DRA driver: it publishes the host's GPUs and
// prepares claims with a CDI spec per claim. It is not for production.
type Driver struct {
	node string
	log  *slog.Logger
	cdi  *cdi.Cache

	mu       sync.Mutex // guards the field below
	prepared map[types.UID]string
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// NewDriver returns a driver for node writing CDI specs to cdiDir.
func NewDriver(node, cdiDir string, log *slog.Logger) (*Driver, error) {
	c, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, err
	}
	return &Driver{node: node, log: log, cdi: c, prepared: map[types.UID]string{}}, nil
}

// Resources is what the driver publishes for gpus: one pool named after
// the node.
func (d *Driver) Resources(gpus []GPU) resourceslice.DriverResources {
	s := resourceslice.Slice{}
	for _, g := range gpus {
		s.Devices = append(s.Devices, g.Device)
	}
	return resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{d.node: {Slices: []resourceslice.Slice{s}}}}
}

// PrepareResourceClaims writes a CDI spec per claim with one device per
// GPU of the claim; other drivers' results are skipped.
func (d *Driver) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		spec := &cdispec.Spec{Version: "0.5.0", Kind: CDIVendor + "/" + CDIClass}
		var devs []kubeletplugin.Device
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != DriverName {
				continue
			}
			addr, ok := strings.CutPrefix(r.Device, "gpu-")
			if !ok || len(addr) != len("0000-00-00-0") {
				out[c.UID] = kubeletplugin.PrepareResult{Err: fmt.Errorf("device %s is not one of this driver's", r.Device)}
				break
			}
			addr = addr[:4] + ":" + addr[5:7] + ":" + addr[8:10] + "." + addr[11:]
			spec.Devices = append(spec.Devices, cdispec.Device{Name: r.Device,
				ContainerEdits: cdispec.ContainerEdits{Env: []string{EnvPCIBusID + "=" + addr}}})
			devs = append(devs, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device,
				CDIDeviceIDs: []string{parser.QualifiedName(CDIVendor, CDIClass, r.Device)}})
		}
		if out[c.UID].Err != nil || len(devs) == 0 {
			if _, failed := out[c.UID]; !failed {
				out[c.UID] = kubeletplugin.PrepareResult{}
			}
			continue
		}
		name := cdi.GenerateTransientSpecName(CDIVendor, CDIClass, string(c.UID)) + ".json"
		if err := d.cdi.WriteSpec(spec, name); err != nil {
			out[c.UID] = kubeletplugin.PrepareResult{Err: err}
			continue
		}
		d.prepared[c.UID] = name
		d.log.Info("gpu stand-in: claim prepared", "claim", c.Namespace+"/"+c.Name, "gpus", len(devs))
		out[c.UID] = kubeletplugin.PrepareResult{Devices: devs}
	}
	return out, nil
}

// UnprepareResourceClaims removes the claims' CDI specs (by the name it
// derives from the UID, so a restarted stand-in cleans up too).
func (d *Driver) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = d.cdi.RemoveSpec(cdi.GenerateTransientSpecName(CDIVendor, CDIClass, string(c.UID)) + ".json")
		delete(d.prepared, c.UID)
	}
	return out, nil
}

// HandleError logs background errors.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	d.log.Error("gpu stand-in: "+msg, "err", err, "recoverable", errors.Is(err, kubeletplugin.ErrRecoverable))
}

// WatchHealthStatus: the stand-in reports no health.
func (d *Driver) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}
