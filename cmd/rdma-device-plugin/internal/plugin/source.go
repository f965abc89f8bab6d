package plugin

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Source scans the host and builds the pools from the config file, keeping
// the last config that loaded: a broken edit of the ConfigMap must not
// take the pools away. Its Scan is the Manager's ScanFunc.
type Source struct {
	path    string
	load    []pool.Option
	scanner *nic.Scanner
	log     *slog.Logger
	// extra are pools from somewhere else than the config file (the
	// SriovNetworkNodePolicies' resourceNames), added to every load.
	extra []pool.Resource
	// DefaultRoutes, when set, names the netdevs that carry the node's
	// default route (DefaultRouteNetdevs), which no exclusive pool takes
	// (pool.WithDefaultRoutes). Set it before the first Scan.
	DefaultRoutes func() ([]string, error)
	// Metrics counts the config changes that did not load; nil: none.
	Metrics *Metrics

	mu       sync.Mutex // guards the fields below
	cfg      *pool.Config
	lastWarn string
	// next is a scan made just before (UseSnapshot), taken by the next
	// Scan instead of scanning again.
	next *nic.Snapshot
	// pooled are the VFs of the last scan's pools, by PCI address, for
	// inPod.
	pooled map[string]*nic.Device
}

// NewSource loads the config at path with opts (every reload uses them
// too); scanner reads the host.
func NewSource(path string, scanner *nic.Scanner, log *slog.Logger, opts ...pool.Option) (*Source, error) {
	return NewSourceWith(path, nil, scanner, log, opts...)
}

// NewSourceWith is NewSource with extra pools, which every load of the
// config gets too (provision.Merge: the config's own definition of a
// resource wins). With extra pools, a config file that does not exist is
// a config of none.
func NewSourceWith(path string, extra []pool.Resource, scanner *nic.Scanner, log *slog.Logger, opts ...pool.Option) (*Source, error) {
	s := &Source{path: path, load: opts, scanner: scanner, log: log, extra: extra}
	cfg, err := s.loadConfig()
	if err != nil {
		return nil, err
	}
	for _, w := range cfg.Warnings {
		log.Warn("config", "warning", w)
	}
	s.cfg = cfg
	return s, nil
}

func (s *Source) loadConfig() (*pool.Config, error) {
	cfg, err := pool.Load(s.path, s.load...)
	if len(s.extra) == 0 {
		return cfg, err
	}
	if errors.Is(err, pool.ErrNoConfig) {
		cfg, err = nil, nil
	}
	if err != nil {
		return nil, err
	}
	return provision.Merge(cfg, s.extra), nil
}

