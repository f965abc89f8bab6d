package plugin

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// Source scans the host and builds the pools from the config file, keeping
// the last config that loaded: a broken edit of the ConfigMap must not
// take the pools away. Its Scan is the Manager's ScanFunc.
type Source struct {
	path    string
	load    []pool.Option
	scanner *nic.Scanner
	log     *slog.Logger

	mu       sync.Mutex // guards the fields below
	cfg      *pool.Config
	lastWarn string
}

// NewSource loads the config at path with opts (every reload uses them
// too); scanner reads the host.
func NewSource(path string, scanner *nic.Scanner, log *slog.Logger, opts ...pool.Option) (*Source, error) {
	cfg, err := pool.Load(path, opts...)
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings {
		log.Warn("config", "warning", w)
	}
	return &Source{path: path, load: opts, scanner: scanner, log: log, cfg: cfg}, nil
}

// Scan scans the host and builds the pools; reloadConfig reads the config
// file again first (a file that does not load is logged and the last good
// config kept).
func (s *Source) Scan(reloadConfig bool) (Scan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reloadConfig {
		cfg, err := pool.Load(s.path, s.load...)
		if err != nil {
			s.log.Error("config change rejected; keeping the last good config", "config", s.path, "err", err)
		} else {
			s.log.Info("config reloaded", "config", s.path, "resources", len(cfg.Resources))
			for _, w := range cfg.Warnings {
				s.log.Warn("config", "warning", w)
			}
			s.cfg = cfg
		}
	}
	snap, err := s.scanner.Scan()
	if err != nil {
		return Scan{}, fmt.Errorf("scan %s: %w", s.scanner.Root(), err)
	}
	pools, warns := pool.Build(s.cfg, snap.Devices)
	// Log warnings when they change, not on every rescan.
	all := append(slices.Clone(snap.Warnings), warns...)
	if key := strings.Join(all, "\n"); key != s.lastWarn {
		s.lastWarn = key
		for _, w := range all {
			s.log.Warn("discovery", "warning", w)
		}
	}
	return Scan{Pools: pools, RDMACM: snap.RDMACM, Interval: s.cfg.PeriodicUpdateInterval}, nil
}
