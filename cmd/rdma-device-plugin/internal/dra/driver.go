// Package dra serves fastpath's exclusive VF pools through Dynamic Resource
// Allocation (resource.k8s.io/v1) as a kubelet DRA plugin: it publishes a
// ResourceSlice device per VF, from the same discovery scan the device
// plugin serves, and prepares claims with a CDI spec per claim. A pool is
// served by DRA or by the device plugin, never both (pool.ServedBy).
package dra

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"slices"
	"sync"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/internal/cdiwrite"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// DriverName is fastpath's DRA driver: the ResourceSlices' spec.driver,
// the domain of its attributes and its CDI vendor.
const DriverName = "rdma.fastpath-k8s.io"

// Default kubelet paths.
const (
	DefaultPluginDir   = kubeletplugin.KubeletPluginsDir + "/" + DriverName
	DefaultRegistryDir = kubeletplugin.KubeletRegistryDir
	DefaultCDIDir      = kubeletplugin.DefaultCDIDir
)

// Options configure a Driver.
type Options struct {
	// NodeName is the node's name: the ResourceSlices' node and the name
	// of the pool they publish.
	NodeName   string
	KubeClient kubernetes.Interface
	// HostRoot is where the daemon reads the node's sysfs ("/" in
	// production, "/host" with the node's / mounted there); NodeRoot is
	// that directory's path on the node, under which CDI specs name the
	// device nodes (default "/").
	HostRoot, NodeRoot string
	// PluginDir holds dra.sock, the CNI's cni.sock and the checkpoint; RegistryDir is where
	// the kubelet looks for plugin registration sockets. Both must exist.
	PluginDir   string
	RegistryDir string
	// CDIDir receives a spec per prepared claim.
	CDIDir string
	// DevInfoDir receives a device-info file per prepared VF; "" disables.
	DevInfoDir string
	// Links drive event-driven health; nil leaves health to rescans.
	Links LinkSource
	Log   *slog.Logger
	// OnFatal is told when the plugin cannot go on (a gRPC server
	// failed): the daemon should exit and be restarted.
	OnFatal func(error)
}

// Driver is the DRA side of the daemon. Update feeds it each scan's DRA
// pools; Start registers it with the kubelet and publishes.
type Driver struct {
	opts   Options
	log    *slog.Logger
	cdi    *cdiwrite.Writer
	meta   *metaSpecs // the helper's device metadata specs, kept
	cpPath string
	// statusMu serializes the claim status writes (claimstatus.go); mu
	// is not held across their API calls.
	statusMu sync.Mutex

	mu sync.Mutex // guards the fields below
	// entries are the served VFs in publishing order; byName indexes them.
	entries []entry
	byName  map[string]*entry
	rdmaCM  string // the node's rdma_cm, "" when it has none
	// watched are the netdevs (VF and PF) whose link events change health.
	watched map[string]bool
	links   map[string]linkState
	cp      *checkpoint
	inUse   map[string]bool // PCI addresses of prepared VFs
	// taints: unhealthy VFs are published with TaintUnhealthy; once the
	// API server shows it drops taints, they are left out instead.
	taints bool
	helper *kubeletplugin.Helper
	// netSrv serves the CNI's network data socket (netdata.go).
	netSrv *http.Server
	// published is what the ResourceSlice controller was last given.
	published *resourceslice.DriverResources
	// healthChanged is closed (and replaced) when what is published changes.
	healthChanged chan struct{}

	// kick wakes the publisher (buffered, one pending wake-up is enough).
	kick chan struct{}
	// publisherDone is closed when the publisher goroutine has ended.
	publisherDone chan struct{}
	// failpoint is called at Prepare's step boundaries (point); tests only.
	failpoint func(string)
}

var _ kubeletplugin.DRAPlugin = (*Driver)(nil)

