// Package cdiwrite writes CDI spec files for the device plugin's pools and
// the DRA driver's claims. The CDI library validates each spec (names,
// device nodes, version) and writes it, through a temporary spec.*.tmp,
// into a staging directory of the writer's own inside the CDI directory;
// from there the spec is renamed into place. A kill in the middle of a
// write leaves its temporary file in the staging directory, where it is
// known to be ours — not beside other vendors' specs, whose writers use the
// same library and the same temporary names — and the next start removes
// it. Runtimes never see the staging directory: the library's scan, which
// containerd, CRI-O and podman read specs with, skips the subdirectories
// of a spec directory (and every file not named *.json or *.yaml). The
// rename is atomic (one filesystem): a runtime reads the old spec or the
// new one.
package cdiwrite

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// Writer writes specs into one CDI directory through its own staging
// directory. Writes of different names may run at once; RemoveStaging must
// not run beside a write.
type Writer struct {
	dir, staging string
	cache        *cdi.Cache
}

// New returns a writer of specs into dir, staged in dir/staging (a name
// starting with "." and unique to the writer: two writers in one process
// must not share it).
func New(dir, staging string) (*Writer, error) {
	if staging == "" || filepath.Base(staging) != staging {
		return nil, fmt.Errorf("cdi %s: staging directory %q: want a plain name", dir, staging)
	}
	w := &Writer{dir: dir, staging: filepath.Join(dir, staging)}
	// No auto-refresh: the cache is only the library's writer here, it
	// need not watch the directory.
	cache, err := cdi.NewCache(cdi.WithSpecDirs(w.staging), cdi.WithAutoRefresh(false))
	if err != nil {
		return nil, fmt.Errorf("cdi %s: %w", dir, err)
	}
	w.cache = cache
	return w, nil
}

// Dir is the CDI directory the specs go to.
func (w *Writer) Dir() string { return w.dir }

// Write validates spec and puts it in place as dir/name.
func (w *Writer) Write(spec *cdispec.Spec, name string) error {
	err := w.cache.WriteSpec(spec, name)
	if err == nil {
		err = os.Rename(filepath.Join(w.staging, name), filepath.Join(w.dir, name))
	}
	if err != nil {
		return fmt.Errorf("cdi %s: write spec: %w", filepath.Join(w.dir, name), err)
	}
	return nil
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
