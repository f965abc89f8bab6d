package nic_test

import (
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"testing"

	"github.com/fastpath-k8s/fastpath/internal/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// FuzzScanCorruptedSysfs damages one entry of a small host — garbage
// contents, a missing file, a symlink loop, a directory where a file
// should be — and scans it: errors are fine, panics and hangs are not.
func FuzzScanCorruptedSysfs(f *testing.F) {
	f.Add(uint16(0), uint8(0), []byte("0x15b3"))
	f.Add(uint16(7), uint8(1), []byte(""))
	f.Add(uint16(30), uint8(2), []byte("x"))
	f.Add(uint16(55), uint8(3), []byte("\x00\xff\n"))
	f.Add(uint16(80), uint8(0), []byte("PCI_ID=15B3:\nPCI_CLASS=zz"))
	f.Add(uint16(12), uint8(0), []byte("-99999999999999999999"))
	f.Fuzz(func(t *testing.T, which uint16, action uint8, content []byte) {
		root := t.TempDir()
		if err := fixture.Generate(root, 1, 2); err != nil {
			t.Fatal(err)
		}
		var paths []string
		_ = filepath.WalkDir(filepath.Join(root, "sys"), func(p string, d fs.DirEntry, err error) error {
			if err == nil && p != filepath.Join(root, "sys") {
				paths = append(paths, p)
			}
			return nil
		})
		sort.Strings(paths)
		target := paths[int(which)%len(paths)]
		switch action % 4 {
		case 0:
			_ = os.RemoveAll(target)
			_ = os.WriteFile(target, content, 0o644)
		case 1:
			_ = os.RemoveAll(target)
		case 2:
			_ = os.RemoveAll(target)
			_ = os.Symlink(filepath.Base(target), target) // a link to itself
		case 3:
			_ = os.RemoveAll(target)
			_ = os.MkdirAll(filepath.Join(target, string(content)), 0o755)
		}
		sc := nic.NewScanner(root)
		if snap, err := sc.Scan(); err == nil {
			for _, d := range snap.Devices {
				_, _ = sc.Device(d.PCIAddress)
			}
		}
		_, _ = sc.Device("0000:10:00.1")
	})
}
