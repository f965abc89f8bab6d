package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
	"github.com/fastpath-k8s/fastpath/internal/version"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

// Production defaults.
const (
	defaultConfig     = "/etc/fastpath/config.json"
	defaultKubeletDir = "/var/lib/kubelet/device-plugins"
	defaultDevInfoDir = "/var/run/k8s.cni.cncf.io/devinfo/dp"
	// Outside 9100-9999, the range the Prometheus exporters' default port
	// list has handed out in full (9108 is graphite_exporter's), and away
	// from the Kubernetes components' 10248-10260. Loopback by default:
	// under hostNetwork any other address is the node's, reachable from
	// wherever the node is, without auth. The DaemonSet names the node's
	// own address (status.hostIP), where the kubelet's probes go.
	defaultMetrics = "127.0.0.1:8478"
	defaultCDIDir  = "/var/run/cdi"
)

type serveFlags struct {
	config, resourcePrefix, hostRoot, nodeRoot, kubeletDir, podResources, devInfoDir, cdiDir, metricsAddr, logLevel string
	useCDI, version                                                                                                 bool
	dra                                                                                                             draFlags
	provision                                                                                                       provisionFlags
}

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	f, err := parseServeFlags(args, stderr)
	if err != nil || f == nil {
		return err
	}
	if f.version {
		_, err := fmt.Fprintf(stdout, "rdma-device-plugin %s, %s\n", version.Get(), draBuild)
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return fmt.Errorf("--log-level %q: want debug, info, warn or error", f.logLevel)
	}
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	return serve(ctx, *f, log)
}

// serveUsage is the top-level help: every subcommand, then serve's flags.
func serveUsage() string {
	var b strings.Builder
	b.WriteString("usage: rdma-device-plugin [SUBCOMMAND] [flags]\n\n")
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	for _, c := range subcommands {
		fmt.Fprintf(tw, "  %s\t%s\n", c.name, c.summary)
	}
	tw.Flush()
	b.WriteString("\nrdma-device-plugin SUBCOMMAND --help shows a subcommand's flags. Without one,\n" +
		"rdma-device-plugin serves; its flags:\n\n")
	return b.String()
}

// parseServeFlags parses the serve flags; nil flags and no error mean
// help was printed.
func parseServeFlags(args []string, stderr io.Writer) (*serveFlags, error) {
	fs := newFlagSet("rdma-device-plugin", serveUsage(), stderr)
	var f serveFlags
	fs.StringVar(&f.config, "config", defaultConfig, "pool config file (configList and/or resourceList JSON)")
	fs.StringVar(&f.config, "config-file", defaultConfig, "the same as --config (the name the peer plugins use)")
	fs.StringVar(&f.resourcePrefix, "resource-prefix", pool.DefaultExclusivePrefix, "resource prefix of resourceList pools that give none (configList pools: "+pool.DefaultSharedPrefix+")")
	fs.StringVar(&f.hostRoot, "host-root", "/", "where the plugin reads the node's sysfs (DIR/sys) and devices (DIR/dev), e.g. /host with the node's / mounted there")
	fs.StringVar(&f.nodeRoot, "node-root", "/", "what --host-root is on the node: device paths handed to the kubelet and written to CDI specs are under it")
	fs.StringVar(&f.kubeletDir, "kubelet-dir", defaultKubeletDir, "the kubelet's device plugin directory (holds kubelet.sock)")
	fs.StringVar(&f.podResources, "pod-resources-socket", plugin.DefaultPodResourcesSocket, "the kubelet's PodResources API, asked which VFs live pods hold; empty: go by the Allocate calls seen")
	fs.StringVar(&f.devInfoDir, "devinfo-dir", defaultDevInfoDir, "where device-info-spec files for the CNI go; empty disables them")
	fs.BoolVar(&f.useCDI, "use-cdi", false, "write CDI specs (to --cdi-spec-dir) and return CDI device names from Allocate")
	fs.StringVar(&f.cdiDir, "cdi-spec-dir", "", "directory for the CDI specs (default "+defaultCDIDir+" with --use-cdi); setting it turns CDI on")
	fs.StringVar(&f.metricsAddr, "metrics-addr", defaultMetrics, "address for /healthz, /readyz and /metrics; empty disables them")
	fs.StringVar(&f.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&f.version, "version", false, "print the version and exit")
	registerDRAFlags(fs, &f.dra)
	registerProvisionFlags(fs, &f.provision)
	fs.DurationVar(&f.provision.Retry, "provision-retry", provisioner.DefaultRetry, "with --policy: how often a PF that could not be changed (VFs in use, a failed write) is tried again")
	if help, err := parseFlags(fs, args); help || err != nil {
		if errors.Is(err, errStrayArgument) {
			return nil, fmt.Errorf("%w (subcommands: discover, doctor, provision)", err)
		}
		return nil, err
	}
	if f.useCDI && f.cdiDir == "" {
		f.cdiDir = defaultCDIDir
	}
	f.dra = f.dra.withNode(f.provision.node.name)
	return &f, nil
}

