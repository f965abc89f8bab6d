// Package atomicfile writes files that readers see whole or not at all.
package atomicfile

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Write writes data to path with mode perm: a temporary file in the same
// directory, renamed over path. The directory must exist.
//
// The file is not fsynced: what is written here (CNI state, device-info
// files) must survive a crash of the process, which the page cache does,
// not a crash of the node, after which VFs, namespaces and pods are gone
// anyway (the CNI recognises state from an earlier boot by its boot ID).
func Write(path string, data []byte, perm os.FileMode) (err error) {
	tmp, err := os.CreateTemp(filepath.Dir(path), tempPattern(filepath.Base(path)))
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

// tempPattern is the name of Write's temporary file for a file named
// base: "*" is where CreateTemp puts its random part.
func tempPattern(base string) string { return "." + base + ".tmp-*" }

// Temporaries are the temporary files that writes of path cut short by a
// kill left beside it (a Write that returns removes its own). path may
// be a filepath.Match pattern (its directory plain): the temporaries of
// every file it matches.
func Temporaries(path string) ([]string, error) {
	return filepath.Glob(filepath.Join(filepath.Dir(path), tempPattern(filepath.Base(path))))
}

// WriteAt is Write for the file name in the open directory dir, through
// no symlink: the temporary is created beside it with openat(O_EXCL |
// O_NOFOLLOW) and renamed over name with renameat, which replaces a link
// there and follows nothing. For a directory reached without following
// links (the sriov CNI's device-info files).
func WriteAt(dir *os.File, name string, data []byte, perm os.FileMode) (err error) {
	dfd := int(dir.Fd())
	tmp := "." + name + ".tmp-" + strconv.FormatUint(rand.Uint64(), 36)
	fd, err := unix.Openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Join(dir.Name(), name), err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, name)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		return fmt.Errorf("write %s: %w", filepath.Join(dir.Name(), name), err)
	}
	return nil
}
