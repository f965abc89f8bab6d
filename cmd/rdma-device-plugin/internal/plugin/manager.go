package plugin

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// settleDelay is how long a burst of events in the kubelet directory is
// let settle before the servers are reconciled with it.
const settleDelay = 20 * time.Millisecond

// devSettleDelay is how long changes of the RDMA char devices are let
// settle before the host is rescanned.
const devSettleDelay = 200 * time.Millisecond

// Scan is one result of scanning the host and building the pools.
type Scan struct {
	Pools []pool.Pool
	// RDMACM is the node's rdma_cm (nic.Snapshot.RDMACM, a host path; ""
	// when the node has none): a container given an RDMA device of any
	// pool gets it too.
	RDMACM string
	// Interval is the periodic rescan interval; 0 turns it off.
	Interval time.Duration
	// NoNetdev are the VFs bound to a netdev driver that the scan found
	// without a netdev, by PCI address (in a pod since before this run,
	// or not up yet): their netdev appearing calls for a rescan.
	NoNetdev map[string]bool
}

// ScanFunc scans the host and builds the pools. reloadConfig asks it to
// re-read the config file first; a broken file should keep the last good
// config (and log why), not fail the scan.
type ScanFunc func(reloadConfig bool) (Scan, error)

// Options configure a Manager.
type Options struct {
	KubeletDir string // /var/lib/kubelet/device-plugins
	// HostRoot is where the plugin reads the node's /sys and /dev ("/"
	// in production, "/host" with the node's root mounted there).
	HostRoot string
	// NodeRoot is what HostRoot is on the node itself ("/" in
	// production; a fixture host's directory in tests): the device paths
	// handed to the kubelet (DeviceSpec host paths) and written to CDI
	// specs are under it, never under HostRoot, which is a path inside
	// the plugin's container.
	NodeRoot   string
	DevInfoDir string // "" disables device-info files
	CDIDir     string // "" disables CDI
	ConfigPath string // watched for changes; "" = not watched
	// Watch is the watch of the kubelet directory, the config and /dev,
	// made by NewWatch before the config was read and the first scan
	// made (nil: Run makes one). Run closes it.
	Watch *Watch
	Scan  ScanFunc // rescans and config reloads; the first scan is Run's argument
	// Serves picks the pools this Manager serves to the kubelet (nil:
	// all of them). A pool is served by one API, never both: the pools it
	// turns down are left to another (a DRA driver), and get no socket,
	// no registration and no CDI spec from here.
	Serves func(p *pool.Pool) bool
	Links  LinkSource // nil: no event-driven health
	// PodResources says which VFs live pods hold (health of a VF whose
	// netdev left the host netns); nil: the Allocate calls seen decide.
	PodResources PodDevices
	Metrics      *Metrics // nil: no metrics
	Log          *slog.Logger
	// RegisterTimeout bounds one Register call (default 5 s);
	// RetryInterval is the wait before retrying a failed registration
	// (default 200 ms).
	RegisterTimeout time.Duration
	RetryInterval   time.Duration
	// WaitLogInterval is how often the plugin says again that it waits
	// for a kubelet.sock that is absent (it says so at once the first
	// time); default 5 minutes.
	WaitLogInterval time.Duration
	// ReleaseMemory gives a scan's garbage back to the OS (serve.go:
	// debug.FreeOSMemory, a GC and a release); nil: never. A scan
	// allocates several times what the pools keep and the daemon then
	// idles until the next one; without this the runtime keeps that
	// memory resident until its background scavenger gets to it. It runs
	// after each rescan, and after the first registration once Allocate
	// calls pause (releaseQuiet, releaseMaxWait).
	ReleaseMemory func()
}

