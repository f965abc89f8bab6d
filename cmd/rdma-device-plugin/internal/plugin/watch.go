package plugin

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/fsnotify/fsnotify"

	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// fileWatch watches the directories whose changes the Manager answers:
// the kubelet's (kubelet.sock and the plugin's sockets), the config
// file's, and the host's /dev, where the RDMA char devices come and go
// with the driver (a reload of mlx5_ib / ib_uverbs removes and recreates
// /dev/infiniband).
type fileWatch struct {
	w *fsnotify.Watcher
	// dev watches devDir and ibDir; classify counts only entries coming
	// and going there (see devEntry). nil when it could not be set up.
	dev                   *fsnotify.Watcher
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
	if st, err := os.Stat(opts.KubeletDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("kubelet directory %s: not a directory (%v): mount the kubelet's device-plugins directory or set --kubelet-dir", opts.KubeletDir, err)
	}
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
	// A second inotify instance: one more of the user's
	// fs.inotify.max_user_instances, which a busy node may have used up.
	if f.dev, err = fsnotify.NewWatcher(); err == nil {
		err = f.dev.Add(f.devDir)
	}
	if err != nil {
		log.Warn("RDMA char devices coming and going are noticed at the next periodic rescan only", "dir", f.devDir, "err", err)
		f.devDir = ""
		if f.dev != nil {
			f.dev.Close()
			f.dev = nil
		}
		return f, nil
	}
	f.watchIB()
	return f, nil
}

// watchIB watches <host root>/dev/infiniband when it exists (it comes and
// goes with the RDMA modules; its parent's watch says when).
func (f *fileWatch) watchIB() {
	if f.dev != nil {
		_ = f.dev.Add(f.ibDir)
	}
}

// devEvents are the dev watch's channels; nil (never ready) without one.
func (f *fileWatch) devEvents() (<-chan fsnotify.Event, <-chan error) {
	if f.dev == nil {
		return nil, nil
	}
	return f.dev.Events, f.dev.Errors
}

func (f *fileWatch) close() {
	f.w.Close()
	if f.dev != nil {
		f.dev.Close()
	}
}

// Watch is a Manager's watch of the files it answers (see fileWatch), set
// up before the config is read and the node first scanned: a change to
// either while the plugin starts is then an event Run answers. Without
// it, a config change in that window went unnoticed until the next one,
// and RDMA devices still appearing while a booting node loads its
// drivers until the next periodic rescan.
type Watch struct {
	fw   *fileWatch
	once sync.Once
}

// NewWatch watches what a Manager with opts answers: opts.KubeletDir,
// the directory of opts.ConfigPath and <opts.HostRoot>/dev. Pass it as
// Options.Watch, and Run closes it; close it when Run is not called.
func NewWatch(opts Options) (*Watch, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	fw, err := newFileWatch(&opts, log)
	if err != nil {
		return nil, err
	}
	return &Watch{fw: fw}, nil
}

// Close stops the watch; it may be called more than once.
func (w *Watch) Close() { w.once.Do(w.fw.close) }

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
	case dir == f.ibDir && devEntry(ev):
		return devChange
	case f.devDir != "" && dir == f.devDir && base == filepath.Base(rdma.DevDir) && devEntry(ev):
		if ev.Has(fsnotify.Create) {
			f.watchIB()
		}
		return devChange
	}
	return noChange
}

// devEntry reports whether ev is an entry of a /dev directory coming or
// going (created, removed, renamed in or out), the only events of the dev
// watch that change what the plugin serves. fsnotify also reports writes
// and mode changes of the entries (a process on the host writing to a
// char device, a udev rule's chmod): those leave the devices as they
// were, and cost a wakeup each, not a rescan.
func devEntry(ev fsnotify.Event) bool {
	return ev.Has(fsnotify.Create) || ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename)
}