func serve(ctx context.Context, f serveFlags, log *slog.Logger) error {
	// No collection until the pools are registered (startgc.go).
	collect := deferCollection()
	defer collect()
	// The metrics listener is opened beside the first scan: a process's
	// first listen reads /proc/sys/net/core/somaxconn, which some kernels
	// take milliseconds to open, and the plugin's own sockets wait for it.
	metricsListener := listenAsync(f.metricsAddr)
	defer metricsListener.close()
	// One set of options for the watch and the manager, so that both
	// look at the same kubelet directory, config and host.
	opts := plugin.Options{
		KubeletDir: f.kubeletDir, HostRoot: f.hostRoot, NodeRoot: f.nodeRoot, DevInfoDir: f.devInfoDir, CDIDir: f.cdiDir,
		ConfigPath: f.config, Log: log,
	}
	// The watch comes before the config is read and the node scanned, so
	// that what changes while the plugin starts is answered once it runs.
	watch, err := plugin.NewWatch(opts)
	if err != nil {
		return err
	}
	defer watch.Close() // Run closes it too; this is for a start that fails first
	build := version.Get()
	metrics := plugin.NewMetrics(build)
	// VFs do not survive a reboot: the policies' VFs are created before
	// the first scan, so that the pools have them when registered.
	var policyPools []pool.Resource
	var provisioned *nic.Snapshot
	if f.provision.Policy != "" {
		if policyPools, provisioned, err = f.provision.newProvisioner(f.hostRoot, f.podResources, draPrepared(f.dra), log, podEnv()).Start(ctx, f.resourcePrefix, metrics); err != nil {
			return err
		}
	}
	src, err := plugin.NewSourceWith(f.config, policyPools, nic.NewScanner(f.hostRoot), log, pool.WithResourcePrefix(f.resourcePrefix))
	if err != nil {
		return err
	}
	// A provisioning that wrote nothing scanned the node as it is: the
	// first scan is that one, not a second (re-applying at start then
	// only adds the plan's few reads).
	src.UseSnapshot(provisioned)
	// The plugin runs in the node's network namespace (hostNetwork).
	src.DefaultRoutes = func() ([]string, error) { return plugin.DefaultRouteNetdevs(nil) }
	src.Metrics = metrics
	// The first scan is made here, before anything is served, so that a
	// host the plugin cannot serve is a startup error; the manager takes
	// it as its first state (a scan of a large host is the costliest thing
	// the daemon does: it is not made twice).
	first, err := src.Scan(false)
	if err != nil {
		return err
	}
	if err := checkCharDevices(f.hostRoot, first.Pools); err != nil {
		return err
	}
	// Pools the config serves through DRA go to the DRA driver, from the
	// same scans; the device plugin turns them down (Serves).
	ctx, scan, draHook, err := startDRA(ctx, f.dra, f.hostRoot, f.nodeRoot, f.devInfoDir, first, src.Scan, log)
	if err != nil {
		return err
	}
	defer draHook.stop() // also when something below fails to start
	var held plugin.PodDevices
	if f.podResources != "" {
		held = plugin.KubeletPodResources{Socket: f.podResources}
	}
	opts.Watch = watch
	opts.Scan = scan
	opts.Metrics = metrics
	opts.PodResources = held
	opts.ReleaseMemory = func() {
		collect()
		debug.FreeOSMemory()
	}
	opts.Serves = servedByDevicePlugin
	opts.Links = &plugin.NetlinkLinks{OnError: func(err error) {
		log.Warn("netlink link subscription failed; health follows periodic rescans only", "err", err)
	}}
	m, err := plugin.NewManager(opts)
	if err != nil {
		return err
	}
	if f.metricsAddr != "" {
		l, err := metricsListener.get()
		if err != nil {
			return fmt.Errorf("--metrics-addr %s: %w (pick a free port, or empty to disable)", f.metricsAddr, err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler())
		mux.Handle("/healthz", probe(log, "/healthz", m.Healthy))
		mux.Handle("/readyz", probe(log, "/readyz", m.Ready))
		hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() {
			if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server stopped", "addr", f.metricsAddr, "err", err)
			}
		}()
		defer hs.Close()
		log.Info("serving /healthz and /metrics", "addr", l.Addr().String(), "readiness", "/readyz")
	}
	log.Info("starting", "version", build.Version, "revision", build.Revision, "goVersion", build.GoVersion, "config", f.config, "hostRoot", f.hostRoot, "nodeRoot", f.nodeRoot, "kubeletDir", f.kubeletDir, "resources", resourceNames(first.Pools))
	err = m.Run(ctx, first)
	err = errors.Join(err, draHook.stop())
	log.Info("stopped")
	return err
}

