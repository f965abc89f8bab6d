// Package cdiwrite writes CDI spec files for the device plugin's pools and
// the DRA driver's claims. Each spec is validated as the CDI library's
// Cache.WriteSpec validates it (version, vendor and class, device names,
// environment and device nodes: the parts of a spec fastpath writes; a
// spec with anything else is refused), marshalled as JSON and written
// through a temporary spec.*.tmp in a staging directory of the writer's
// own inside the CDI directory; from there it is renamed into place. A
// kill in the middle of a write leaves its temporary file in the staging
// directory, where it is known to be ours — not beside other vendors'
// specs, whose writers use the same temporary names — and the next start
// removes it. Runtimes never see the staging directory: the CDI library's
// scan, which containerd, CRI-O and podman read specs with, skips the
// subdirectories of a spec directory (and every file not named *.json or
// *.yaml). The rename is atomic (one filesystem): a runtime reads the old
// spec or the new one.
//
// It does not write through the library's cache: that links a YAML
// parser and the cache's watcher into the lean daemon, and validates a
// device node with a map made per node (4,096 of them for a 1024-VF
// pool's spec). Measured against Cache.WriteSpec into the staging
// directory (issue 40, docs/benchmarks.md): the library's write raised
// the 1024-VF daemon's peak RSS from 18.7 to 19.7 MiB (lean build) and
// from 32.0 to 33.6 MiB (DRA build), medians of four interleaved rounds,
// and the lean binary by 0.38 MB. The library's own write is safe for a
// reader too (a spec.*.tmp renamed over the spec), but a kill leaves that
// temporary file beside other vendors' specs, where no start can tell it
// from theirs: the staging directory would stay either way.
package cdiwrite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"tags.cncf.io/container-device-interface/pkg/parser"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Writer writes specs into one CDI directory through its own staging
// directory. Writes of different names may run at once; RemoveStaging must
// not run beside a write.
type Writer struct {
	dir, staging string
}

// New returns a writer of specs into dir, staged in dir/staging (a name
// starting with "." and unique to the writer: two writers in one process
// must not share it).
func New(dir, staging string) (*Writer, error) {
	if staging == "" || filepath.Base(staging) != staging {
		return nil, fmt.Errorf("cdi %s: staging directory %q: want a plain name", dir, staging)
	}
	return &Writer{dir: dir, staging: filepath.Join(dir, staging)}, nil
}

// Dir is the CDI directory the specs go to.
func (w *Writer) Dir() string { return w.dir }

// Write validates spec and puts it in place as dir/name (name ends in
// .json).
func (w *Writer) Write(spec *cdispec.Spec, name string) error {
	path := filepath.Join(w.dir, name)
	if err := w.write(spec, name); err != nil {
		return fmt.Errorf("cdi %s: write spec: %w", path, err)
	}
	return nil
}

