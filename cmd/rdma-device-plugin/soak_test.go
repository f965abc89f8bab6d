package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

// soakPools are what combined.json serves on the DGX fixture.
var soakPools = []string{"rdma/hca_shared_devices_a", "mellanox.com/mlnx_sriov_rdma"}

// TestSoakDevicePlugin drives the real binary as a busy node does, with
// faults: clients hammer Allocate and GetPreferredAllocation with valid and
// malformed requests while the kubelet restarts (the stub wipes the
// directory and serves a new kubelet.sock) and, every fifth cycle, the
// plugin is SIGKILLed and started again — every other time killed once
// more a few milliseconds after it registered, in the middle of what a
// start does then (CDI specs, the sweep of the last run's files). After
// every cycle both pools must be registered again (within a second of a
// kubelet restart), the plugin alive, its fds and RSS bounded; after every
// kill, once the new plugin is ready, no file the killed one left (the
// temporary files of writes it was killed in) may remain; every answer is
// either right or the error the request deserves; at the end a SIGTERM
// leaves nothing behind.
func TestSoakDevicePlugin(t *testing.T) {
	budget := testnet.Soak(t, 6*time.Second, 10*time.Minute)
	const maxCycles = 20000
	d := startDaemon(t, fixture("dgx-h100"), config("combined.json"))
	regs := d.registrations(soakPools...)
	excl, shared := regs[soakPools[1]].Endpoint, regs[soakPools[0]].Endpoint

	var vfs []string
	for k := range 4 {
		vfs = append(vfs, fx.DGXRailVFs(k)...)
	}
	l := &soakLoad{t: t, d: d, excl: excl, shared: shared, vfs: vfs, slots: listIDs(t, d, shared)}
	require.Len(t, l.slots, 63)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { l.run(ctx, uint64(i)) })
	}

	deadline := time.Now().Add(budget)
	cycles, kills, swept, maxFDs := 0, 0, 0, 0
	var maxRSS float64
	for cycles < maxCycles && time.Now().Before(deadline) && !t.Failed() {
		cycles++
		drain(d)
		wait := time.Second
		var left []string // what the killed plugins left
		if cycles%5 == 0 {
			d.kill()
			kills++
			left = append(left, d.temporaries()...)
			// What the killed plugin registered after the drain above
			// must not pass for the next one's registration.
			drain(d)
			d.spawn()
			wait = 10 * time.Second // a start scans the host first
			if cycles%10 == 0 {
				require.NoError(t, registeredAgain(d, wait), "cycle %d (kills %d)", cycles, kills)
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
				d.kill()
				kills++
				left = append(left, d.temporaries()...)
				drain(d)
				d.spawn()
			}
		} else {
			require.NoError(t, d.stub.Restart())
		}
		start := time.Now()
		require.NoError(t, registeredAgain(d, wait), "cycle %d (kills %d)", cycles, kills)
		require.Less(t, time.Since(start), wait)
		if left != nil || cycles%5 == 0 {
			d.waitReady(wait)
			for _, f := range left {
				if _, err := os.Lstat(f); !errors.Is(err, fs.ErrNotExist) {
					t.Errorf("cycle %d: %s, left by a killed plugin, is still there once the next is ready (%v)", cycles, f, err)
				}
			}
			swept += len(left)
		}
		require.NoError(t, syscall.Kill(d.cmd.Process.Pid, 0), "cycle %d: the plugin died; log:\n%s", cycles, d.log.String())
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", d.cmd.Process.Pid))
		require.NoError(t, err)
		maxFDs = max(maxFDs, len(fds))
		require.Less(t, len(fds), 100, "cycle %d: fds leak", cycles)
		st, err := procStatus(d.cmd.Process.Pid, "VmRSS")
		require.NoError(t, err)
		maxRSS = max(maxRSS, st["VmRSS"]/1024)
		require.Less(t, st["VmRSS"]/1024, 100.0, "cycle %d: RSS (MiB) grows", cycles)
		time.Sleep(time.Duration(10+rand.IntN(40)) * time.Millisecond) // load runs
	}
	cancel()
	wg.Wait()

	d.stop()
	leaks := leftovers(t, d)
	panics := strings.Count(d.log.String(), "panic:")
	require.Empty(t, leaks)
	require.Zero(t, panics, "log:\n%s", d.log.String())
	require.Positive(t, l.allocs.Load(), "the load ran")
	testnet.SoakReport(t, "device-plugin", "cycles", cycles, "kubelet-restarts", cycles-cycles/5, "kills", kills,
		"allocations-ok", l.allocs.Load(), "malformed-answered", l.malformed.Load(), "unavailable", l.unavailable.Load(),
		"temporaries-swept", swept, "max-fds", maxFDs, "max-rss-MiB", fmt.Sprintf("%.1f", maxRSS), "leaks", len(leaks), "panics", panics)
}

