package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/internal/cdiwrite"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// cdiFilePrefix marks the spec files this plugin owns; it never touches
// other files in the CDI directory.
const cdiFilePrefix = "fastpath-"

// cdiSpecName is the file name of a pool's spec: fastpath-<prefix>_<name>.json.
func cdiSpecName(prefix, name string) string { return cdiFilePrefix + prefix + "_" + name + ".json" }

// CDISpecPath is the spec file of a pool in dir.
func CDISpecPath(dir, prefix, name string) string {
	return filepath.Join(dir, cdiSpecName(prefix, name))
}

// CDIDeviceName is the fully qualified CDI name of one PCI function of a
// pool: "<prefix>/<name>=<bdf>" (vendor = resource prefix, class = pool
// name).
func CDIDeviceName(p *pool.Pool, bdf string) string {
	return parser.QualifiedName(p.Prefix, p.Name, bdf)
}

// cdiStaging is the plugin's staging directory inside the CDI directory
// (internal/cdiwrite); the DRA driver, in the same process, has its own.
const cdiStaging = ".fastpath-staging"

// cdiSpecs writes and removes the pools' CDI specs.
type cdiSpecs struct {
	w *cdiwrite.Writer
}

func newCDISpecs(dir string) (*cdiSpecs, error) {
	w, err := cdiwrite.New(dir, cdiStaging)
	if err != nil {
		return nil, err
	}
	return &cdiSpecs{w: w}, nil
}

// cdiSpec builds the spec of a pool: one CDI device per PCI function with
// its char (or vfio) devices, host paths under root (the node root). The
// version is the lowest that has what the spec uses, so that older
// runtimes take it.
func cdiSpec(p *pool.Pool, rdmaCM, root string) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{Kind: p.ResourceName(), Devices: make([]cdispec.Device, 0, len(p.Devices))} // vendor/class
	for i := range p.Devices {
		d := &p.Devices[i]
		paths := devicePaths(d, rdmaCM)
		if len(paths) == 0 {
			continue
		}
		// Two allocations a device, not one per node: a 1024-VF pool's
		// spec is built right after registration, beside the first
		// Allocates.
		backing := make([]cdispec.DeviceNode, len(paths))
		nodes := make([]*cdispec.DeviceNode, len(paths))
		for j, path := range paths {
			backing[j] = cdispec.DeviceNode{Path: path, HostPath: hostPath(root, path), Permissions: "rw"}
			nodes[j] = &backing[j]
		}
		spec.Devices = append(spec.Devices, cdispec.Device{
			Name:           d.PCIAddress,
			ContainerEdits: cdispec.ContainerEdits{DeviceNodes: nodes},
		})
	}
	v, err := cdispec.MinimumRequiredVersion(spec)
	if err != nil {
		return nil, err
	}
	spec.Version = v
	return spec, nil
}

// write writes the pool's spec. A pool with no device nodes to hand out
// (no devices yet) has no spec: it reports false, and any earlier spec
// is removed.
func (c *cdiSpecs) write(p *pool.Pool, rdmaCM, root string) (bool, error) {
	spec, err := cdiSpec(p, rdmaCM, root)
	if err != nil {
		return false, fmt.Errorf("cdi spec of %s: %w", p.ResourceName(), err)
	}
	if len(spec.Devices) == 0 {
		return false, c.remove(p.Prefix, p.Name)
	}
	if err := c.w.Write(spec, cdiSpecName(p.Prefix, p.Name)); err != nil {
		return false, fmt.Errorf("%s: %w", p.ResourceName(), err)
	}
	return true, nil
}

// CDISpecFiles lists the device plugin's CDI specs in dir (fastpath-*.json,
// one per pool, which a stopped plugin leaves for restarting containers)
// and its staging directory, when there: what an uninstall removes.
func CDISpecFiles(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, cdiFilePrefix+"*.json"))
	if err != nil {
		return nil, err
	}
	if _, err := os.Lstat(filepath.Join(dir, cdiStaging)); err == nil {
		files = append(files, filepath.Join(dir, cdiStaging))
	}
	return files, nil
}

// removeLeftovers deletes what an earlier run that was killed left: the
// plugin's specs (fastpath-*.json) of pools it no longer serves and
// whatever is in the staging directory (a write cut short).
func (c *cdiSpecs) removeLeftovers(keep map[string]pool.Pool) error {
	files, err := filepath.Glob(filepath.Join(c.w.Dir(), cdiFilePrefix+"*.json"))
	if err != nil {
		return err
	}
	want := make(map[string]bool, len(keep))
	for _, p := range keep {
		want[cdiSpecName(p.Prefix, p.Name)] = true
	}
	var errs []error
	for _, f := range files {
		if want[filepath.Base(f)] {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("cdi %s: remove leftover spec: %w", f, err))
		}
	}
	return errors.Join(append(errs, c.removeStaging())...)
}

func (c *cdiSpecs) removeStaging() error { return c.w.RemoveStaging() }

// remove deletes a pool's spec.
func (c *cdiSpecs) remove(prefix, name string) error {
	return c.w.Remove(cdiSpecName(prefix, name))
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
