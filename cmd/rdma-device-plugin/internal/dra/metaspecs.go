package dra

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	cdispec "tags.cncf.io/container-device-interface/specs-go"
)

// metaSpecsDir, under the plugin directory, keeps a copy of each device
// metadata CDI spec the helper writes into the CDI directory.
const metaSpecsDir = "metadata-cdi-specs"

// metaSpecs keeps the device metadata CDI specs (section "Device metadata"
// of docs/dra.md) across a reboot. The kubeletplugin helper writes a spec
// per prepared request into the CDI directory, which is tmpfs, and writes
// it again only from a Prepare; a container of a running pod that restarts
// after the directory was emptied would not resolve its metadata CDI name.
// The helper's file operations are routed through here: what it writes
// into the CDI directory is also kept under the plugin directory (kept
// across a reboot, as the checkpoint is), what it removes there is removed
// here too, and restore puts back the kept specs that are missing.
// Everything else the helper writes (the metadata files themselves, under
// the plugin directory) is written as the helper would.
type metaSpecs struct {
	cdiDir, keepDir string
}

func newMetaSpecs(cdiDir, pluginDir string) *metaSpecs {
	return &metaSpecs{cdiDir: filepath.Clean(cdiDir), keepDir: filepath.Join(pluginDir, metaSpecsDir)}
}

// fileOps are the helper's file operations: write and remove go through
// here; nil fields keep the helper's defaults.
func (m *metaSpecs) fileOps() kubeletplugin.MetadataFileOperations {
	return kubeletplugin.MetadataFileOperations{WriteFile: m.writeFile, Remove: m.remove}
}

func (m *metaSpecs) inCDIDir(name string) bool { return filepath.Dir(filepath.Clean(name)) == m.cdiDir }

func (m *metaSpecs) kept(name string) string { return filepath.Join(m.keepDir, filepath.Base(name)) }

// writeFile writes name whole (a synced temporary renamed over it, as the
// helper's own write does); a spec written into the CDI directory is kept
// too, before it is put in place, so that no spec is in use without its
// copy.
func (m *metaSpecs) writeFile(name string, data []byte, perm os.FileMode) error {
	if m.inCDIDir(name) {
		if err := os.MkdirAll(m.keepDir, 0o755); err != nil {
			return fmt.Errorf("dra: keep metadata CDI spec: %w", err)
		}
		if err := writeSynced(m.kept(name), data, perm); err != nil {
			return fmt.Errorf("dra: keep metadata CDI spec: %w", err)
		}
	}
	return writeSynced(name, data, perm)
}

// remove removes name and, for a spec of the CDI directory, its copy.
func (m *metaSpecs) remove(name string) error {
	err := os.Remove(name)
	if m.inCDIDir(name) {
		if kerr := os.Remove(m.kept(name)); kerr != nil && !errors.Is(kerr, fs.ErrNotExist) {
			err = errors.Join(err, kerr)
		}
	}
	return err
}

// restore writes back each kept spec missing from the CDI directory whose
// metadata files still exist; a kept spec whose files are gone (its claim
// was unprepared while a kill cut the removal short) is dropped. It
// returns how many specs it wrote back.
func (m *metaSpecs) restore() (int, error) {
	kept, err := filepath.Glob(filepath.Join(m.keepDir, "*.json"))
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, k := range kept {
		dst := filepath.Join(m.cdiDir, filepath.Base(k))
		if _, err := os.Stat(dst); err == nil {
			continue
		}
		data, err := os.ReadFile(k)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		live, err := mountsExist(data)
		if err != nil {
			errs = append(errs, fmt.Errorf("kept metadata CDI spec %s: %w", k, err))
			continue
		}
		if !live {
			if err := os.Remove(k); err != nil {
				errs = append(errs, err)
			}
			continue
		}
		if err := os.MkdirAll(m.cdiDir, 0o755); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := writeSynced(dst, data, 0o644); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}

// mountsExist says whether every file a spec mounts exists.
func mountsExist(data []byte) (bool, error) {
	var s cdispec.Spec
	if err := json.Unmarshal(data, &s); err != nil {
		return false, err
	}
	mounts := 0
	for _, d := range s.Devices {
		for _, mnt := range d.ContainerEdits.Mounts {
			mounts++
			if _, err := os.Stat(mnt.HostPath); err != nil {
				return false, nil
			}
		}
	}
	if mounts == 0 {
		return false, errors.New("mounts nothing")
	}
	return true, nil
}

// writeSynced writes path whole: a synced temporary in its directory,
// renamed over it.
func writeSynced(path string, data []byte, perm os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	_, err = tmp.Write(data)
	if err == nil {
		err = tmp.Chmod(perm)
	}
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	return err
}
