package pci

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/sysfs"
)

// ClassLinks maps PCI addresses to the entries of a sysfs class directory
// whose devices hang directly below them. Every entry of /sys/class/<c> is
// a link to the device, "../../devices/pci0000:15/…/0000:18:00.1/<sub>/<name>",
// so one readlink per entry tells which function owns it: cheaper, on a
// node with thousands of VFs, than listing <sub> below every function.
// Entries below something else (virtual devices, auxiliary devices such as
// ice.roce.0) are left out. Owners are kept as their addresses' keys,
// sorted, beside their entries: reading a class makes no string per owner
// and no map (a node of a thousand VFs reads four classes per scan), and a
// lookup compares integers; look up with Of.
type ClassLinks struct {
	owners []ownerKey // sorted, distinct
	// all are the entries with an owner, by owner; owners[i]'s are
	// all[ends[i-1]:ends[i]] (from 0 for the first), sorted.
	all  []string
	ends []int32
	dirs []string // when read with dirs: owners[i]'s directory
}

// Of returns the entries below the function at addr.
func (c ClassLinks) Of(addr string) []string {
	if i, ok := c.find(addr); ok {
		return c.names(i)
	}
	return nil
}

// names are the entries below owners[i], a clipped window of all.
func (c ClassLinks) names(i int) []string {
	lo := int32(0)
	if i > 0 {
		lo = c.ends[i-1]
	}
	return c.all[lo:c.ends[i]:c.ends[i]]
}

// entries returns Of(addr) and the directory of the function at addr as
// its entries' links give it ("" when it has none, or the class was read
// without directories), from one search.
func (c ClassLinks) entries(addr string) (names []string, dir string) {
	i, ok := c.find(addr)
	if !ok {
		return nil, ""
	}
	if c.dirs != nil {
		dir = c.dirs[i]
	}
	return c.names(i), dir
}

func (c ClassLinks) find(addr string) (int, bool) {
	k, ok := keyOf(addr)
	if !ok {
		return 0, false
	}
	return slices.BinarySearch(c.owners, k)
}

// indexBits are the bits of a class entry's index below its owner's key
// when a class reader sorts them as one integer: an ownerKey takes 37.
const indexBits = 64 - 37

// ownerKey is a PCI address as a number that orders as the address does:
// its nine hex digits (domain, bus, device, function) below a 1 (bit 36),
// so that 0 is no owner. A scan looks owners up thousands of times; integer
// compares inline where bytes.Compare is a call per step.
type ownerKey uint64

// keyOf returns the key of addr; false when it is not a PCI address
// (ValidAddress), which it checks in the same pass. A scan makes a key
// for every class entry and every lookup: the digits go through a table,
// without a branch per kind of byte.
func keyOf(addr string) (ownerKey, bool) {
	if len(addr) != 12 || addr[4] != ':' || addr[7] != ':' || addr[10] != '.' || addr[8] > '1' || addr[11] > '7' {
		return 0, false
	}
	k, bad := uint64(1), byte(0)
	for _, i := range [...]int{0, 1, 2, 3, 5, 6, 8, 9, 11} {
		v := hexDigit[addr[i]]
		bad |= v
		k = k<<4 | uint64(v&0xf)
	}
	if bad > 0xf {
		return 0, false
	}
	return ownerKey(k), true
}

// hexDigit is the value of a lowercase hex digit (sysfs writes them so),
// 0xff for any other byte.
var hexDigit = func() (t [256]byte) {
	for i := range t {
		t[i] = 0xff
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = byte(c - '0')
	}
	for c := 'a'; c <= 'f'; c++ {
		t[c] = byte(c - 'a' + 10)
	}
	return t
}()

// ClassReader reads a class directory into ClassLinks, again and again
// (a node's periodic scan), keeping the memory of each reading for the
// next: its slices, and the strings of the entries and directories that
// are still there. The zero ClassReader is ready to use.
type ClassReader struct {
	list sysfs.Listing
	// Per entry of the listing: its owner, the listed entry whose owner
	// it takes (-1: its own), its owner's directory (and the last
	// reading's, by the same index: an unchanged class lists the same).
	owners           []ownerKey
	shared, order    []int32
	fam, heads       []int32    // by entry and by family number (shareFamilies)
	sort             ownerOrder // the entries, by owner (see read)
	paths, prevPaths []string
	out              ClassLinks
}

// Read reads <sys>/class/<class>, whose entries live in the <sub>
// directory of their parent device ("net" for class net). A missing class
// directory (module not loaded) is an empty map. Readlinks run on workers
// goroutines; names come out sorted per function. What it returns
// belongs to r: valid until r reads again.
//
// family, when not nil, is for a class whose entries come in families
// with one parent (see Family): a member whose family's head is listed
// takes the head's owner instead of reading its own link.
func (r *ClassReader) Read(sys, class, sub string, workers int, family Family) (ClassLinks, error) {
	return r.read(sys, class, sub, workers, family, false)
}

