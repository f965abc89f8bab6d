// Package sysfs reads sysfs attributes, links and directories relative to
// an open directory, with as few system calls and allocations as the
// kernel allows: a scan of a 1024-VF host makes about ten thousand of
// them, and on a VM each path walk from / costs more than the read itself.
package sysfs

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Dir is an open directory (O_PATH) that names below it are resolved
// from, or a view of a directory below one (see At).
type Dir struct {
	fd   int
	base string // the path fd was opened at
	sub  string // "" or, for a view, the path of the view below base
	view bool   // made by At: the descriptor is not its own
}

// Path is the directory's path, for messages.
func (d Dir) Path() string {
	if d.sub == "" {
		return d.base
	}
	return filepath.Join(d.base, d.sub)
}

// PathError names the operation and the full path; it unwraps to the errno,
// so errors.Is(err, fs.ErrNotExist) holds for a missing attribute.
type PathError struct {
	Op, Path string
	Err      error
}

func (e *PathError) Error() string { return e.Op + " " + e.Path + ": " + e.Err.Error() }
func (e *PathError) Unwrap() error { return e.Err }

func (d Dir) err(op, name string, err error) error {
	return &PathError{op, filepath.Join(d.Path(), name), err}
}

// name is n below d as the kernel resolves it from d's descriptor.
func (d Dir) name(n string) string {
	if d.sub == "" {
		return n
	}
	return d.sub + "/" + n
}

// cname is a name below a Dir as the kernel takes it, NUL-terminated, in
// a buffer on the caller's stack: the hot calls pass it instead of having
// package unix copy every name to the heap.
type cname [256]byte

// set fills c with d's name for n; false if it does not fit, and the
// caller passes the name as a string instead.
func (c *cname) set(d Dir, n string) bool {
	k := 0
	if d.sub != "" {
		if len(d.sub)+1+len(n) >= len(c) {
			return false
		}
		k = copy(c[:], d.sub)
		c[k] = '/'
		k++
	} else if len(n) >= len(c) {
		return false
	}
	k += copy(c[k:], n)
	c[k] = 0
	return true
}

// openat opens name below d.
func (d Dir) openat(name string, flags int) (int, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return -1, unix.EINVAL
	}
	var c cname
	if !c.set(d, name) {
		for {
			fd, err := unix.Openat(d.fd, d.name(name), flags, 0)
			if err != unix.EINTR {
				return fd, err
			}
		}
	}
	for {
		fd, _, e := unix.Syscall6(unix.SYS_OPENAT, uintptr(d.fd), uintptr(unsafe.Pointer(&c[0])), uintptr(flags), 0, 0, 0)
		switch e {
		case 0:
			return int(fd), nil
		case unix.EINTR:
			continue
		}
		return -1, e
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

// At is a view of the directory sub below d that shares d's descriptor:
// names are resolved from d through sub, which costs a longer path walk
// per call but no open and close of sub. Only closing d releases it.
func (d Dir) At(sub string) Dir {
	if d.sub != "" {
		sub = d.sub + "/" + sub
	}
	return Dir{fd: d.fd, base: d.base, sub: sub, view: true}
}

// Close releases the directory; it does nothing for a view.
func (d Dir) Close() {
	if d.fd >= 0 && !d.view {
		unix.Close(d.fd)
	}
}

// MaxAttr bounds what Read returns: sysfs attributes are at most a page.
const MaxAttr = 4096

// ReadTo reads the attribute name (a path relative to d) into buf and
// returns it trimmed of surrounding white space. sysfs hands an attribute
// out in one read; one longer than buf is cut at len(buf). With buf on
// the caller's stack a read allocates nothing.
func (d Dir) ReadTo(name string, buf []byte) ([]byte, error) {
	b, _, err := d.readTo(name, buf)
	return b, err
}

// readTo is ReadTo, also telling whether the attribute filled buf.
func (d Dir) readTo(name string, buf []byte) ([]byte, bool, error) {
	// O_NONBLOCK: a FIFO where an attribute should be must not hang a scan.
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NONBLOCK)
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

// Read returns the attribute name, trimmed, up to MaxAttr bytes.
func (d Dir) Read(name string) ([]byte, error) {
	var small [256]byte
	b, full, err := d.readTo(name, small[:])
	if err != nil {
		return nil, err
	}
	if !full {
		return bytes.Clone(b), nil
	}
	// As long as the stack buffer: read it again, up to a page.
	return d.ReadTo(name, make([]byte, MaxAttr))
}

// ReadlinkTo reads the target of the link name below d into buf and
// returns its length.
func (d Dir) ReadlinkTo(name string, buf []byte) (int, error) {
	if len(buf) == 0 || strings.IndexByte(name, 0) >= 0 {
		return 0, d.err("readlink", name, unix.EINVAL)
	}
	var c cname
	n, err := 0, error(nil)
	if c.set(d, name) {
		for {
			r, _, e := unix.Syscall6(unix.SYS_READLINKAT, uintptr(d.fd), uintptr(unsafe.Pointer(&c[0])), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), 0, 0)
			if e == unix.EINTR {
				continue
			}
			if n = int(r); e != 0 {
				err = e
			}
			break
		}
	} else {
		for {
			if n, err = unix.Readlinkat(d.fd, d.name(name), buf); err != unix.EINTR {
				break
			}
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

// Readlink returns the target of the link name below d.
func (d Dir) Readlink(name string) (string, error) {
	var buf [512]byte
	n, err := d.ReadlinkTo(name, buf[:])
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// List returns the sorted entry names of the directory name below d ("."
// for d itself); a missing directory has none.
func (d Dir) List(name string) ([]string, error) {
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return nil, d.err("open", name, err)
	}
	defer unix.Close(fd)
	var names []string
	buf := make([]byte, 32<<10)
	for {
		n, err := unix.Getdents(fd, buf)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, d.err("getdents", name, err)
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
	slices.Sort(names)
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
