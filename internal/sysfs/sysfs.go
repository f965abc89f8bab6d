// Package sysfs reads sysfs attributes, links and directories relative to
// an open directory: a scan of a 1024-VF host makes about ten thousand
// reads, and on a VM each path walk from / costs more than the read
// itself.
//
// sysfs_linux.go is that implementation, through golang.org/x/sys/unix's
// *at calls and os listings. On other systems (and on Linux
// with the build tag fastpath_portable, which is how it is tested) Dir
// reads through the os package by full path instead: slower, the same
// results, so that a copied sysfs tree can be read on a laptop.
package sysfs

import (
	"bytes"
	"path/filepath"
	"slices"
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

// At is a view of the directory sub below d that shares d's descriptor:
// names are resolved from d through sub, which costs a longer path walk
// per call but no open and close of sub. Only closing d releases it.
func (d Dir) At(sub string) Dir {
	if d.sub != "" {
		sub = d.sub + "/" + sub
	}
	return Dir{fd: d.fd, base: d.base, sub: sub, view: true}
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

// Readlink returns the target of the link name below d.
func (d Dir) Readlink(name string) (string, error) {
	var buf [512]byte
	n, err := d.ReadlinkTo(name, buf[:])
	if err != nil {
		return "", err
	}
	return string(buf[:n]), nil
}

// Listing is one directory's listing kept for the next listing of the same
// directory: a node scan lists the same few large directories (the bus,
// the RDMA classes) every time and mostly finds them as they were. The
// next List reuses the listing's slices and the string of every name that
// is still there, and, when the directory is unchanged, returns the sorted
// names it already has. The zero Listing is ready to use.
type Listing struct {
	raw, prevRaw []string // in the order the kernel listed them
	sorted       []string
	sortedOK     bool // sorted is prevRaw's names (before a List, raw's)
}

// List is d.List(name) into l. What it returns belongs to l: valid until
// l lists again.
func (l *Listing) List(d Dir, name string) ([]string, error) {
	sortedOK := l.sortedOK
	raw, same, err := l.Raw(d, name)
	if err != nil || len(raw) == 0 {
		return nil, err
	}
	if !same || !sortedOK {
		clear(l.sorted)
		l.sorted = append(l.sorted[:0], raw...)
		slices.Sort(l.sorted)
	}
	l.sortedOK = true
	return l.sorted, nil
}

// Raw is List without the sort: the names in the order the kernel listed
// them, and whether they are the last listing's, in the same order (the
// directory is unchanged). For a caller that sorts only what it needs.
// What it returns belongs to l: valid until l lists again.
func (l *Listing) Raw(d Dir, name string) ([]string, bool, error) {
	l.prevRaw, l.raw = l.raw, l.prevRaw
	clear(l.raw[:cap(l.raw)])
	raw, same, err := d.listRaw(name, l.raw[:0], l.prevRaw)
	l.raw = raw
	l.sortedOK = false
	if err != nil {
		return nil, false, err
	}
	return raw, same, nil
}

// reuse hands out the strings of an earlier listing of a directory to a
// new one. A kernel lists an unchanged directory in the same order each
// time, so the new listing's names are compared with the earlier ones in
// step. A name added, or one removed between two that are still there,
// costs nothing more; after two adjacent names removed, the names that
// follow are made anew. Either way the listing is right, only the reuse
// stops.
type reuse struct {
	prev []string
	next int  // where in prev the next name is looked for
	same bool // every name so far was prev's next
}

// take returns prev's string for name, if it has it where expected (next,
// or just after: one name removed).
func (r *reuse) take(name string) (string, bool) {
	for k := r.next; k < len(r.prev) && k <= r.next+1; k++ {
		if r.prev[k] == name {
			r.same = r.same && k == r.next
			r.next = k + 1
			return r.prev[k], true
		}
	}
	r.same = false
	return "", false
}