// temporaries are the files a write in flight has: atomicfile's
// .<file>.tmp-* in the device-info directory, anything in the CDI
// staging directory.
func (d *daemon) temporaries() []string {
	d.t.Helper()
	var out []string
	ents, err := os.ReadDir(d.devinfo)
	if !errors.Is(err, fs.ErrNotExist) {
		require.NoError(d.t, err)
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") && strings.Contains(e.Name(), ".tmp-") {
			out = append(out, filepath.Join(d.devinfo, e.Name()))
		}
	}
	staging := filepath.Join(d.cdi, ".fastpath-staging")
	ents, err = os.ReadDir(staging)
	if !errors.Is(err, fs.ErrNotExist) {
		require.NoError(d.t, err)
	}
	for _, e := range ents {
		out = append(out, filepath.Join(staging, e.Name()))
	}
	return out
}

// waitReady waits for /readyz to answer 200: every pool registered and
// what a start does after registration done. Until the new process
// listens, the port refuses connections.
func (d *daemon) waitReady(timeout time.Duration) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		res, err := d.httpClient().Get("http://" + d.metrics + "/readyz")
		if err == nil {
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
			last = fmt.Sprintf("%d %s", res.StatusCode, b)
		} else {
			last = err.Error()
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("not ready within %v: %s", timeout, last)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// listIDs are the device IDs a pool's first ListAndWatch lists.
func listIDs(t *testing.T, d *daemon, endpoint string) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := d.client(endpoint).ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	r, err := stream.Recv()
	require.NoError(t, err)
	var ids []string
	for _, dev := range r.Devices {
		ids = append(ids, dev.ID)
	}
	return ids
}

// drain empties the stub's registration queue.
func drain(d *daemon) {
	for {
		select {
		case <-d.stub.Registrations:
		default:
			return
		}
	}
}

// registeredAgain waits for both pools to register with the current
// kubelet.
func registeredAgain(d *daemon, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	todo := map[string]bool{soakPools[0]: true, soakPools[1]: true}
	for len(todo) > 0 {
		r, err := d.stub.WaitRegistration(time.Until(deadline))
		if err != nil {
			return fmt.Errorf("waiting for %v: %w", todo, err)
		}
		if r.Generation == d.stub.Generation() {
			delete(todo, r.Request.ResourceName)
		}
	}
	return nil
}

