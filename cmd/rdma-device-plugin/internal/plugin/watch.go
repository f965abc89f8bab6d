package plugin

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"

	"github.com/fsnotify/fsnotify"

	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// fileWatch watches the directories whose changes the Manager answers:
// the kubelet's (kubelet.sock and the plugin's sockets), the config
// file's, and the host's /dev, where the RDMA char devices come and go
// with the driver (a reload of mlx5_ib / ib_uverbs removes and recreates
// /dev/infiniband).
type fileWatch struct {
	w                     *fsnotify.Watcher
	kubeletDir            string
	configDir, configBase string // "" when the config is not watched
	devDir, ibDir         string // <host root>/dev and its infiniband/
	log                   *slog.Logger
}

// change is what an event means to the Manager.
type change int

const (
	noChange change = iota
	// kubeletChange: kubelet.sock or one of our sockets changed.
	kubeletChange
	// kubeletRemoved: kubelet.sock was removed or renamed away; whatever
	// kubelet.sock exists next is a new kubelet.
	kubeletRemoved
	configChange
	// devChange: RDMA char devices appeared or went.
	devChange
)

func newFileWatch(opts *Options, log *slog.Logger) (*fileWatch, error) {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, fmt.Errorf("watch %s: %w", opts.KubeletDir, err)
	}
	f := &fileWatch{w: w, kubeletDir: filepath.Clean(opts.KubeletDir), log: log}
	if err := w.Add(f.kubeletDir); err != nil {
		w.Close()
		return nil, fmt.Errorf("watch %s: %w", opts.KubeletDir, err)
	}
	if opts.ConfigPath != "" {
		dir, base := filepath.Split(filepath.Clean(opts.ConfigPath))
		f.configDir, f.configBase = filepath.Clean(dir), base
		if err := w.Add(f.configDir); err != nil {
			log.Warn("config changes will not be noticed until restart", "config", opts.ConfigPath, "err", err)
			f.configDir = ""
		}
	}
	f.devDir = filepath.Join(opts.HostRoot, "dev")
	f.ibDir = filepath.Join(opts.HostRoot, rdma.DevDir)
	if err := w.Add(f.devDir); err != nil {
		log.Warn("RDMA char devices coming and going are noticed at the next periodic rescan only", "dir", f.devDir, "err", err)
		f.devDir = ""
	}
	f.watchIB()
	return f, nil
}

// watchIB watches <host root>/dev/infiniband when it exists (it comes and
// goes with the RDMA modules; its parent's watch says when).
func (f *fileWatch) watchIB() { _ = f.w.Add(f.ibDir) }

func (f *fileWatch) close() { f.w.Close() }

// classify says what ev means; own reports whether a path is one of the
// plugin's sockets.
func (f *fileWatch) classify(ev fsnotify.Event, own func(path string) bool) change {
	dir, base := filepath.Split(ev.Name)
	dir = filepath.Clean(dir)
	switch {
	case dir == f.kubeletDir:
		// Events can arrive after the state they describe changed again;
		// the Manager looks at the directory, not at the event.
		if base == KubeletSocket && (ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)) {
			return kubeletRemoved
		}
		if base == KubeletSocket || own(ev.Name) {
			return kubeletChange
		}
	case f.configDir != "" && dir == f.configDir:
		// ConfigMap volumes swap a "..data" symlink, so any write, create
		// or rename in the directory may change the file.
		if base == f.configBase || strings.HasPrefix(base, "..") {
			return configChange
		}
	case dir == f.ibDir:
		return devChange
	case f.devDir != "" && dir == f.devDir && base == filepath.Base(rdma.DevDir):
		if ev.Has(fsnotify.Create) {
			f.watchIB()
		}
		return devChange
	}
	return noChange
}
