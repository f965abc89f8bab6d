//go:build !fastpath_portable

package sysfs

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
)

// openat opens name below d.
func (d Dir) openat(name string, flags int) (int, error) {
	for {
		fd, err := unix.Openat(d.fd, d.name(name), flags, 0)
		if err != unix.EINTR {
			return fd, err
		}
	}
}

// Open opens path as a Dir. Close it when done.
func Open(path string) (Dir, error) {
	fd, err := Dir{fd: unix.AT_FDCWD}.openat(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return Dir{fd: -1}, &PathError{"open", path, err}
	}
	return Dir{fd: fd, base: path}, nil
}

// Sub opens a directory below d.
func (d Dir) Sub(name string) (Dir, error) {
	fd, err := d.openat(name, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		return Dir{fd: -1}, d.err("open", name, err)
	}
	return Dir{fd: fd, base: filepath.Join(d.Path(), name)}, nil
}

// Close releases the directory; it does nothing for a view.
func (d Dir) Close() {
	if d.fd >= 0 && !d.view {
		unix.Close(d.fd)
	}
}

// readTo is ReadTo, also telling whether the attribute filled buf.
func (d Dir) readTo(name string, buf []byte) ([]byte, bool, error) {
	// O_NONBLOCK: a FIFO where an attribute should be must not hang a
	// scan. O_NOFOLLOW: an attribute is a file, never a link, and one
	// that is a link (to outside the root, say) is not read through.
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK|unix.O_NOFOLLOW)
	if err != nil {
		return nil, false, d.err("open", name, err)
	}
	defer unix.Close(fd)
	n := 0
	for n < len(buf) {
		m, err := unix.Read(fd, buf[n:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, false, d.err("read", name, err)
		}
		if m == 0 {
			break
		}
		n += m
		if n < len(buf) {
			break // sysfs answered in one read; do not ask again for EOF
		}
	}
	return bytes.TrimSpace(buf[:n]), n == len(buf), nil
}

// ReadlinkTo reads the target of the link name below d into buf and
// returns its length.
func (d Dir) ReadlinkTo(name string, buf []byte) (int, error) {
	if len(buf) == 0 {
		return 0, d.err("readlink", name, unix.EINVAL)
	}
	var n int
	var err error
	for {
		if n, err = unix.Readlinkat(d.fd, d.name(name), buf); err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return 0, d.err("readlink", name, err)
	}
	if n >= len(buf) {
		return 0, d.err("readlink", name, errors.New("link target too long"))
	}
	return n, nil
}

// List returns the sorted entry names of the directory name below d ("."
// for d itself); a missing directory has none.
func (d Dir) List(name string) ([]string, error) {
	names, _, err := d.listRaw(name, nil, nil)
	if err != nil || len(names) == 0 {
		return nil, err
	}
	slices.Sort(names)
	return names, nil
}

// listRaw appends the entry names of the directory name below d to dst in
// the order the kernel lists them (os.File.Readdirnames), taking each
// name's string from prev where the name is there too (see reuse), and
// reports whether the names are prev's, in prev's order.
func (d Dir) listRaw(name string, dst, prev []string) ([]string, bool, error) {
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return dst, len(prev) == 0, nil
		}
		return dst, false, d.err("open", name, err)
	}
	f := os.NewFile(uintptr(fd), filepath.Join(d.Path(), name))
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return dst, false, d.err("getdents", name, err)
	}
	r := reuse{prev: prev, same: true}
	for _, n := range names {
		if s, ok := r.take(n); ok {
			n = s
		}
		dst = append(dst, n)
	}
	return dst, r.same && r.next == len(prev), nil
}