// New checks the options and loads the checkpoint of prepared claims.
func New(opts Options) (*Driver, error) {
	switch {
	case opts.NodeName == "":
		return nil, errors.New("dra: node name not set (pass --node-name or set NODE_NAME from the downward API)")
	case opts.KubeClient == nil:
		return nil, errors.New("dra: no Kubernetes client")
	case opts.PluginDir == "" || opts.RegistryDir == "" || opts.CDIDir == "":
		return nil, errors.New("dra: plugin, registry and CDI directories must be set")
	}
	if opts.HostRoot == "" {
		opts.HostRoot = "/"
	}
	if opts.NodeRoot == "" {
		opts.NodeRoot = "/"
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	cpPath := filepath.Join(opts.PluginDir, CheckpointFile)
	cp, err := loadCheckpoint(cpPath)
	if err != nil {
		return nil, err
	}
	w, err := cdiwrite.New(opts.CDIDir, cdiStaging)
	if err != nil {
		return nil, err
	}
	// What a killed run's write left; nothing writes before Start.
	if err := errors.Join(w.RemoveStaging(), removeTemporaries(cpPath, cp)); err != nil {
		opts.Log.Warn("dra: leftovers of a killed run", "err", err)
	}
	return &Driver{
		opts: opts, log: opts.Log, cdi: w, cpPath: cpPath, meta: newMetaSpecs(opts.CDIDir, opts.PluginDir),
		byName: map[string]*entry{}, watched: map[string]bool{}, links: map[string]linkState{},
		cp: cp, inUse: cp.inUse(), taints: true, healthChanged: make(chan struct{}),
		kick: make(chan struct{}, 1),
	}, nil
}

// Start registers the plugin with the kubelet, publishes the VFs known so
// far and follows link events until ctx ends or Stop.
func (d *Driver) Start(ctx context.Context) error {
	ctx = klog.NewContext(ctx, logr.FromSlogHandler(d.log.Handler()))
	d.restoreFiles() // before the kubelet can call: after a reboot they are gone
	helper, err := kubeletplugin.Start(ctx, d,
		kubeletplugin.DriverName(DriverName),
		kubeletplugin.KubeClient(d.opts.KubeClient),
		kubeletplugin.NodeName(d.opts.NodeName),
		kubeletplugin.PluginDataDirectoryPath(d.opts.PluginDir),
		kubeletplugin.RegistrarDirectoryPath(d.opts.RegistryDir),
		// dra.sock and the registration socket 0600, not the umask's.
		kubeletplugin.PluginListener(listenUnix),
		kubeletplugin.RegistrarListener(listenUnix),
		// The helper writes each prepared request's metadata file
		// under PluginDir and the CDI spec that mounts it (metadata.go).
		kubeletplugin.EnableDeviceMetadata(true, metadataVersions),
		kubeletplugin.MetadataFileOps(d.meta.fileOps()), // its specs kept across a reboot
		kubeletplugin.CDIDirectory(d.opts.CDIDir),
	)
	if err != nil {
		return fmt.Errorf("dra: start kubelet plugin %s: %w (do %s and %s exist on the node and in the container?)", DriverName, err, d.opts.PluginDir, d.opts.RegistryDir)
	}
	d.mu.Lock()
	d.helper = helper
	d.publisherDone = make(chan struct{})
	d.mu.Unlock()
	go d.publisher(ctx, helper)
	d.republish("start")
	d.startNetData()
	if d.opts.Links != nil {
		events, err := d.opts.Links.Subscribe(ctx)
		if err != nil {
			d.log.Warn("dra: netlink unavailable; VF health follows rescans only", "err", err)
		} else {
			go d.watchLinks(ctx, events)
		}
	}
	d.log.Info("dra: kubelet plugin started", "driver", DriverName, "node", d.opts.NodeName,
		"pluginDir", d.opts.PluginDir, "cdiDir", d.opts.CDIDir, "preparedClaims", len(d.cp.Claims))
	return nil
}

// Stop unregisters from the kubelet and stops publishing. The
// ResourceSlices stay (a restarted plugin takes them over) and so do the
// prepared claims: their pods keep running.
func (d *Driver) Stop() {
	d.mu.Lock()
	h, done := d.helper, d.publisherDone
	d.helper = nil
	d.mu.Unlock()
	d.republish("stop") // wakes the publisher, which sees it is done
	d.stopNetData()
	h.Stop()
	if done != nil {
		<-done
	}
}

// Update takes a scan, serves its pools marked for DRA
// (pool.ServedByDRA) and republishes when they changed.
func (d *Driver) Update(scan plugin.Scan) {
	var served []pool.Pool
	for _, p := range scan.Pools {
		if !Serves(&p) {
			continue
		}
		if p.Kind != pool.Exclusive {
			d.log.Error("dra: pool skipped: DRA serves exclusive (resourceList) pools only", "resource", p.ResourceName())
			continue
		}
		served = append(served, p)
	}
	list := entries(served)
	seen := make(map[string]string, len(list))
	list = slices.DeleteFunc(list, func(e entry) bool {
		if prev, dup := seen[e.name]; dup {
			d.log.Error("dra: VF in two pools; served by the first", "device", e.dev.PCIAddress, "pools", []string{prev, e.res.ResourceName()})
			return true
		}
		seen[e.name] = e.res.ResourceName()
		return false
	})
	d.mu.Lock()
	defer d.mu.Unlock()
	d.entries, d.rdmaCM = list, scan.RDMACM
	clear(d.byName)
	clear(d.watched)
	for i := range d.entries {
		e := &d.entries[i]
		d.byName[e.name] = e
		for _, n := range []string{e.dev.Netdev, e.dev.PFNetdev} {
			if n != "" {
				d.watched[n] = true
			}
		}
	}
	d.republish("rescan")
}

// republish asks the publisher to bring the ResourceSlices up to date.
// It does not wait: the first publication waits for the API server (the
// ResourceSlice controller syncs its informer first), and nothing else of
// the daemon should.
func (d *Driver) republish(why string) {
	select {
	case d.kick <- struct{}{}:
		d.log.Debug("dra: republish", "cause", why)
	default: // one is pending already
	}
}

// publisher hands the current devices to the ResourceSlice controller when
// they differ from what it has, until ctx ends or the helper stops. It
// holds d.mu only to copy what it needs: building and comparing 1024
// devices must not hold up a Prepare.
func (d *Driver) publisher(ctx context.Context, helper *kubeletplugin.Helper) {
	defer close(d.publisherDone)
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
		}
		d.mu.Lock()
		if d.helper != helper {
			d.mu.Unlock()
			return // stopped
		}
		entries, view, taints, published := d.entries, d.healthViewLocked(), d.taints, d.published
		d.mu.Unlock()

		res := driverResources(d.opts.NodeName, entries, view.health, taints)
		if published != nil && samePublication(*published, res) {
			continue
		}
		unhealthy := 0
		for i := range entries {
			if !view.health(&entries[i]).ok {
				unhealthy++
			}
		}
		d.mu.Lock()
		d.published = &res
		close(d.healthChanged)
		d.healthChanged = make(chan struct{})
		d.mu.Unlock()
		if err := helper.PublishResources(ctx, res); err != nil {
			if ctx.Err() == nil {
				d.log.Error("dra: publish ResourceSlices", "err", err)
			}
			d.mu.Lock()
			d.published = nil // try again on the next change
			d.mu.Unlock()
			continue
		}
		d.log.Info("dra: ResourceSlices published", "devices", len(entries), "unhealthy", unhealthy, "taints", taints)
	}
}

