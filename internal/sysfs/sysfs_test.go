package sysfs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func tree(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range map[string]string{
		"dev/uevent":           "PCI_ID=15B3:101E\n",
		"dev/sub/attr":         "  42 \n",
		"dev/long":             strings.Repeat("x", 300) + "\n",
		"dev/page":             strings.Repeat("y", 5000),
		"dev/exactly256":       strings.Repeat("z", 256),
		"dev/spaces256":        "a" + strings.Repeat(" ", 254) + "b",
		"dev/sub/deeper/attr2": "deep",
	} {
		require.NoError(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, p), []byte(content), 0o644))
	}
	require.NoError(t, os.Symlink("../other/0000:01:00.0", filepath.Join(root, "dev", "link")))
	return root
}

func TestRead(t *testing.T) {
	root := tree(t)
	d, err := Open(filepath.Join(root, "dev"))
	require.NoError(t, err)
	defer d.Close()
	require.Equal(t, filepath.Join(root, "dev"), d.Path())

	b, err := d.Read("sub/attr")
	require.NoError(t, err)
	require.Equal(t, "42", string(b))
	b, err = d.Read("long")
	require.NoError(t, err)
	require.Equal(t, strings.Repeat("x", 300), string(b), "longer than the stack buffer")
	b, err = d.Read("page")
	require.NoError(t, err)
	require.Len(t, b, MaxAttr, "cut at a page")
	b, err = d.Read("exactly256")
	require.NoError(t, err)
	require.Len(t, b, 256)
	b, err = d.Read("spaces256")
	require.NoError(t, err)
	require.Equal(t, "a"+strings.Repeat(" ", 254)+"b", string(b), "a full buffer is read again even when trimming shortens it")

	var buf [8]byte
	b, err = d.ReadTo("uevent", buf[:])
	require.NoError(t, err)
	require.Equal(t, "PCI_ID=1", string(b), "ReadTo cuts at the buffer")

	_, err = d.Read("missing")
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, filepath.Join(root, "dev", "missing"))
	_, err = d.Read("sub")
	require.Error(t, err, "a directory is not an attribute")
	_, err = d.Read("bad\x00name")
	require.ErrorIs(t, err, unix.EINVAL)
	// An attribute that is a link is not read through.
	require.NoError(t, os.Symlink("uevent", filepath.Join(root, "dev", "alias")))
	_, err = d.Read("alias")
	require.ErrorIs(t, err, unix.ELOOP)
}

func TestView(t *testing.T) {
	root := tree(t)
	top, err := Open(root)
	require.NoError(t, err)
	defer top.Close()
	v := top.At("dev").At("sub")
	require.Equal(t, filepath.Join(root, "dev", "sub"), v.Path())
	b, err := v.Read("attr")
	require.NoError(t, err)
	require.Equal(t, "42", string(b))
	names, err := v.List(".")
	require.NoError(t, err)
	require.Equal(t, []string{"attr", "deeper"}, names)
	sub, err := v.Sub("deeper")
	require.NoError(t, err)
	require.Equal(t, filepath.Join(root, "dev", "sub", "deeper"), sub.Path())
	b, err = sub.Read("attr2")
	require.NoError(t, err)
	require.Equal(t, "deep", string(b))
	sub.Close()
	v.Close() // a view's Close leaves top open
	_, err = top.Read("dev/uevent")
	require.NoError(t, err)

	_, err = v.Read("nope")
	require.ErrorContains(t, err, filepath.Join(root, "dev", "sub", "nope"))
}

func TestReadlink(t *testing.T) {
	root := tree(t)
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	got, err := d.At("dev").Readlink("link")
	require.NoError(t, err)
	require.Equal(t, "../other/0000:01:00.0", got)
	var buf [8]byte
	_, err = d.ReadlinkTo("dev/link", buf[:])
	require.ErrorContains(t, err, "too long")
	_, err = d.Readlink("dev/uevent")
	require.ErrorIs(t, err, unix.EINVAL, "not a link")
	_, err = d.Readlink("dev/missing")
	require.ErrorIs(t, err, fs.ErrNotExist)
}

// Names that do not fit the stack buffer take the slow path, with the
// same results.
func TestLongNames(t *testing.T) {
	root := t.TempDir()
	var parts []string
	for i := 0; i < 8; i++ {
		parts = append(parts, fmt.Sprintf("%040d", i))
	}
	deep := filepath.Join(parts...)
	require.NoError(t, os.MkdirAll(filepath.Join(root, deep), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, deep, "attr"), []byte("7\n"), 0o644))
	require.NoError(t, os.Symlink("target", filepath.Join(root, deep, "l")))
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	require.Greater(t, len(deep+"/attr"), 256, "longer than a name the stack buffer holds")
	b, err := d.Read(deep + "/attr")
	require.NoError(t, err)
	require.Equal(t, "7", string(b))
	b, err = d.At(deep).Read("attr")
	require.NoError(t, err)
	require.Equal(t, "7", string(b))
	l, err := d.At(deep).Readlink("l")
	require.NoError(t, err)
	require.Equal(t, "target", l)
}

