//go:build !linux || fastpath_portable

package sysfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

var (
	errInvalid error = syscall.EINVAL
	errNotDir  error = syscall.ENOTDIR
	errLoop    error = syscall.ELOOP
)

// The portable Dir holds no descriptor: every call goes by full path.

// full is the path of n below d.
func (d Dir) full(n string) string { return filepath.Join(d.base, d.name(n)) }

// errno is what an os error wraps, so that PathError unwraps to it as it
// does on Linux.
func errno(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}

// Open opens path as a Dir. Close it when done.
func Open(path string) (Dir, error) {
	if err := isDir(path); err != nil {
		return Dir{fd: -1}, &PathError{"open", path, err}
	}
	return Dir{fd: -1, base: path}, nil
}

// Sub opens a directory below d.
func (d Dir) Sub(name string) (Dir, error) {
	if err := isDir(d.full(name)); err != nil {
		return Dir{fd: -1}, d.err("open", name, err)
	}
	return Dir{fd: -1, base: filepath.Join(d.Path(), name)}, nil
}

func isDir(path string) error {
	if strings.IndexByte(path, 0) >= 0 {
		return errInvalid
	}
	st, err := os.Stat(path)
	if err != nil {
		return errno(err)
	}
	if !st.IsDir() {
		return errNotDir
	}
	return nil
}

// Close releases the directory (nothing to release here).
func (d Dir) Close() {}

func (d Dir) readTo(name string, buf []byte) ([]byte, bool, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return nil, false, d.err("open", name, errInvalid)
	}
	// An attribute is a file, never a link: one that is a link is not
	// read through.
	if st, err := os.Lstat(d.full(name)); err == nil && st.Mode()&fs.ModeSymlink != 0 {
		return nil, false, d.err("open", name, errLoop)
	}
	f, err := os.Open(d.full(name))
	if err != nil {
		return nil, false, d.err("open", name, errno(err))
	}
	defer f.Close()
	n, err := io.ReadFull(f, buf)
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return nil, false, d.err("read", name, errno(err))
	}
	return bytes.TrimSpace(buf[:n]), n == len(buf), nil
}

// ReadlinkTo reads the target of the link name below d into buf and
// returns its length.
func (d Dir) ReadlinkTo(name string, buf []byte) (int, error) {
	if len(buf) == 0 || strings.IndexByte(name, 0) >= 0 {
		return 0, d.err("readlink", name, errInvalid)
	}
	target, err := os.Readlink(d.full(name))
	if err != nil {
		return 0, d.err("readlink", name, errno(err))
	}
	if len(target) >= len(buf) {
		return 0, d.err("readlink", name, errors.New("link target too long"))
	}
	return copy(buf, target), nil
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

// listRaw appends the entry names of the directory name below d to dst,
// unsorted, taking each name's string from prev where the name is there
// too (see reuse), and reports whether the names are prev's, in prev's
// order.
func (d Dir) listRaw(name string, dst, prev []string) ([]string, bool, error) {
	if strings.IndexByte(name, 0) >= 0 {
		return dst, false, d.err("open", name, errInvalid)
	}
	f, err := os.Open(d.full(name))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return dst, len(prev) == 0, nil
		}
		return dst, false, d.err("open", name, errno(err))
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return dst, false, d.err("getdents", name, errno(err))
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