// A Family says which entries of a class one parent registers together:
// family(name) is the number of name's family and whether name is its
// head, the one entry of it whose link is read; ok is false for an entry
// of no family, which reads its own link. ib_umad, for one, registers
// umadN and issmN for one port with the same parent: umadN heads family
// N. Family numbers are the kernel's, dense from 0: a number past twice
// the class's entries (no kernel's) puts its entry in no family.
type Family func(name string) (n uint32, head, ok bool)

// read is Read, also keeping the owners' directories ("<sys>/devices/
// pci0000:15/…/0000:18:00.1", as the entries' links give them) when dirs
// is set.
func (r *ClassReader) read(sys, class, sub string, workers int, family Family, dirs bool) (ClassLinks, error) {
	dir, err := sysfs.Open(filepath.Join(sys, "class", class))
	if errors.Is(err, fs.ErrNotExist) {
		return ClassLinks{}, nil
	}
	if err != nil {
		return ClassLinks{}, fmt.Errorf("list class %s: %w", class, err)
	}
	defer dir.Close()
	// The listing is not sorted: the output's order comes from sorting
	// the entries by owner and name below, and a class lists a thousand
	// names per PF or so.
	names, _, err := r.list.Raw(dir, ".")
	if err != nil {
		return ClassLinks{}, fmt.Errorf("list class %s: %w", class, err)
	}
	// owners[i] is the key of the PCI address that names[i] hangs below,
	// zero for none: no string per owner.
	owners := resize(r.owners, len(names))
	clear(owners)
	r.owners = owners
	var paths, prevPaths []string // with dirs, each entry's owner's directory
	if dirs {
		// The last reading's directories become prevPaths; its older
		// array holds this reading's.
		r.paths, r.prevPaths = resize(r.prevPaths, len(names)), r.paths
		paths, prevPaths = r.paths, r.prevPaths
		clear(paths)
	}
	// shared[i] is the index of the listed entry whose owner names[i]
	// takes, or -1 to read its own link.
	shared := resize(r.shared, len(names))
	r.shared = shared
	for i := range shared {
		shared[i] = -1
	}
	if family != nil {
		r.shareFamilies(names, shared, family)
	}
	if workers < 1 {
		workers = 1
	}
	var wg sync.WaitGroup
	chunk := (len(names) + workers - 1) / workers
	for lo := 0; lo < len(names); lo += chunk {
		hi := min(lo+chunk, len(names))
		wg.Add(1)
		go func(lo, hi int) {
			defer wg.Done()
			var buf [512]byte
			for i := lo; i < hi; i++ {
				if shared[i] >= 0 {
					continue
				}
				// A link that vanished mid-scan has no owner.
				n, err := dir.ReadlinkTo(names[i], buf[:])
				if err != nil {
					continue
				}
				o, ok := ownerOf(buf[:n], sub, names[i])
				if !ok {
					continue
				}
				owners[i] = o
				if dirs {
					// ../../devices/<path>/<addr>/<sub>/<name>
					end := n - len(sub) - len(names[i]) - 2
					paths[i] = devicesDir(sys, buf[len(devicesPrefix):end], prevPaths, i)
				}
			}
		}(lo, hi)
	}
	wg.Wait()
	for i, j := range shared {
		if j >= 0 {
			owners[i] = owners[j]
		}
	}
	// Each owner's names are a window of one slice: the entries with an
	// owner, sorted by it and then by name. The entries are sorted as
	// one integer each, the owner's key above the entry's index
	// (ownerOrder);
	// names are then compared only within an owner that has several
	// (few do), so the listing need not be sorted first.
	// The slices are sized for every entry at once: grown by appending,
	// a first reading of a thousand entries allocates each about three
	// times over, fresh memory that a start pays a page fault for.
	order := r.sort.appendOrder(slices.Grow(r.order[:0], len(names)), owners)
	for lo := 0; lo < len(order); {
		hi := lo + 1
		for hi < len(order) && owners[order[hi]] == owners[order[lo]] {
			hi++
		}
		if hi-lo > 1 {
			slices.SortFunc(order[lo:hi], func(a, b int32) int { return strings.Compare(names[a], names[b]) })
		}
		lo = hi
	}
	r.order = order
	out := &r.out
	clear(out.all)
	clear(out.dirs)
	out.owners, out.all, out.ends = slices.Grow(out.owners[:0], len(order)), resize(out.all, len(order)), slices.Grow(out.ends[:0], len(order))
	if dirs {
		out.dirs = slices.Grow(out.dirs[:0], len(order))
	} else {
		out.dirs = nil
	}
	for lo := 0; lo < len(order); {
		o := owners[order[lo]]
		hi := lo
		path := ""
		for ; hi < len(order) && owners[order[hi]] == o; hi++ {
			out.all[hi] = names[order[hi]]
			if dirs && paths[order[hi]] != "" {
				path = paths[order[hi]]
			}
		}
		out.owners = append(out.owners, o)
		out.ends = append(out.ends, int32(hi))
		if dirs {
			out.dirs = append(out.dirs, path)
		}
		lo = hi
	}
	return *out, nil
}

