package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
)

// This file opens the files a conf may name, logFile and
// runtimeConfig.CNIDeviceInfoFile, only inside the directory the node's
// admin gave for them, and never through a symlink below it: every
// component below the directory is opened with openat(O_NOFOLLOW) from
// the one before, so neither a link planted there nor a directory renamed
// meanwhile leads out of it. That is what openat2's RESOLVE_BENEATH |
// RESOLVE_NO_SYMLINKS does, on the kernels before 5.6 (RHEL 8's 4.18)
// that lack openat2 too. The directory's own path is the admin's and is
// resolved as usual (/var/run is a link to /run on most distributions).

// relBeneath returns path relative to dir when path is a file in dir or
// below it (after filepath.Clean), and ok false otherwise.
func relBeneath(dir, path string) (rel string, ok bool) {
	if dir == "" || !filepath.IsAbs(path) {
		return "", false
	}
	rel, err := filepath.Rel(dir, filepath.Clean(path))
	if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", false
	}
	return rel, true
}

// errLinkBelow marks a path below the node's directory that goes through
// a symlink or a non-directory.
var errLinkBelow = errors.New("a symlink or a non-directory on the way, which is not followed")

// openDirBeneath opens the directory rel (relative, clean, no "..") below
// root, each component without following a symlink; create makes the
// missing ones, mode 0755 (root made too, as the admin's path). An
// existing component that is a symlink or not a directory is
// errLinkBelow.
func openDirBeneath(root, rel string, create bool) (*os.File, error) {
	if create {
		if err := os.MkdirAll(root, 0o755); err != nil {
			return nil, err
		}
	}
	fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &fs.PathError{Op: "open", Path: root, Err: err}
	}
	if rel != "." {
		for _, comp := range strings.Split(rel, "/") {
			next, err := openatDir(fd, comp, create)
			unix.Close(fd)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", filepath.Join(root, rel), err)
			}
			fd = next
		}
	}
	return os.NewFile(uintptr(fd), filepath.Join(root, rel)), nil
}

func openatDir(dirfd int, name string, create bool) (int, error) {
	for {
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		switch {
		case err == nil:
			return fd, nil
		case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
			return -1, fmt.Errorf("%s: %w", name, errLinkBelow)
		case errors.Is(err, unix.ENOENT) && create:
			if err := unix.Mkdirat(dirfd, name, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				return -1, fmt.Errorf("mkdir %s: %w", name, err)
			}
			continue
		default:
			return -1, fmt.Errorf("%s: %w", name, err)
		}
	}
}

// openLogFile opens logFile for appending (0600, created when missing)
// when it is a file in logDir or below it, reached without a symlink;
// the directories must exist.
func openLogFile(logDir, logFile string) (*os.File, error) {
	if logDir == "" {
		return nil, errors.New("the node's config has no logDir, so no network may name a log file")
	}
	rel, ok := relBeneath(logDir, logFile)
	if !ok {
		return nil, fmt.Errorf("not in the node's logDir %s", logDir)
	}
	d, err := openDirBeneath(logDir, filepath.Dir(rel), false)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	fd, err := unix.Openat(int(d.Fd()), filepath.Base(rel),
		unix.O_WRONLY|unix.O_APPEND|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0o600)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			err = errLinkBelow
		}
		return nil, fmt.Errorf("open %s: %w", logFile, err)
	}
	f := os.NewFile(uintptr(fd), logFile)
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("open %s: not a regular file", logFile)
	}
	return f, nil
}

// checkDeviceInfoPath is ADD's check of a CNIDeviceInfoFile before
// anything changes: a file inside dir (Node.DeviceInfoDir) whose existing
// directories below dir are no symlinks. writeDeviceInfo checks again as
// it writes.
func checkDeviceInfoPath(dir, path string) error {
	rel, ok := relBeneath(dir, path)
	if !ok {
		return invalidConf("runtimeConfig.CNIDeviceInfoFile %q: not inside the node's device-info directory %s (Multus's, where it puts these files); the plugin writes no file elsewhere", path, dir)
	}
	if d, err := openDirBeneath(dir, filepath.Dir(rel), false); err == nil {
		d.Close()
	} else if errors.Is(err, errLinkBelow) {
		return invalidConf("runtimeConfig.CNIDeviceInfoFile %q: %v", path, err)
	}
	return nil
}

// writeDeviceInfo writes info to path, a file inside dir, atomically
// (mode 0444): a temporary file in path's directory, renamed over path.
// Missing directories below dir are made; none is followed through a
// symlink.
func writeDeviceInfo(dir, path string, info devinfo.Info) error {
	rel, ok := relBeneath(dir, path)
	if !ok {
		return fmt.Errorf("device-info file %s: not inside %s", path, dir)
	}
	data, err := json.Marshal(info)
	if err != nil {
		return err
	}
	d, err := openDirBeneath(dir, filepath.Dir(rel), true)
	if err != nil {
		return fmt.Errorf("device-info file %s: %w", path, err)
	}
	defer d.Close()
	if err := atomicfile.WriteAt(d, filepath.Base(rel), data, 0o444); err != nil {
		return fmt.Errorf("device-info file %s: %w", path, err)
	}
	return nil
}

// removeDeviceInfo removes the device-info file at path, inside dir, while
// it still names vf (anything else there is not this attachment's to
// remove), and the temporaries of a write killed half-way. A path outside
// dir, or through a symlink below it, is left alone with a warning: this
// plugin never wrote there.
func removeDeviceInfo(log *slog.Logger, dir, path, vf string) error {
	rel, ok := relBeneath(dir, path)
	if !ok {
		log.Warn("device-info file left: not inside the node's device-info directory", "path", path, "dir", dir)
		return nil
	}
	d, err := openDirBeneath(dir, filepath.Dir(rel), false)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		log.Warn("device-info file left: its directory cannot be opened without following a link", "path", path, "err", err)
		return nil
	}
	defer d.Close()
	dfd, base := int(d.Fd()), filepath.Base(rel)
	if names, err := d.Readdirnames(-1); err == nil {
		for _, n := range names {
			if strings.HasPrefix(n, "."+base+".tmp-") {
				_ = unix.Unlinkat(dfd, n, 0)
			}
		}
	}
	fd, err := unix.Openat(dfd, base, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return nil
	}
	if err != nil {
		log.Warn("device-info file left: not one this plugin wrote", "path", path, "err", err)
		return nil
	}
	f := os.NewFile(uintptr(fd), path)
	var info devinfo.Info
	derr := json.NewDecoder(f).Decode(&info)
	f.Close()
	if derr != nil || info.PCI == nil || info.PCI.PCIAddress != vf {
		log.Warn("device-info file left: it does not name this VF", "path", path)
		return nil
	}
	if err := unix.Unlinkat(dfd, base, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove device-info file %s: %w", path, err)
	}
	return nil
}
