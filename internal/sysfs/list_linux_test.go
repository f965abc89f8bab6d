//go:build !fastpath_portable

package sysfs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// List reads until getdents returns 0, however little each call returns:
// the real getdents, asked for at most a page (as FUSE and virtiofs
// answer) or for a few entries at a time, on a directory many pages long.
func TestListShortReads(t *testing.T) {
	root := t.TempDir()
	var want []string
	for i := 0; i < 2000; i++ {
		n := fmt.Sprintf("entry-with-a-longish-name-%05d", i)
		want = append(want, n)
		require.NoError(t, os.WriteFile(filepath.Join(root, n), nil, 0o644))
	}
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	for _, limit := range []int{4096, 512, 300} {
		calls, short := 0, 0
		got, _, err := d.listRawWith(".", nil, nil, func(fd int, buf []byte) (int, error) {
			calls++
			n, err := unix.Getdents(fd, buf[:min(limit, len(buf))])
			if n > 0 && n < len(buf)-280 {
				short++ // an answer the old end-of-directory guess took for the last
			}
			return n, err
		})
		require.NoError(t, err, "limit %d", limit)
		slices.Sort(got)
		require.Equal(t, want, got, "limit %d", limit)
		require.Greater(t, short, 1, "limit %d: the kernel answered in pieces", limit)
		require.Equal(t, short+1, calls, "limit %d: one more call, which returns 0", limit)
	}
}

// Names are read to their NUL, which the kernel writes in a record's
// last eight bytes, whatever the bytes after it hold: the buffer is full
// of garbage before each call, and every name length from 1 to 40 (each
// place the NUL can take in the padding) is listed.
func TestListPadding(t *testing.T) {
	root := t.TempDir()
	var want []string
	for n := 1; n <= 40; n++ {
		name := strings.Repeat("x", n-1) + string(rune('a'+n%26))
		want = append(want, name)
		require.NoError(t, os.WriteFile(filepath.Join(root, name), nil, 0o644))
	}
	slices.Sort(want)
	d, err := Open(root)
	require.NoError(t, err)
	defer d.Close()
	got, _, err := d.listRawWith(".", nil, nil, func(fd int, buf []byte) (int, error) {
		for i := range buf {
			buf[i] = 0xaa
		}
		return unix.Getdents(fd, buf)
	})
	require.NoError(t, err)
	slices.Sort(got)
	require.Equal(t, want, got)
}
