package plugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/fastpath-k8s/fastpath/internal/atomicfile"
	"github.com/fastpath-k8s/fastpath/pkg/devinfo"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// devInfoStore writes device-info files for allocated devices, so that a
// CNI (via Multus) can learn which VF the kubelet gave the pod, and removes
// every file it wrote when the plugin stops.
type devInfoStore struct {
	dir string
	// files is held (shared) by each write from its temporary file to its
	// entry in written, and (exclusive) by the sweep of an earlier run's
	// files, so that the sweep never takes a write in flight for a
	// leftover.
	files sync.RWMutex
	mu    sync.Mutex // guards the fields below
	// written holds the files this process wrote, by path.
	written map[string]writtenFile
}

// writtenFile is what a file held and which file it was when written.
type writtenFile struct {
	data string
	id   fileID
}

func newDevInfoStore(dir string) *devInfoStore {
	return &devInfoStore{dir: dir, written: map[string]writtenFile{}}
}

// DevInfoPath is <dir>/<prefix>-<name>-<bdf>-device.json.
func DevInfoPath(dir, prefix, name, bdf string) string {
	return filepath.Join(dir, fmt.Sprintf("%s-%s-%s-device.json", prefix, name, bdf))
}

// write stores the file for d, mode 0444, atomically (temp file + rename).
func (s *devInfoStore) write(prefix, name string, d *nic.Device) error {
	if s == nil || s.dir == "" {
		return nil
	}
	data, err := json.Marshal(devinfo.NewPCI(d.PCIAddress, d.RDMADevice, d.PFAddress))
	if err != nil {
		return err
	}
	path := DevInfoPath(s.dir, prefix, name, d.PCIAddress)
	// A VF is allocated again for every pod that gets it, and its file
	// does not change: leave the file alone while it is the one written
	// (same inode, unchanged since: ctime) with the same content.
	// Replacing it costs far more (ext4 flushes a file renamed over
	// another) than a stat.
	s.mu.Lock()
	w, ok := s.written[path]
	s.mu.Unlock()
	if ok && w.data == string(data) {
		if id, err := statID(path); err == nil && id == w.id {
			return nil
		}
	}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return fmt.Errorf("devinfo %s: create directory: %w", s.dir, err)
	}
	s.files.RLock()
	defer s.files.RUnlock()
	if err := atomicfile.Write(path, data, 0o444); err != nil {
		return fmt.Errorf("devinfo: %w", err)
	}
	// Not knowing the file's identity only costs a rewrite next time.
	id, _ := statID(path)
	s.mu.Lock()
	s.written[path] = writtenFile{data: string(data), id: id}
	s.mu.Unlock()
	return nil
}

// removeAll deletes every file this store wrote.
func (s *devInfoStore) removeAll() error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for p := range s.written {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("devinfo %s: remove: %w", p, err))
		}
		delete(s.written, p)
	}
	return errors.Join(errs...)
}

// pciGlob matches a PCI address (dddd:bb:dd.f) in a file name: a pool's
// name may continue with "-" ("rails" and "rails-b"), a PCI address
// never has one.
const pciGlob = "[0-9a-f][0-9a-f][0-9a-f][0-9a-f]:[0-9a-f][0-9a-f]:[0-9a-f][0-9a-f].[0-7]"

// DevInfoFiles lists the device-info files of pool prefix/name in dir, and
// the temporary files of writes that were cut short (atomicfile's
// .<file>.tmp-*): what the plugin of that pool may have left there.
func DevInfoFiles(dir, prefix, name string) ([]string, error) {
	// Prefixes and names are [A-Za-z0-9._-]: nothing a pattern would read.
	pattern := DevInfoPath(dir, prefix, name, pciGlob)
	files, err := filepath.Glob(pattern)
	if err != nil {
		return nil, err
	}
	tmps, err := atomicfile.Temporaries(pattern)
	if err != nil {
		return nil, err
	}
	return append(files, tmps...), nil
}

// removeLeftovers deletes the files of pool prefix/name that an earlier
// run of the plugin wrote and could not remove (it was killed): its
// device-info files, which this run writes again on the next Allocate,
// and the temporary files of writes it was killed in (atomicfile's
// .<file>.tmp-*).
func (s *devInfoStore) removeLeftovers(prefix, name string) error {
	if s == nil || s.dir == "" {
		return nil
	}
	s.files.Lock()
	defer s.files.Unlock()
	files, err := DevInfoFiles(s.dir, prefix, name)
	if err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var errs []error
	for _, f := range files {
		if _, mine := s.written[f]; mine {
			continue
		}
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("devinfo %s: remove leftover: %w", f, err))
		}
	}
	return errors.Join(errs...)
}
