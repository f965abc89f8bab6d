// Package atomicfile writes files that readers see whole or not at all.
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write writes data to path with mode perm: a temporary file in the same
// directory, renamed over path. The directory must exist.
//
// The file is not fsynced: what is written here (CNI state, device-info
// files) must survive a crash of the process, which the page cache does,
// not a crash of the node, after which VFs, namespaces and pods are gone
// anyway (the CNI recognises state from an earlier boot by its boot ID).
func Write(path string, data []byte, perm os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	_, err = tmp.Write(data)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp.Name(), perm)
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
