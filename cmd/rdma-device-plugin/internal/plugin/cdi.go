package plugin

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

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

// cdiStaging is the plugin's own directory inside the CDI directory,
// where the CDI library writes a spec (through its temporary file
// spec.*.tmp) before the spec is renamed into the CDI directory: a kill
// in the middle of a write leaves its temporary file there, where it is
// known to be this plugin's, not beside other vendors' specs, whose
// writers use the same library and the same temporary names. Runtimes
// never see it: the library's scan, which containerd, CRI-O and podman
// read specs with, skips the subdirectories of a spec directory (and,
// in it, every file not named *.json or *.yaml). The rename from there
// is atomic (one filesystem): a runtime reads the old spec or the new.
const cdiStaging = ".fastpath-staging"

// cdiSpecs writes and removes the pools' CDI specs through the CDI
// library, which validates a spec (names, device nodes, version) before it
// writes it, atomically, into the staging directory; from there it is
// renamed into dir.
type cdiSpecs struct {
	dir   string
	cache *cdi.Cache
}

func newCDISpecs(dir string) (*cdiSpecs, error) {
	// No auto-refresh: the cache is only the library's writer here, it
	// need not watch the directory.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(filepath.Join(dir, cdiStaging)), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi %s: %w", dir, err)
	}
	return &cdiSpecs{dir: dir, cache: cache}, nil
}

// cdiSpec builds the spec of a pool: one CDI device per PCI function with
// its char (or vfio) devices, host paths under root (the node root). The
// version is the lowest that has what the spec uses, so that older
// runtimes take it.
func cdiSpec(p *pool.Pool, rdmaCM, root string) (*cdispec.Spec, error) {
	spec := &cdispec.Spec{Kind: p.ResourceName()} // vendor/class
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
	name := cdiSpecName(p.Prefix, p.Name)
	err = c.cache.WriteSpec(spec, name)
	if err == nil {
		err = os.Rename(filepath.Join(c.dir, cdiStaging, name), filepath.Join(c.dir, name))
	}
	if err != nil {
		return false, fmt.Errorf("cdi %s: write spec of %s: %w", CDISpecPath(c.dir, p.Prefix, p.Name), p.ResourceName(), err)
	}
	return true, nil
}

// removeLeftovers deletes what an earlier run that was killed left: the
// plugin's specs (fastpath-*.json) of pools it no longer serves and
// whatever is in the staging directory (a write cut short).
func (c *cdiSpecs) removeLeftovers(keep map[string]pool.Pool) error {
	files, err := filepath.Glob(filepath.Join(c.dir, cdiFilePrefix+"*.json"))
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

// removeStaging removes the staging directory, which holds nothing
// between two writes.
func (c *cdiSpecs) removeStaging() error {
	if err := os.RemoveAll(filepath.Join(c.dir, cdiStaging)); err != nil {
		return fmt.Errorf("cdi: remove the staging directory: %w", err)
	}
	return nil
}

// remove deletes a pool's spec.
func (c *cdiSpecs) remove(prefix, name string) error {
	path := CDISpecPath(c.dir, prefix, name)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi %s: remove spec: %w", path, err)
	}
	return nil
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
