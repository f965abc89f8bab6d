//go:build !fastpath_portable

package sysfs

import (
	"bytes"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

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

// List returns the sorted entry names of the directory name below d ("."
// for d itself); a missing directory has none.
func (d Dir) List(name string) ([]string, error) {
	scratch := dirents.Get().(*listScratch)
	defer scratch.put()
	raw, _, err := d.listRaw(name, scratch.names, nil)
	scratch.names = raw
	if err != nil || len(raw) == 0 {
		return nil, err
	}
	names := slices.Clone(raw)
	sortNames(names)
	return names, nil
}

// listRaw appends the entry names of the directory name below d to dst,
// unsorted (see listRawWith).
func (d Dir) listRaw(name string, dst, prev []string) ([]string, bool, error) {
	return d.listRawWith(name, dst, prev, unix.Getdents)
}

// listRawWith appends the entry names of the directory name below d to dst in
// the order getdents gives them, taking each name's string from prev
// where the name is there too (see reuse), and reports whether the
// names are prev's, in prev's order. The getdents call is passed in, so
// that a test can have the kernel answer in pieces, as FUSE and virtiofs
// do.
func (d Dir) listRawWith(name string, dst, prev []string, getdents func(fd int, buf []byte) (int, error)) ([]string, bool, error) {
	fd, err := d.openat(name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return dst, len(prev) == 0, nil
		}
		return dst, false, d.err("open", name, err)
	}
	defer unix.Close(fd)
	buf := getdentsBufs.Get().(*[32 << 10]byte)
	defer getdentsBufs.Put(buf)
	r := reuse{prev: prev, same: true}
	// Only getdents returning 0 says the directory is exhausted: a local
	// file system fills the buffer while entries fit, but Linux does not
	// promise it, and FUSE and virtiofs answer a page at a time.
	for {
		n, err := getdents(fd, buf[:])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return dst, false, d.err("getdents", name, err)
		}
		if n <= 0 {
			break
		}
		dst = appendNames(dst, buf[:n], &r)
	}
	return dst, r.same && r.next == len(prev), nil
}

// listScratch is a plain listing's names decoded so far, reused: a
// listing in several pieces would otherwise grow its names slice piece by
// piece, to twice its size. The caller gets an exact copy.
type listScratch struct {
	names []string
}

var (
	dirents      = sync.Pool{New: func() any { return new(listScratch) }}
	getdentsBufs = sync.Pool{New: func() any { return new([32 << 10]byte) }}
)

// put returns s to the pool without the strings it points to.
func (s *listScratch) put() {
	clear(s.names)
	s.names = s.names[:0]
	dirents.Put(s)
}

// appendNames decodes linux_dirent64 records, skipping "." and "..". A
// name that r has is r's string; the other names of one buffer share one
// new string (two allocations, not one per name: a scan lists about ten
// thousand entries). Two passes: the first sizes the names and that
// string, the second fills them.
func appendNames(names []string, b []byte, r *reuse) []string {
	size, count := 0, 0
	probe := *r // the decisions the second pass makes again
	for rest := b; len(rest) >= 19; {
		name, reclen := dirent(rest)
		if reclen == 0 {
			break
		}
		if !dotOrDotDot(name) {
			count++
			if _, ok := probe.take(name); !ok {
				size += len(name)
			}
		}
		rest = rest[reclen:]
	}
	names = slices.Grow(names, count)
	// blob has room for every new name, so appending never moves it: the
	// strings made from it stay valid, and it is not written again once
	// they are.
	blob := make([]byte, 0, size)
	for rest := b; len(rest) >= 19; {
		name, reclen := dirent(rest)
		if reclen == 0 {
			break
		}
		if !dotOrDotDot(name) {
			s, ok := r.take(name)
			if !ok {
				off := len(blob)
				blob = append(blob, name...)
				s = unsafe.String(unsafe.SliceData(blob[off:]), len(name))
			}
			names = append(names, s)
		}
		rest = rest[reclen:]
	}
	return names
}

// dirent returns the name of the linux_dirent64 record at the start of b
// and the record's length; 0 for a record that does not fit. The kernel
// pads a record to 8 bytes after its name's NUL, and what follows the NUL
// is not cleared: the NUL is the first zero byte in the record's last
// eight (past the 19-byte header), as the name has none. So only those
// are looked at, not the whole name.
func dirent(b []byte) ([]byte, int) {
	reclen := int(*(*uint16)(unsafe.Pointer(&b[16])))
	if reclen < 19 || reclen > len(b) {
		return nil, 0
	}
	end := reclen
	for i := max(19, reclen-8); i < reclen; i++ {
		if b[i] == 0 {
			end = i
			break
		}
	}
	return b[19:end], reclen
}

func dotOrDotDot(name []byte) bool {
	return len(name) == 1 && name[0] == '.' || len(name) == 2 && name[0] == '.' && name[1] == '.'
}