// leftovers are the files a stopped plugin left: anything but kubelet.sock
// in the kubelet directory, anything in the device-info directory, and
// anything in the CDI directory but the specs of the pools it serves,
// which stay for containers restarted while no plugin runs.
func leftovers(t *testing.T, d *daemon) []string {
	var out []string
	kept := map[string]bool{}
	for _, r := range soakPools {
		prefix, name, _ := strings.Cut(r, "/")
		kept[filepath.Base(plugin.CDISpecPath(d.cdi, prefix, name))] = true
	}
	for _, dir := range []string{d.dir, d.devinfo, d.cdi} {
		ents, err := os.ReadDir(dir)
		if os.IsNotExist(err) {
			continue
		}
		require.NoError(t, err)
		for _, e := range ents {
			if (dir == d.dir && e.Name() == "kubelet.sock") || (dir == d.cdi && kept[e.Name()] && e.Type().IsRegular()) {
				continue
			}
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out
}

// soakLoad is the kubelet's side under load, plus garbage. Its counters
// are answers, not attempts: allocs the Allocates answered OK, malformed
// the bad requests answered with the error they deserve, unavailable the
// calls that met a plugin (or a socket) being restarted.
type soakLoad struct {
	t                              *testing.T
	d                              *daemon
	excl, shared                   string
	vfs, slots                     []string
	allocs, malformed, unavailable atomic.Int64
}

// soakConn is the load's connection to one pool's socket. A call that
// finds the plugin gone drops it, and the next call dials again, as the
// kubelet dials a plugin anew after each registration (grpc's own
// reconnect backs off for up to two minutes, far longer than a restart).
type soakConn struct {
	l        *soakLoad
	endpoint string
	client   pluginapi.DevicePluginClient
	conn     io.Closer
}

func (c *soakConn) get() (pluginapi.DevicePluginClient, error) {
	if c.client == nil {
		client, conn, err := c.l.d.stub.Dial(c.endpoint)
		if err != nil {
			return nil, err
		}
		c.client, c.conn = client, conn
	}
	return c.client, nil
}

func (c *soakConn) drop() {
	if c.conn != nil {
		_ = c.conn.Close()
	}
	c.client, c.conn = nil, nil
}

func (l *soakLoad) run(ctx context.Context, seed uint64) {
	rnd := rand.New(rand.NewPCG(seed, 42))
	exclConn, sharedConn := &soakConn{l: l, endpoint: l.excl}, &soakConn{l: l, endpoint: l.shared}
	defer exclConn.drop()
	defer sharedConn.drop()
	huge := strings.Repeat("x", 1<<20)
	many := make([]string, 100000)
	for i := range many {
		many[i] = l.vfs[i%len(l.vfs)]
	}
	container := func(ids ...string) *pluginapi.ContainerAllocateRequest {
		return &pluginapi.ContainerAllocateRequest{DevicesIds: ids}
	}
	for ctx.Err() == nil {
		excl, err := exclConn.get()
		if err != nil {
			l.t.Error(err)
			return
		}
		shared, err := sharedConn.get()
		if err != nil {
			l.t.Error(err)
			return
		}
		callCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		a, b := l.vfs[rnd.IntN(len(l.vfs))], l.vfs[rnd.IntN(len(l.vfs))]
		want, answered, used := codes.OK, &l.allocs, exclConn
		switch op := rnd.IntN(10); op {
		case 0, 1, 2, 3:
			_, err = excl.Allocate(callCtx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{container(a)}})
		case 4:
			_, err = shared.Allocate(callCtx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
				container(l.slots[rnd.IntN(len(l.slots))])}})
			used = sharedConn
		case 5:
			var resp *pluginapi.PreferredAllocationResponse
			resp, err = excl.GetPreferredAllocation(callCtx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
				{AvailableDeviceIDs: many, AllocationSize: math.MaxInt32}}})
			if err == nil && len(resp.ContainerResponses[0].DeviceIDs) != len(l.vfs) {
				l.t.Errorf("GetPreferredAllocation of everything: %d devices, want %d", len(resp.ContainerResponses[0].DeviceIDs), len(l.vfs))
			}
			answered = &l.malformed
		default:
			want, answered = codes.InvalidArgument, &l.malformed
			var req *pluginapi.AllocateRequest
			switch op {
			case 6:
				req = &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{container(huge)}}
			case 7:
				req = &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{container(a), container(a)}}
			case 8:
				req = &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{container(many[:200]...)}}
			default:
				_, err = excl.GetPreferredAllocation(callCtx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
					{AvailableDeviceIDs: []string{a, b}, AllocationSize: -1 - rnd.Int32N(math.MaxInt32)}}})
			}
			if req != nil {
				_, err = excl.Allocate(callCtx, req)
			}
		}
		cancel()
		switch c := status.Code(err); {
		case c == want:
			answered.Add(1)
		case c == codes.Unavailable, c == codes.Canceled && ctx.Err() != nil, c == codes.DeadlineExceeded && ctx.Err() != nil:
			// The kubelet (or the plugin) is restarting: the kubelet
			// retries too, on a new connection once the plugin has
			// registered again.
			l.unavailable.Add(1)
			used.drop()
			time.Sleep(5 * time.Millisecond)
		default:
			l.t.Errorf("got %v, want %v", err, want)
		}
	}
}