// Scan scans the host and builds the pools; reloadConfig reads the config
// file again first (a file that does not load is logged and the last good
// config kept).
func (s *Source) Scan(reloadConfig bool) (Scan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if reloadConfig {
		cfg, err := s.loadConfig()
		if err != nil {
			s.log.Error("config change rejected; keeping the last good config", "config", s.path, "err", err)
			s.Metrics.reloadRejected()
		} else {
			s.log.Info("config reloaded", "config", s.path, "resources", len(cfg.Resources))
			for _, w := range cfg.Warnings {
				s.log.Warn("config", "warning", w)
			}
			s.cfg = cfg
		}
	}
	// The route dump (0.5–1.3 ms, mostly the kernel's) runs beside the
	// scan rather than before it: the first scan is on the way to
	// registration.
	type routes struct {
		names []string
		err   error
	}
	var routesc chan routes
	if s.DefaultRoutes != nil {
		routesc = make(chan routes, 1)
		go func() {
			names, err := s.DefaultRoutes()
			routesc <- routes{names, err}
		}()
	}
	snap, err := s.next, error(nil)
	s.next = nil
	if snap == nil {
		snap, err = s.scanner.Scan()
	}
	var r routes
	if routesc != nil {
		r = <-routesc
	}
	if err != nil {
		return Scan{}, fmt.Errorf("scan %s: %w", s.scanner.Root(), err)
	}
	inPod, noNetdev := s.inPod(snap)
	var build []pool.BuildOption
	var routeWarn string
	switch {
	case routesc == nil:
	case r.err != nil:
		routeWarn = fmt.Sprintf("the node's default routes: %v; no function is left out of exclusive pools as the node's own network", r.err)
	default:
		build = append(build, pool.WithDefaultRoutes(r.names...))
	}
	pools, warns := pool.Build(s.cfg, snap.Devices, build...)
	n := 0
	for i := range pools {
		n += len(pools[i].Devices)
	}
	s.pooled = make(map[string]*nic.Device, n)
	for i := range pools {
		for j := range pools[i].Devices {
			if d := &pools[i].Devices[j]; d.IsVF() {
				s.pooled[d.PCIAddress] = d
			}
		}
	}
	// Log warnings when they change, not on every rescan.
	all := slices.DeleteFunc(slices.Clone(snap.Warnings), func(w string) bool {
		addr, what, _ := strings.Cut(w, ": ")
		return inPod[addr] != "" && (what == "no netdev" || strings.HasPrefix(what, "no RDMA device"))
	})
	for _, addr := range slices.Sorted(maps.Keys(inPod)) {
		all = append(all, addr+": "+inPod[addr])
	}
	all = append(all, warns...)
	if routeWarn != "" {
		all = append(all, routeWarn)
	}
	if key := strings.Join(all, "\n"); key != s.lastWarn {
		s.lastWarn = key
		for _, w := range all {
			s.log.Warn("discovery", "warning", w)
		}
	}
	return Scan{Pools: pools, RDMACM: snap.RDMACM, Interval: s.cfg.PeriodicUpdateInterval, NoNetdev: noNetdev}, nil
}

// UseSnapshot makes the next Scan take snap, a scan of the node made a
// moment ago (provisioning's, when it changed nothing), instead of
// scanning again.
func (s *Source) UseSnapshot(snap *nic.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.next = snap
}

// inPod gives a VF that a CNI moved into a pod what the last scan saw of
// it, and says so, by PCI address. In the pod's network namespace its
// netdev, and with the RDMA subsystem in exclusive mode its RDMA device
// too, are out of the host's sysfs: a scan finds the VF bound to its
// driver with neither (or, in shared mode, without its netdev). Taken as
// found, it would leave every pool that asks for RDMA (isRdma) and the
// pool's CDI spec while the pod runs (a restarting container could not
// resolve its CDI name), and its netdev's return would go unwatched. A VF
// whose RDMA device alone is gone (mlx5_ib unloaded) keeps nothing: that
// is a fault to show, not a move. The VFs bound to a netdev driver that
// stay without a netdev (in a pod since before this run, or not up yet)
// are noNetdev (Scan.NoNetdev).
func (s *Source) inPod(snap *nic.Snapshot) (out map[string]string, noNetdev map[string]bool) {
	out = map[string]string{}
	for i := range snap.Devices {
		d := &snap.Devices[i]
		if !d.IsVF() || d.IsVFIO() || d.Driver == "" || d.Netdev != "" {
			continue
		}
		p, ok := s.pooled[d.PCIAddress]
		if !ok || p.Driver != d.Driver || p.Netdev == "" {
			if noNetdev == nil {
				noNetdev = map[string]bool{}
			}
			noNetdev[d.PCIAddress] = true
			continue
		}
		d.Netdev = p.Netdev
		if d.RDMADevice == "" && p.RDMADevice != "" {
			d.RDMADevice, d.LinkType, d.CharDevices = p.RDMADevice, p.LinkType, p.CharDevices
			out[d.PCIAddress] = fmt.Sprintf("netdev %s and RDMA device %s are not in the host's network namespace (moved into a pod?); kept as the last scan saw them", d.Netdev, d.RDMADevice)
			continue
		}
		out[d.PCIAddress] = fmt.Sprintf("netdev %s is not in the host's network namespace (moved into a pod?); kept as the last scan saw it", d.Netdev)
	}
	return out, noNetdev
}
