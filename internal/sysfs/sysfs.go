// Package sysfs reads sysfs attributes, links and directories relative to
// an open directory, with as few system calls as the kernel allows: a scan
// of a 1024-VF host reads tens of thousands of them, and on a VM each path
// walk from / costs more than the read itself.
package sysfs

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"
	"sort"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Dir is an open directory (O_PATH) that names below it are resolved from.
type Dir struct {
	fd   int
	Path string
}

// PathError names the operation and the full path; it unwraps to the errno,
// so errors.Is(err, fs.ErrNotExist) holds for a missing attribute.
type PathError struct {
	Op, Path string
	Err      error
}

func (e *PathError) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }
func (e *PathError) Unwrap() error { return e.Err }

func retry(f func() error) error {
	for {
		if err := f(); err != unix.EINTR {
			return err
		}
	}
}

// Open opens path as a Dir. Close it when done.
func Open(path string) (Dir, error) {
	var fd int
	err := retry(func() (err error) {
		fd, err = unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return Dir{fd: -1}, &PathError{"open", path, err}
	}
	return Dir{fd: fd, Path: path}, nil
}

// Sub opens a directory below d.
func (d Dir) Sub(name string) (Dir, error) {
	var fd int
	err := retry(func() (err error) {
		fd, err = unix.Openat(d.fd, name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		return Dir{fd: -1}, &PathError{"open", filepath.Join(d.Path, name), err}
	}
	return Dir{fd: fd, Path: filepath.Join(d.Path, name)}, nil
}

// Close releases the directory.
func (d Dir) Close() {
	if d.fd >= 0 {
		unix.Close(d.fd)
	}
}

// maxAttr bounds what Read returns: sysfs attributes are at most a page.
const maxAttr = 4096

// Read returns the attribute name (a path relative to d), trimmed of
// surrounding white space. sysfs hands an attribute out in one read.
func (d Dir) Read(name string) ([]byte, error) {
	var fd int
	err := retry(func() (err error) {
		// O_NONBLOCK: a FIFO where an attribute should be must not hang a scan.
		fd, err = unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
		return err
	})
	if err != nil {
		return nil, &PathError{"open", filepath.Join(d.Path, name), err}
	}
	defer unix.Close(fd)
	var buf [256]byte
	var n int
	err = retry(func() (err error) {
		n, err = unix.Read(fd, buf[:])
		return err
	})
	if err != nil {
		return nil, &PathError{"read", filepath.Join(d.Path, name), err}
	}
	if n < len(buf) {
		return bytes.TrimSpace(buf[:n]), nil
	}
	// Longer than the stack buffer: read on, up to a page.
	out := append([]byte(nil), buf[:n]...)
	for len(out) < maxAttr {
		var m int
		err = retry(func() (err error) {
			m, err = unix.Read(fd, buf[:])
			return err
		})
		if err != nil {
			return nil, &PathError{"read", filepath.Join(d.Path, name), err}
		}
		if m == 0 {
			break
		}
		out = append(out, buf[:m]...)
	}
	if len(out) > maxAttr {
		out = out[:maxAttr]
	}
	return bytes.TrimSpace(out), nil
}

// Readlink returns the target of the link name below d.
func (d Dir) Readlink(name string) (string, error) {
	var buf [512]byte
	var n int
	err := retry(func() (err error) {
		n, err = unix.Readlinkat(d.fd, name, buf[:])
		return err
	})
	if err != nil {
		return "", &PathError{"readlink", filepath.Join(d.Path, name), err}
	}
	if n >= len(buf) {
		return "", &PathError{"readlink", filepath.Join(d.Path, name), errors.New("link target too long")}
	}
	return string(buf[:n]), nil
}

// Exists reports whether name exists below d (without following a final link).
func (d Dir) Exists(name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(d.fd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil
}

// List returns the sorted entry names of the directory name below d ("."
// for d itself); a missing directory has none.
func (d Dir) List(name string) ([]string, error) {
	var fd int
	err := retry(func() (err error) {
		fd, err = unix.Openat(d.fd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		return err
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, &PathError{"open", filepath.Join(d.Path, name), err}
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 8192)
	for {
		var n int
		err = retry(func() (err error) {
			n, err = unix.Getdents(fd, buf)
			return err
		})
		if err != nil {
			return nil, &PathError{"getdents", filepath.Join(d.Path, name), err}
		}
		if n <= 0 {
			break
		}
		names = appendNames(names, buf[:n])
		// getdents fills the buffer while entries fit; with room left for
		// the largest entry (19 + 256 bytes) the directory is exhausted.
		if n < len(buf)-280 {
			break
		}
	}
	sort.Strings(names)
	return names, nil
}

// appendNames decodes linux_dirent64 records, skipping "." and "..".
func appendNames(names []string, b []byte) []string {
	for len(b) >= 19 {
		reclen := int(*(*uint16)(unsafe.Pointer(&b[16])))
		if reclen < 19 || reclen > len(b) {
			break
		}
		nameBytes := b[19:reclen]
		if i := bytes.IndexByte(nameBytes, 0); i >= 0 {
			nameBytes = nameBytes[:i]
		}
		if name := string(nameBytes); name != "." && name != ".." {
			names = append(names, name)
		}
		b = b[reclen:]
	}
	return names
}