// checkCharDevices fails when the pools have RDMA devices but the node
// shows none of their uverbs char devices: every Allocate would hand out
// a device NCCL cannot open.
func checkCharDevices(hostRoot string, pools []pool.Pool) error {
	want := 0
	for _, p := range pools {
		for _, d := range p.Devices {
			if d.RDMADevice == "" {
				continue
			}
			want++
			if d.HasUverbs() {
				return nil
			}
		}
	}
	if want == 0 {
		return nil // no RDMA devices in any pool: nothing to hand out, and discovery warned why
	}
	return fmt.Errorf("no RDMA char devices for the pools' %d RDMA devices under %s%s: is the ib_uverbs module loaded, and is /dev/infiniband mounted into the plugin's container?",
		want, strings.TrimSuffix(hostRoot, "/"), rdma.DevDir)
}

// resourceNames are the pools' full resource names, as the kubelet and the
// pods' resource requests spell them.
func resourceNames(pools []pool.Pool) []string {
	out := make([]string, len(pools))
	for i := range pools {
		out[i] = pools[i].ResourceName()
	}
	return out
}

// probe answers a probe at path with check's result: 200 "ok", or 503
// "not ok: CODE" with a short reason code (plugin.ProbeReason). The error's
// text, which names paths and devices, goes to the log only: the port is
// the node's and needs no auth.
func probe(log *slog.Logger, path string, check func() error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if err := check(); err != nil {
			code := plugin.ProbeReason(err)
			log.Warn("probe failed", "path", path, "reason", code, "err", err)
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, "not ok: "+code+"\n")
			return
		}
		_, _ = io.WriteString(w, "ok\n")
	})
}

// asyncListener is a TCP listener being opened in the background.
type asyncListener struct {
	done chan struct{}
	l    net.Listener
	err  error
}

// listenAsync starts listening on addr; "" listens nowhere.
func listenAsync(addr string) *asyncListener {
	a := &asyncListener{done: make(chan struct{})}
	if addr == "" {
		close(a.done)
		return a
	}
	go func() {
		defer close(a.done)
		a.l, a.err = net.Listen("tcp", addr)
	}()
	return a
}

// get waits for the listener; the caller owns it then.
func (a *asyncListener) get() (net.Listener, error) {
	<-a.done
	l := a.l
	a.l = nil
	return l, a.err
}

// close closes a listener nobody took (serve returned early).
func (a *asyncListener) close() {
	<-a.done
	if a.l != nil {
		a.l.Close()
	}
}