func (w *Writer) write(spec *cdispec.Spec, name string) error {
	if filepath.Ext(name) != ".json" || filepath.Base(name) != name {
		return fmt.Errorf("file name %q: want a plain name ending in .json", name)
	}
	if err := Validate(spec); err != nil {
		return fmt.Errorf("invalid CDI Spec: %w", err)
	}
	data := appendSpec(make([]byte, 0, specSizeHint(spec)), spec)
	if err := os.MkdirAll(w.staging, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(w.staging, "spec.*.tmp")
	if err != nil {
		return err
	}
	_, err = tmp.Write(data)
	err = errors.Join(err, tmp.Close())
	if err == nil {
		err = os.Rename(tmp.Name(), filepath.Join(w.dir, name))
	}
	if err != nil {
		_ = os.Remove(tmp.Name())
	}
	return err
}

// Validate checks spec as the CDI library's Cache.WriteSpec does, with
// the library's own checks where it exports them (version, vendor, class
// and device names) and its rules for the rest (environment entries,
// device nodes, no duplicate or empty devices). Edits fastpath never
// writes (hooks, mounts, net devices, Intel RDT, additional GIDs) and
// annotations are refused rather than checked.
func Validate(spec *cdispec.Spec) error {
	if err := cdispec.ValidateVersion(spec); err != nil {
		return err
	}
	vendor, class := parser.ParseQualifier(spec.Kind)
	if err := parser.ValidateVendorName(vendor); err != nil {
		return err
	}
	if err := parser.ValidateClassName(class); err != nil {
		return err
	}
	if len(spec.Annotations) > 0 {
		return errors.New("annotations: not written by fastpath, refused")
	}
	if err := validateEdits(&spec.ContainerEdits); err != nil {
		return err
	}
	seen := make(map[string]bool, len(spec.Devices))
	for i := range spec.Devices {
		d := &spec.Devices[i]
		if err := validateDevice(d); err != nil {
			return fmt.Errorf("failed add device %q: %w", d.Name, err)
		}
		if seen[d.Name] {
			return fmt.Errorf("invalid spec, multiple device %q", d.Name)
		}
		seen[d.Name] = true
	}
	if len(seen) == 0 {
		return errors.New("invalid spec, no devices")
	}
	return nil
}

func validateDevice(d *cdispec.Device) error {
	if err := parser.ValidateDeviceName(d.Name); err != nil {
		return err
	}
	if len(d.Annotations) > 0 {
		return errors.New("annotations: not written by fastpath, refused")
	}
	if len(d.ContainerEdits.Env) == 0 && len(d.ContainerEdits.DeviceNodes) == 0 && unsupported(&d.ContainerEdits) == "" {
		return errors.New("invalid device, empty device edits")
	}
	return validateEdits(&d.ContainerEdits)
}

// validateEdits checks the environment and the device nodes.
func validateEdits(e *cdispec.ContainerEdits) error {
	if what := unsupported(e); what != "" {
		return fmt.Errorf("container edits: %s: not written by fastpath, refused", what)
	}
	for _, v := range e.Env {
		if strings.IndexByte(v, '=') <= 0 {
			return fmt.Errorf("invalid container edits: invalid environment variable %q", v)
		}
	}
	for _, n := range e.DeviceNodes {
		if err := validateNode(n); err != nil {
			return err
		}
	}
	return nil
}

// unsupported names the first kind of edit in e that fastpath does not
// write, or "".
func unsupported(e *cdispec.ContainerEdits) string {
	switch {
	case len(e.Hooks) > 0:
		return "hooks"
	case len(e.Mounts) > 0:
		return "mounts"
	case len(e.NetDevices) > 0:
		return "net devices"
	case e.IntelRdt != nil:
		return "Intel RDT"
	case len(e.AdditionalGIDs) > 0:
		return "additional GIDs"
	}
	return ""
}

func validateNode(n *cdispec.DeviceNode) error {
	switch {
	case n == nil:
		return errors.New("invalid (nil) device node")
	case n.Path == "":
		return errors.New("invalid (empty) device path")
	}
	switch n.Type {
	case "", "b", "c", "u", "p":
	default:
		return fmt.Errorf("device %q: invalid type %q", n.Path, n.Type)
	}
	if n.Major < 0 || n.Minor < 0 {
		return fmt.Errorf("device %q: invalid (negative) device number %d:%d", n.Path, n.Major, n.Minor)
	}
	if n.Permissions != "" && n.Permissions != "none" && strings.Trim(n.Permissions, "rwm") != "" {
		return fmt.Errorf("device %q: invalid permissions %q", n.Path, n.Permissions)
	}
	return nil
}

// specSizeHint is about the size of spec's JSON: its devices times the
// first one's, so that appendSpec grows its buffer once or not at all.
func specSizeHint(spec *cdispec.Spec) int {
	if len(spec.Devices) == 0 {
		return 256
	}
	return 256 + len(spec.Devices)*len(appendSpec(nil, &cdispec.Spec{Devices: spec.Devices[:1]}))
}

// Remove deletes dir/name; a spec that is not there is no error.
func (w *Writer) Remove(name string) error {
	path := filepath.Join(w.dir, name)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("cdi %s: remove spec: %w", path, err)
	}
	return nil
}

// RemoveStaging removes the staging directory, which holds nothing between
// two writes: what is there was left by a write cut short.
func (w *Writer) RemoveStaging() error {
	if err := os.RemoveAll(w.staging); err != nil {
		return fmt.Errorf("cdi: remove the staging directory: %w", err)
	}
	return nil
}