// Manager keeps one server per pool registered with the kubelet and their
// device lists true. All state below is owned by the Run goroutine except
// where a mutex says otherwise.
type Manager struct {
	opts    Options
	log     *slog.Logger
	devInfo *devInfoStore
	cdi     *cdiSpecs // nil: no CDI

	servers map[string]*server // by resource name
	pools   map[string]pool.Pool
	rdmaCM  string // Scan.RDMACM of the last scan
	links   map[string]linkState
	// watched are the netdevs (VF and PF) of the pools' devices: the
	// links whose events change health.
	watched map[string]bool
	// vfOfNetdev maps the exclusive pools' VF netdevs to their PCI
	// addresses.
	vfOfNetdev map[string]string
	// held are the VFs live pods hold, as refreshHeld last learnt from
	// the kubelet (nil: unknown); heldFailed says the last ask failed.
	held       map[string]bool
	heldFailed bool
	// noNetdev is the last scan's Scan.NoNetdev.
	noNetdev map[string]bool
	interval time.Duration
	// kubelet is the identity of the kubelet.sock we registered with.
	kubelet fileID
	// kubeletGone is set by a Remove event of kubelet.sock: the next one
	// seen is a new kubelet even when the file system reuses the inode and
	// the (coarse) ctime matches.
	kubeletGone bool
	// waitingSince is when kubelet.sock was first seen absent; zero while
	// it exists.
	waitingSince time.Time
	// registered are the resources registered with that kubelet.
	registered map[string]bool
	// registeredOnce is set once the first registration round is over:
	// what apply defers until then is done; firstRound is closed then.
	registeredOnce bool
	firstRound     chan struct{}
	// status is what the Run goroutine last published for the probes.
	status probeStatus

	// registeredAt is when the first registration round ended;
	// lastAlloc the time (UnixNano) of the last Allocate served: the
	// first memory release waits for a pause in them.
	registeredAt time.Time
	lastAlloc    atomic.Int64

	allocMu sync.Mutex // guards the fields below
	// allocated are the exclusive device IDs the kubelet has allocated
	// and whose netdevs have not come back to the host netns since: the
	// fallback when the kubelet cannot say which VFs live pods hold.
	allocated map[string]bool
}