func TestList(t *testing.T) {
	root := t.TempDir()
	var want []string
	// More entries than one getdents buffer holds.
	for i := 0; i < 3000; i++ {
		n := fmt.Sprintf("entry-with-a-longish-name-%05d", i)
		want = append(want, n)
		require.NoError(t, os.WriteFile(filepath.Join(root, n), nil, 0o644))
	}
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	got, err := d.List(".")
	require.NoError(t, err)
	require.Equal(t, want, got)
	got, err = d.List("missing")
	require.NoError(t, err)
	require.Nil(t, got)
	_, err = d.List(want[0])
	require.ErrorIs(t, err, unix.ENOTDIR)
}

// A Listing lists as List does however the directory changes between
// listings, and hands out the same strings for the names still there.
func TestListing(t *testing.T) {
	root := t.TempDir()
	touch := func(names ...string) {
		for _, n := range names {
			require.NoError(t, os.WriteFile(filepath.Join(root, n), nil, 0o644))
		}
	}
	rm := func(names ...string) {
		for _, n := range names {
			require.NoError(t, os.Remove(filepath.Join(root, n)))
		}
	}
	var all []string
	for i := range 3000 {
		all = append(all, fmt.Sprintf("uverbs%d", i))
	}
	touch(all...)
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	var l Listing
	strs := map[string]*byte{} // each name's string as last listed
	list := func(step string) (reused int) {
		t.Helper()
		want, err := d.List(".")
		require.NoError(t, err)
		got, err := l.List(d, ".")
		require.NoError(t, err, step)
		require.Equal(t, want, got, step)
		for _, n := range got {
			if strs[n] == unsafe.StringData(n) {
				reused++
			}
			strs[n] = unsafe.StringData(n)
		}
		return reused
	}
	require.Zero(t, list("first"))
	require.Equal(t, 3000, list("unchanged"))
	rm(all[7], all[1500], all[2999])
	require.Equal(t, 2997, list("three removed"), "a removed name costs the others nothing")
	touch("umad0", "issm0")
	require.GreaterOrEqual(t, list("two added"), 2000)
	require.Equal(t, 2999, list("unchanged again"))
	for i, n := range all {
		if i != 7 && i != 1500 && i != 2999 {
			rm(n)
		}
	}
	touch("entry-a")
	require.Zero(t, list("all replaced"))
	rm("entry-a", "umad0", "issm0")
	got, err := l.List(d, ".")
	require.NoError(t, err)
	require.Empty(t, got)
	touch("entry-b")
	require.Zero(t, list("after empty"))
	got, err = l.List(d, "missing")
	require.NoError(t, err)
	require.Empty(t, got)
	_, err = l.List(d, "entry-b")
	require.ErrorIs(t, err, unix.ENOTDIR)
	require.Zero(t, list("after an error"))
}

func TestOpenErrors(t *testing.T) {
	_, err := Open(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, fs.ErrNotExist)
	require.ErrorContains(t, err, "missing")
}

// Raw lists without sorting and says whether the directory is as it
// was; a List after it sorts what it lists.
func TestListingRaw(t *testing.T) {
	root := t.TempDir()
	for _, n := range []string{"uverbs10", "uverbs2", "umad0", "rdma_cm"} {
		require.NoError(t, os.WriteFile(filepath.Join(root, n), nil, 0o644))
	}
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	want, err := d.List(".")
	require.NoError(t, err)
	var l Listing
	raw, same, err := l.Raw(d, ".")
	require.NoError(t, err)
	require.ElementsMatch(t, want, raw)
	require.False(t, same, "a first listing")
	raw, same, err = l.Raw(d, ".")
	require.NoError(t, err)
	require.ElementsMatch(t, want, raw)
	require.True(t, same, "unchanged")
	require.NoError(t, os.Remove(filepath.Join(root, "umad0")))
	raw, same, err = l.Raw(d, ".")
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"uverbs10", "uverbs2", "rdma_cm"}, raw)
	require.False(t, same, "one removed")
	got, err := l.List(d, ".")
	require.NoError(t, err)
	require.Equal(t, []string{"rdma_cm", "uverbs10", "uverbs2"}, got)
	_, _, err = l.Raw(d, "missing/x")
	require.NoError(t, err, "a missing directory is empty")
}
