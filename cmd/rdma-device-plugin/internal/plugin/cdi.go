package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// cdiSpecVersion is the lowest CDI version with DeviceNode.HostPath (0.5.0),
// so that older runtimes accept the spec.
const cdiSpecVersion = "0.5.0"

// cdiFilePrefix marks the spec files this plugin owns; it never touches
// other files in the CDI directory.
const cdiFilePrefix = "fastpath-"

// CDISpecPath is the spec file of a pool: <dir>/fastpath-<prefix>_<name>.json.
func CDISpecPath(dir, prefix, name string) string {
	return filepath.Join(dir, cdiFilePrefix+prefix+"_"+name+".json")
}

// CDIDeviceName is the fully qualified CDI name of one PCI function of a
// pool: "<prefix>/<name>=<bdf>".
func CDIDeviceName(p *pool.Pool, bdf string) string { return p.ResourceName() + "=" + bdf }

// cdiSpec builds the spec of a pool: one CDI device per PCI function with
// its char (or vfio) devices. Host paths are under root, the node root.
func cdiSpec(p *pool.Pool, rdmaCM, root string) *cdispec.Spec {
	spec := &cdispec.Spec{Version: cdiSpecVersion, Kind: p.ResourceName(), Devices: []cdispec.Device{}}
	for i := range p.Devices {
		d := &p.Devices[i]
		var nodes []*cdispec.DeviceNode
		for _, path := range devicePaths(d, rdmaCM) {
			nodes = append(nodes, &cdispec.DeviceNode{Path: path, HostPath: hostPath(root, path), Permissions: "rw"})
		}
		if len(nodes) == 0 {
			continue
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           d.PCIAddress,
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: nodes},
		})
	}
	return spec
}

// devicePaths are the host device nodes of one function (host paths
// without --host-root).
func devicePaths(d *nic.Device, rdmaCM string) []string {
	if d.IsVFIO() {
		return d.VFIODevices
	}
	return charDevicePaths(d, rdmaCM)
}

// charDevicePaths are the RDMA char devices of one function and,
// when it has an RDMA device, the node's rdma_cm, last.
func charDevicePaths(d *nic.Device, rdmaCM string) []string {
	paths := d.CharDevicePaths()
	if d.RDMADevice != "" && rdmaCM != "" {
		paths = append(paths, rdmaCM)
	}
	return paths
}

// hostPath is the node's path of a device node: path (as on the host,
// "/dev/infiniband/uverbs14") under the node root.
func hostPath(root, path string) string {
	if root == "" || root == "/" {
		return path
	}
	return filepath.Join(root, path)
}

// writeCDISpec writes the pool's spec atomically.
func writeCDISpec(dir string, p *pool.Pool, rdmaCM, root string) error {
	path := CDISpecPath(dir, p.Prefix, p.Name)
	data, err := json.MarshalIndent(cdiSpec(p, rdmaCM, root), "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cdi %s: create directory: %w", dir, err)
	}
	tmp, err := os.CreateTemp(dir, ".fastpath-cdi-*")
	if err != nil {
		return fmt.Errorf("cdi %s: %w", path, err)
	}
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("cdi %s: write spec: %w", path, err)
	}
	return nil
}

func removeCDISpec(dir, prefix, name string) error {
	path := CDISpecPath(dir, prefix, name)
	if !strings.HasPrefix(filepath.Base(path), cdiFilePrefix) {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi %s: remove spec: %w", path, err)
	}
	return nil
}