// NewManager checks the options.
func NewManager(opts Options) (*Manager, error) {
	if opts.KubeletDir == "" {
		return nil, errors.New("plugin: kubelet directory not set")
	}
	if opts.Scan == nil {
		return nil, errors.New("plugin: no scan function")
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if opts.HostRoot == "" {
		opts.HostRoot = "/"
	}
	if opts.NodeRoot == "" {
		opts.NodeRoot = "/"
	}
	if opts.RegisterTimeout == 0 {
		opts.RegisterTimeout = 5 * time.Second
	}
	if opts.WaitLogInterval == 0 {
		opts.WaitLogInterval = 5 * time.Minute
	}
	if opts.RetryInterval == 0 {
		opts.RetryInterval = 200 * time.Millisecond
	}
	var cdi *cdiSpecs
	if opts.CDIDir != "" {
		var err error
		if cdi, err = newCDISpecs(opts.CDIDir); err != nil {
			return nil, err
		}
	}
	return &Manager{
		opts: opts, log: opts.Log, devInfo: newDevInfoStore(opts.DevInfoDir), cdi: cdi,
		servers: map[string]*server{}, pools: map[string]pool.Pool{}, links: map[string]linkState{}, watched: map[string]bool{}, vfOfNetdev: map[string]string{},
		registered: map[string]bool{}, allocated: map[string]bool{}, firstRound: make(chan struct{}),
	}, nil
}

// Run serves first, the host's first scan, then keeps it true until ctx
// ends; then it stops the servers and removes their sockets, device-info
// files and CDI specs. It returns an error only when it cannot start.
func (m *Manager) Run(ctx context.Context, first Scan) error {
	scan := first
	w := m.opts.Watch
	if w == nil {
		var err error
		if w, err = NewWatch(m.opts); err != nil {
			return err
		}
	}
	defer w.Close()
	fw := w.fw
	defer m.shutdown()

	m.apply(scan)
	ticker := newTicker(scan.Interval)
	m.interval = scan.Interval
	defer ticker.stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	// While kubelet.sock is absent, a reminder every WaitLogInterval: a
	// plugin that waits says so (reconcile said it the first time).
	waitLog := time.NewTimer(time.Hour)
	waitLog.Stop()
	defer waitLog.Stop()
	waitLogArmed := false
	schedule := func(ok bool) {
		if !ok {
			retry.Reset(m.opts.RetryInterval)
		}
		if !m.waitingSince.IsZero() && !waitLogArmed {
			waitLog.Reset(m.opts.WaitLogInterval)
			waitLogArmed = true
		}
	}
	// Registration first: the link subscription (its dump of every link
	// in the netns, a veth per pod on a busy node), the scan's garbage,
	// the CDI specs and the device-info leftovers wait until the kubelet
	// knows the pools. Link events are only ever read below, after the
	// first reconcile, so subscribing here loses none that matters: the
	// dump says how every link is now.
	schedule(m.reconcile(ctx))
	linkCtx, stopLinks := context.WithCancel(ctx)
	defer stopLinks()
	var links <-chan LinkEvent
	if m.opts.Links != nil {
		var err error
		links, err = m.opts.Links.Subscribe(linkCtx)
		if err != nil {
			m.log.Warn("netlink unavailable; health follows periodic rescans only", "err", err)
			links = nil
		}
	}
	m.afterFirstRegistration()
	release := time.NewTimer(min(releaseQuiet, releaseMaxWait))
	if m.opts.ReleaseMemory == nil {
		release.Stop()
	}
	defer release.Stop()
	// A starting kubelet empties the directory and then creates
	// kubelet.sock: a burst of events. They are let settle and answered
	// with one reconcile, so that a late event of the burst does not
	// restart servers the kubelet has just connected to.
	settle := time.NewTimer(time.Hour)
	settle.Stop()
	defer settle.Stop()
	// A driver reload removes and creates every char device: a burst,
	// answered with one rescan; so is a VF's netdev that the last scan
	// missed appearing (linkEvent).
	devSettle := time.NewTimer(time.Hour)
	devSettle.Stop()
	defer devSettle.Stop()

	devEvents, devErrors := fw.devEvents()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-fw.w.Events:
			if !ok {
				return nil
			}
			switch fw.classify(ev, m.ownSocket) {
			case kubeletRemoved:
				m.kubeletGone = true
				settle.Reset(settleDelay)
			case kubeletChange:
				settle.Reset(settleDelay)
			case configChange:
				m.rescan(ctx, true, ticker)
			case devChange:
				devSettle.Reset(devSettleDelay)
			}
		case err, ok := <-fw.w.Errors:
			if ok {
				m.log.Warn("file watch error", "err", err)
			}
		case ev, ok := <-devEvents:
			if !ok {
				devEvents = nil // the watch was closed
				continue
			}
			if fw.classify(ev, m.ownSocket) == devChange {
				devSettle.Reset(devSettleDelay)
			}
		case err, ok := <-devErrors:
			if !ok {
				devErrors = nil
				continue
			}
			// Events lost, or the watch failed: look at the devices.
			m.log.Warn("file watch error", "err", err)
			devSettle.Reset(devSettleDelay)
		case ev, ok := <-links:
			if !ok {
				links = nil
				if ctx.Err() == nil {
					m.log.Warn("netlink subscription ended; health follows periodic rescans only")
				}
				continue
			}
			if m.linkEvent(ev) {
				devSettle.Reset(devSettleDelay)
			}
		case <-ticker.c():
			m.rescan(ctx, false, ticker)
		case <-settle.C:
			schedule(m.reconcile(ctx))
		case <-devSettle.C:
			m.rescan(ctx, false, ticker)
		case <-retry.C:
			schedule(m.reconcile(ctx))
		case <-waitLog.C:
			waitLogArmed = false
			if !m.waitingSince.IsZero() {
				m.log.Warn("still waiting for the kubelet: no kubelet.sock, so no pool is registered",
					"socket", m.kubeletSock(), "waited", time.Since(m.waitingSince).Round(time.Second).String())
				waitLog.Reset(m.opts.WaitLogInterval)
				waitLogArmed = true
			}
		case <-release.C:
			if d := m.releaseWait(time.Now()); d > 0 {
				release.Reset(d)
			} else {
				m.releaseMemory()
			}
		}
	}
}

func (m *Manager) ownSocket(path string) bool {
	for r := range m.servers {
		p := m.pools[r]
		if filepath.Join(m.opts.KubeletDir, SocketName(p.Prefix, p.Name)) == path {
			return true
		}
	}
	return false
}