// shareFamilies sets shared[i] to the index of the head of names[i]'s
// family, for every member whose head is listed. The families are
// numbered densely, so their heads are found by number in a slice: no
// sort of the listing and no search per member (a node of a thousand VFs
// has two thousand ib_umad entries).
func (r *ClassReader) shareFamilies(names []string, shared []int32, family Family) {
	// fam[i] is names[i]'s family number times two, plus one for its
	// head; -1 for no family.
	fam := resize(r.fam, len(names))
	r.fam = fam
	limit := 2*uint32(len(names)) + 1
	most := -1
	for i, name := range names {
		fam[i] = -1
		n, head, ok := family(name)
		if !ok || n >= limit {
			continue
		}
		fam[i] = int32(2 * n)
		if head {
			fam[i]++
		}
		most = max(most, int(n))
	}
	// heads[n] is the index of family n's head, -1 for none listed.
	heads := resize(r.heads, most+1)
	r.heads = heads
	for n := range heads {
		heads[n] = -1
	}
	for i, f := range fam {
		if f >= 0 && f%2 == 1 {
			heads[f/2] = int32(i)
		}
	}
	for i, f := range fam {
		if f >= 0 && f%2 == 0 {
			shared[i] = heads[f/2]
		}
	}
}

// devicesDir is "<sys>/devices/<rel>": prev[i] when that is it (the last
// reading's directory for the same entry), else a new string.
func devicesDir(sys string, rel []byte, prev []string, i int) string {
	const mid = "/devices/"
	if i < len(prev) {
		p := prev[i]
		if len(p) == len(sys)+len(mid)+len(rel) && p[:len(sys)] == sys && p[len(sys):len(sys)+len(mid)] == mid && p[len(sys)+len(mid):] == string(rel) {
			return p
		}
	}
	return sys + mid + string(rel)
}

// resize returns s with length n, reusing its array when it is large
// enough. What it holds is not cleared.
func resize[S ~[]E, E any](s S, n int) S {
	if cap(s) < n {
		return make(S, n)
	}
	return s[:n]
}

// ClassLinkInside reports whether target, the target of an entry of
// <sys>/class/<class>, stays inside <sys>/devices: the kernel makes every
// one relative, "../../devices/…", with no "." or ".." after that. A link
// that leaves (a tree built by hand, a mount gone wrong) is not followed
// and names no owner, as pci's bus links are checked before use.
func ClassLinkInside(target string) bool { return classLinkInside([]byte(target)) }

var devicesPrefix = []byte("../../devices/")

func classLinkInside(target []byte) bool {
	rest, ok := bytes.CutPrefix(target, devicesPrefix)
	if !ok || len(rest) == 0 {
		return false
	}
	for len(rest) > 0 {
		elem := rest
		if i := bytes.IndexByte(rest, '/'); i >= 0 {
			elem, rest = rest[:i], rest[i+1:]
		} else {
			rest = nil
		}
		if len(elem) == 0 || len(elem) <= 2 && elem[0] == '.' && (len(elem) == 1 || elem[1] == '.') {
			return false
		}
	}
	return true
}

// ownerOf returns the key of the PCI address in
// "../../devices/…/<addr>/<sub>/<name>"; false when the link names no PCI
// function or leaves <sys>/devices.
func ownerOf(target []byte, sub, name string) (ownerKey, bool) {
	if !classLinkInside(target) {
		return 0, false
	}
	// "/<addr>/<sub>/<name>" at the end, <addr> twelve bytes: compared in
	// place, not cut off piece by piece.
	at := len(target) - len(name) - len(sub) - 2 // the slash after <addr>
	if at < 13 || target[at-13] != '/' || target[at] != '/' || target[at+1+len(sub)] != '/' ||
		string(target[at+1:at+1+len(sub)]) != sub || string(target[at+2+len(sub):]) != name {
		return 0, false
	}
	return keyOf(string(target[at-12 : at]))
}