// HandleError implements kubeletplugin.DRAPlugin. An API server that drops
// device taints (DRADeviceTaints off) makes the driver leave unhealthy VFs
// out of its slices instead; other publishing errors are logged (the
// controller retries); a server that Stop stopped before it began serving
// is not an error; anything else is fatal.
func (d *Driver) HandleError(_ context.Context, err error, msg string) {
	var dropped *resourceslice.DroppedFieldsError
	if errors.As(err, &dropped) && slices.Contains(dropped.DisabledFeatures(), "DRADeviceTaints") {
		d.mu.Lock()
		if d.taints {
			d.taints = false
			d.log.Warn("dra: the API server drops device taints (feature DRADeviceTaints off): unhealthy VFs are left out of the ResourceSlices instead")
			d.published = nil
			d.republish("taints unsupported")
		}
		d.mu.Unlock()
		return
	}
	if errors.Is(err, kubeletplugin.ErrRecoverable) {
		d.log.Error("dra: "+msg, "err", err)
		return
	}
	if errors.Is(err, grpc.ErrServerStopped) {
		// Only Stop stops the helper's servers; one stopped before its
		// goroutine reached Serve reports it so.
		d.log.Debug("dra: "+msg+" after the driver stopped it", "err", err)
		return
	}
	d.log.Error("dra: "+msg+"; stopping", "err", err)
	if d.opts.OnFatal != nil {
		d.opts.OnFatal(err)
	}
}

// Serves reports whether DRA serves p: the pools the device plugin must
// turn down (plugin.Options.Serves).
func Serves(p *pool.Pool) bool { return p.ServedBy == pool.ServedByDRA }
