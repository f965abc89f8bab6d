package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// The daemon's packages; the binaries the tests and benchmarks run are
// built as the Dockerfile builds them (testbin.Flags.Release), once per
// test binary.
const (
	daemonPkg   = "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin"
	regfloorPkg = "github.com/fastpath-k8s/fastpath/test/regfloor"
)

// binary is the lean daemon (-tags nodra,grpcnotrace): what the default
// DaemonSet runs, and what the tests and benchmarks of the device plugin
// run. grpcnotrace is make's BUILDTAGS: gRPC without golang.org/x/net/trace.
//
// FASTPATH_BENCH_DAEMON, when set, is a daemon built elsewhere that the
// benchmarks run instead: an A/B comparison runs one test binary with
// each build in turn (docs/benchmarks.md, "A against B").
func binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("FASTPATH_BENCH_DAEMON"); bin != "" {
		return bin
	}
	return filepath.Join(testbin.BuildWith(t, testbin.Flags{Tags: "nodra,grpcnotrace", Release: true}, daemonPkg), "rdma-device-plugin")
}

// draBinary is rdma-device-plugin-dra: DRA linked in.
// FASTPATH_BENCH_DAEMON_DRA is its FASTPATH_BENCH_DAEMON.
func draBinary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("FASTPATH_BENCH_DAEMON_DRA"); bin != "" {
		return bin
	}
	skipDRABuildIfShort(t)
	return filepath.Join(testbin.BuildWith(t, testbin.Flags{Tags: "grpcnotrace", Release: true}, daemonPkg), "rdma-device-plugin")
}

// regfloorBinary is test/regfloor, BenchmarkDaemonStart's yardstick, built
// as the lean daemon is.
func regfloorBinary(t testing.TB) string {
	t.Helper()
	return filepath.Join(testbin.BuildWith(t, testbin.Flags{Tags: "nodra,grpcnotrace", Release: true}, regfloorPkg), "regfloor")
}

// regfloorDRABinary is test/regfloor built as rdma-device-plugin-dra is:
// the DRA kubelet plugin library linked in.
func regfloorDRABinary(t testing.TB) string {
	t.Helper()
	skipDRABuildIfShort(t)
	return filepath.Join(testbin.BuildWith(t, testbin.Flags{Tags: "grpcnotrace", Release: true}, regfloorPkg), "regfloor")
}

// skipDRABuildIfShort skips, under -short (make quick), a test that
// needs a DRA build: its release build compiles the Kubernetes API
// client and the DRA kubelet plugin library, most of this package's
// test time on a cold build cache (make test runs it).
func skipDRABuildIfShort(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: needs a release build with DRA (the Kubernetes API client), minutes on 2 cores; make test runs it")
	}
}

func TestMain(m *testing.M) {
	code := testnet.Main(m)
	testbin.Cleanup()
	benchHost.Remove()
	os.Exit(code)
}

func freePort(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	return addr
}

// daemon is the real binary serving a fixture host to a kubelet stub.
type daemon struct {
	t       testing.TB
	dir     string // kubelet dir
	devinfo string
	cdi     string
	metrics string
	netns   string // the daemon's network namespace (ip netns name); "" = the test's
	stub    *kubeletstub.Stub
	argv    []string // the command spawn runs
	cmd     *exec.Cmd
	log     *testbin.Output
	done    chan error
}

func startDaemon(t testing.TB, host, config string) *daemon {
	t.Helper()
	return startDaemonWith(t, daemonOpts{host: host, config: config})
}

type daemonOpts struct {
	host, config string
	args         []string // more flags
	// dropCaps runs it as the DaemonSet does: no capabilities at all (an
	// empty bounding set, so root gets none on exec) and no_new_privs.
	dropCaps bool
	// hostNetns runs it in the test's network namespace also as root
	// (no `ip netns exec` in front of it).
	hostNetns bool
	// dra runs the build with DRA linked in (rdma-device-plugin-dra).
	dra bool
}

func startDaemonWith(t testing.TB, o daemonOpts) *daemon {
	t.Helper()
	host, config := o.host, o.config
	bin := binary(t)
	if o.dra {
		bin = draBinary(t)
	}
	base := t.TempDir()
	d := &daemon{
		t: t, dir: filepath.Join(base, "kubelet"), devinfo: filepath.Join(base, "devinfo"), cdi: filepath.Join(base, "cdi"),
		metrics: freePort(t), log: &testbin.Output{}, done: make(chan error, 1),
	}
	d.startStub()
	args := []string{"--host-root", host, "--config", config, "--kubelet-dir", d.dir,
		"--devinfo-dir", d.devinfo, "--cdi-spec-dir", d.cdi, "--metrics-addr", d.metrics,
		// Not the machine's kubelet, if it has one.
		"--pod-resources-socket", filepath.Join(base, "pod-resources.sock")}
	args = append(args, o.args...)
	if os.Geteuid() == 0 && !o.hostNetns {
		// A network namespace of its own: the daemon's netlink link
		// subscription then sees only the links a test puts there, not
		// the VF stand-ins other packages' tests create and delete in
		// the host netns at the same time (go test runs packages in
		// parallel). Its unix sockets are reachable from anywhere;
		// /metrics is reached through a dialer in that netns.
		d.netns, _ = testnet.Netns(t, "fp-dp-")
		d.argv = []string{"ip", "netns", "exec", d.netns}
		if o.dropCaps {
			d.argv = append(d.argv, "setpriv", "--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all")
		}
	}
	d.argv = append(append(d.argv, bin), args...)
	d.spawnUntilCleanup()
	return d
}

// startStub serves the kubelet's Registration side in d.dir until the
// test ends.
func (d *daemon) startStub() {
	d.t.Helper()
	require.NoError(d.t, os.MkdirAll(d.dir, 0o755))
	d.stub = kubeletstub.New(d.dir)
	require.NoError(d.t, d.stub.Start())
	d.t.Cleanup(d.stub.Stop)
}

// spawnUntilCleanup spawns d's command and kills it, if it still runs,
// when the test ends; a failed test logs its output.
func (d *daemon) spawnUntilCleanup() {
	d.t.Helper()
	d.spawn()
	d.t.Cleanup(func() {
		if d.cmd.ProcessState == nil {
			_ = d.cmd.Process.Kill()
			<-d.done
		}
		if d.t.Failed() {
			d.t.Logf("daemon log:\n%s", d.log.String())
		}
	})
}

// spawn starts the daemon's command (again, after kill).
func (d *daemon) spawn() {
	d.t.Helper()
	d.cmd = exec.Command(d.argv[0], d.argv[1:]...)
	d.cmd.Stdout, d.cmd.Stderr = d.log, d.log
	d.done = make(chan error, 1)
	require.NoError(d.t, d.cmd.Start())
	go func() { d.done <- d.cmd.Wait() }()
}

// kill SIGKILLs the daemon and waits for it: nothing of its shutdown runs.
func (d *daemon) kill() {
	d.t.Helper()
	require.NoError(d.t, d.cmd.Process.Kill())
	<-d.done
}

// httpClient reaches the daemon's /healthz and /metrics, in its netns.
func (d *daemon) httpClient() *http.Client {
	if d.netns == "" {
		return http.DefaultClient
	}
	dial := func(_ context.Context, network, addr string) (net.Conn, error) {
		n, err := netns.Open("/var/run/netns/" + d.netns)
		if err != nil {
			return nil, err
		}
		defer n.Close()
		var c net.Conn
		err = n.Do(func() error {
			var err error
			c, err = net.Dial(network, addr) // the socket stays in the netns it was made in
			return err
		})
		return c, err
	}
	return &http.Client{Transport: &http.Transport{DialContext: dial}, Timeout: 10 * time.Second}
}

// get fetches a path of the daemon's metrics server: status and body.
func (d *daemon) get(path string) (int, string) {
	d.t.Helper()
	res, err := d.httpClient().Get("http://" + d.metrics + path)
	require.NoError(d.t, err)
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	require.NoError(d.t, err)
	return res.StatusCode, string(b)
}

func (d *daemon) registrations(resources ...string) map[string]*pluginapi.RegisterRequest {
	d.t.Helper()
	got := map[string]*pluginapi.RegisterRequest{}
	for len(got) < len(resources) {
		r, err := d.stub.WaitRegistration(10 * time.Second)
		require.NoError(d.t, err, "log:\n%s", d.log.String())
		got[r.Request.ResourceName] = r.Request
	}
	for _, r := range resources {
		require.Contains(d.t, got, r)
	}
	return got
}

func (d *daemon) client(endpoint string) pluginapi.DevicePluginClient {
	d.t.Helper()
	c, conn, err := d.stub.Dial(endpoint)
	require.NoError(d.t, err)
	d.t.Cleanup(func() { conn.Close() })
	return c
}

func (d *daemon) stop() {
	d.t.Helper()
	require.NoError(d.t, d.cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-d.done:
		require.NoError(d.t, err, "exit after SIGTERM; log:\n%s", d.log.String())
	case <-time.After(10 * time.Second):
		d.t.Fatal("no exit within 10 s of SIGTERM")
	}
}

func health(r *pluginapi.ListAndWatchResponse) map[string]string {
	out := map[string]string{}
	for _, d := range r.Devices {
		out[d.ID] = d.Health
	}
	return out
}

func TestServeFixtureHost(t *testing.T) {
	// The plugin reads the fixture; what it hands the kubelet is under the
	// node root, never under --host-root.
	const nodeRoot = "/node"
	d := startDaemonWith(t, daemonOpts{host: fixture("dgx-h100"), config: config("combined.json"), args: []string{"--node-root", nodeRoot}})
	regs := d.registrations("mellanox.com/mlnx_sriov_rdma", "rdma/hca_shared_devices_a")
	r := regs["mellanox.com/mlnx_sriov_rdma"]
	require.Equal(t, pluginapi.Version, r.Version)
	require.Equal(t, "mellanox.com_mlnx_sriov_rdma.sock", r.Endpoint)
	require.True(t, r.Options.GetPreferredAllocationAvailable)
	require.Equal(t, "rdma_hca_shared_devices_a.sock", regs["rdma/hca_shared_devices_a"].Endpoint)

	c := d.client(r.Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	lw, err := stream.Recv()
	require.NoError(t, err)
	require.Len(t, lw.Devices, 32)
	for _, dev := range lw.Devices {
		require.Equal(t, pluginapi.Healthy, dev.Health, dev.ID)
		require.Len(t, dev.Topology.Nodes, 1, dev.ID)
	}

	// A rail-optimised 8-GPU pod: spread puts one VF on each of the 8 rails.
	var avail []string
	for _, dev := range lw.Devices {
		avail = append(avail, dev.ID)
	}
	pref, err := c.GetPreferredAllocation(ctx, &pluginapi.PreferredAllocationRequest{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{
		{AvailableDeviceIDs: avail, AllocationSize: 8},
	}})
	require.NoError(t, err)
	pfs := map[string]bool{}
	for _, id := range pref.ContainerResponses[0].DeviceIDs {
		pfs[id[:len(id)-1]] = true
	}
	require.Len(t, pfs, 8, "one VF per rail: %v", pref.ContainerResponses[0].DeviceIDs)

	// Ready: registered, and the CDI specs (written right after) are there.
	require.Eventually(t, func() bool { code, _ := d.get("/readyz"); return code == http.StatusOK }, 10*time.Second, 10*time.Millisecond)
	resp, err := c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:18:00.1"}}}})
	require.NoError(t, err)
	cr := resp.ContainerResponses[0]
	require.Equal(t, "0000:18:00.1", cr.Envs["PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA"])
	require.Equal(t, "=mlx5_12:1", cr.Envs["NCCL_IB_HCA"])
	require.Equal(t, "mlx5_12:1", cr.Envs["UCX_NET_DEVICES"])
	var info map[string]map[string]any
	require.NoError(t, json.Unmarshal([]byte(cr.Envs["PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA_INFO"]), &info))
	require.Equal(t, "mlx5_12", info["0000:18:00.1"]["rdmaDevice"])
	require.Equal(t, "ibp24s0v0", info["0000:18:00.1"]["netdev"])
	require.Equal(t, "0000:18:00.0", info["0000:18:00.1"]["pfPciAddress"])
	var paths []string
	for _, s := range cr.Devices {
		require.Equal(t, nodeRoot+s.ContainerPath, s.HostPath)
		require.Equal(t, "rw", s.Permissions)
		paths = append(paths, s.ContainerPath)
	}
	require.Equal(t, []string{"/dev/infiniband/uverbs14", "/dev/infiniband/umad12", "/dev/infiniband/issm12", "/dev/infiniband/rdma_cm"}, paths)
	require.Equal(t, []*pluginapi.CDIDevice{{Name: "mellanox.com/mlnx_sriov_rdma=0000:18:00.1"}}, cr.CdiDevices)

	infoFile := filepath.Join(d.devinfo, "mellanox.com-mlnx_sriov_rdma-0000:18:00.1-device.json")
	st, err := os.Stat(infoFile)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o444), st.Mode().Perm())
	cdiSpecs, err := filepath.Glob(filepath.Join(d.cdi, "*"))
	require.NoError(t, err)
	require.NotEmpty(t, cdiSpecs)

	_, err = c.Allocate(ctx, &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:99:00.1"}}}})
	require.ErrorContains(t, err, `unknown device ID "0000:99:00.1"`)

	get := func(path string) string {
		code, body := d.get(path)
		require.Equal(t, http.StatusOK, code, body)
		return body
	}
	require.Equal(t, "ok\n", get("/healthz"))
	require.Equal(t, "ok\n", get("/readyz"))
	m := get("/metrics")
	require.Contains(t, m, `fastpath_device_plugin_devices{resource="mellanox.com/mlnx_sriov_rdma"} 32`)
	require.Contains(t, m, `fastpath_device_plugin_allocated_devices_total{resource="mellanox.com/mlnx_sriov_rdma"} 1`)
	require.Regexp(t, `fastpath_build_info\{goversion="go[0-9.]+",revision="[^"]+",version="[^"]+"\} 1`, m)
	require.Regexp(t, `(?m)^process_resident_memory_bytes [0-9.e+]+$`, m, "client_golang's process collector")
	require.Regexp(t, `(?m)^go_goroutines [0-9]+$`, m, "client_golang's Go collector")
	require.Contains(t, d.log.String(), `"msg":"starting","version":`)
	require.Contains(t, d.log.String(), `"resources":["rdma/hca_shared_devices_a","mellanox.com/mlnx_sriov_rdma"]`, "the startup log names the full resource names")

	d.stop()
	left, err := filepath.Glob(filepath.Join(d.dir, "mellanox.com_*"))
	require.NoError(t, err)
	require.Empty(t, left, "sockets removed on SIGTERM")
	_, err = os.Stat(infoFile)
	require.ErrorIs(t, err, os.ErrNotExist, "device-info files removed on SIGTERM")
	// The CDI specs stay: a container restarted while no plugin runs
	// resolves the CDI names the kubelet kept from its Allocate.
	kept, _ := filepath.Glob(filepath.Join(d.cdi, "*"))
	require.Equal(t, cdiSpecs, kept, "CDI specs kept on SIGTERM")
	require.Contains(t, d.log.String(), `"msg":"registered with kubelet"`)
}

// TestServeLinkHealth sets a veth named as the fixture's rail-0 PF netdev
// down and up in the daemon's netns: the real netlink subscription must
// mark that PF's VFs Unhealthy, then Healthy — also when the daemon runs
// with no capability at all, as the DaemonSet runs it.
func TestServeLinkHealth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates a network namespace and a veth named as a fixture PF netdev")
	}
	for _, tc := range []struct {
		name     string
		dropCaps bool
	}{{"root", false}, {"no capabilities", true}} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.dropCaps {
				if _, err := exec.LookPath("setpriv"); err != nil {
					t.Skip("needs setpriv (util-linux) to drop every capability")
				}
			}
			testLinkHealth(t, tc.dropCaps)
		})
	}
}

func testLinkHealth(t *testing.T, dropCaps bool) {
	const pf, peer = "ibp24s0", "fpt-ibp24s0-p"
	d := startDaemonWith(t, daemonOpts{host: fixture("dgx-h100"), config: config("sriov-dp.json"), dropCaps: dropCaps})
	if dropCaps {
		// It really runs without capabilities.
		require.Eventually(t, func() bool {
			st, err := procStatusHex(d.cmd.Process.Pid, "CapEff", "CapPrm", "CapBnd")
			return err == nil && st["CapEff"] == 0 && st["CapPrm"] == 0 && st["CapBnd"] == 0
		}, 5*time.Second, 10*time.Millisecond, "the daemon still holds capabilities")
	}
	n, err := netns.Open("/var/run/netns/" + d.netns)
	require.NoError(t, err)
	defer n.Close()
	h := n.Handle()
	require.NoError(t, h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pf}, PeerName: peer}))
	veth, err := h.LinkByName(pf)
	require.NoError(t, err)
	peerLink, err := h.LinkByName(peer)
	require.NoError(t, err)
	require.NoError(t, h.LinkSetUp(peerLink))
	require.NoError(t, h.LinkSetUp(veth))

	regs := d.registrations("mellanox.com/mlnx_sriov_rdma")
	c := d.client(regs["mellanox.com/mlnx_sriov_rdma"].Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	rail0 := []string{"0000:18:00.1", "0000:18:00.2", "0000:18:00.3", "0000:18:00.4"}
	waitFor := func(want string) {
		t.Helper()
		for {
			r, err := stream.Recv()
			require.NoError(t, err, "waiting for rail 0 VFs %s", want)
			h := health(r)
			ok := true
			for _, id := range rail0 {
				ok = ok && h[id] == want
			}
			if ok {
				require.Equal(t, pluginapi.Healthy, h["0000:40:00.1"], "other rails are not affected")
				return
			}
		}
	}
	waitFor(pluginapi.Healthy)
	require.NoError(t, h.LinkSetDown(veth))
	waitFor(pluginapi.Unhealthy)
	require.NoError(t, h.LinkSetUp(veth))
	waitFor(pluginapi.Healthy)
	d.stop()
	require.NotContains(t, d.log.String(), "netlink", "no netlink warning: event-driven health is on")
	require.NotContains(t, d.log.String(), "the node's default routes", "the routes are read without a capability")
}

// procStatusHex reads hexadecimal fields (capability sets) of
// /proc/<pid>/status.
func procStatusHex(pid int, fields ...string) (map[string]uint64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || !slices.Contains(fields, k) {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			return nil, fmt.Errorf("/proc/%d/status: %s: %w", pid, k, err)
		}
		out[k] = n
	}
	if len(out) != len(fields) {
		return nil, fmt.Errorf("/proc/%d/status: want %v, found %v", pid, fields, out)
	}
	return out, nil
}

// After a driver reload the plugin's /dev may be stale: an empty
// directory where the host has its char devices. The VFs go Unhealthy and
// /healthz fails (the liveness probe restarts the plugin); readiness
// stays, the pools are registered.
func TestServeStaleDev(t *testing.T) {
	host := t.TempDir()
	require.NoError(t, fx.Write(host, "dgx-h100"))
	d := startDaemon(t, host, config("sriov-dp.json"))
	regs := d.registrations("mellanox.com/mlnx_sriov_rdma")
	require.Eventually(t, func() bool { code, _ := d.get("/healthz"); return code == http.StatusOK }, 10*time.Second, 20*time.Millisecond)
	c := d.client(regs["mellanox.com/mlnx_sriov_rdma"].Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	r, err := stream.Recv()
	require.NoError(t, err)
	require.Equal(t, pluginapi.Healthy, health(r)["0000:18:00.1"])

	ib := filepath.Join(host, "dev", "infiniband")
	require.NoError(t, os.Rename(ib, ib+".old"))
	require.NoError(t, os.Mkdir(ib, 0o755))
	for {
		r, err = stream.Recv()
		require.NoError(t, err)
		if health(r)["0000:18:00.1"] == pluginapi.Unhealthy {
			break
		}
	}
	for id, h := range health(r) {
		require.Equal(t, pluginapi.Unhealthy, h, id)
	}
	code, body := d.get("/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	// A reason code, never the error's text (paths, device names): the
	// port is the node's, without auth (issue 44, finding 7); the detail
	// is in the log.
	require.Equal(t, "not ok: dev-stale\n", body)
	require.NotContains(t, body, ib)
	code, _ = d.get("/readyz")
	require.Equal(t, http.StatusOK, code)
	d.stop()
}

func TestServeStartupErrors(t *testing.T) {
	noDev := t.TempDir()
	require.NoError(t, fx.Write(noDev, "dgx-h100"))
	require.NoError(t, os.RemoveAll(filepath.Join(noDev, "dev", "infiniband")))
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"missing config", []string{"--host-root", fixture("dgx-h100"), "--config", "/nonexistent/config.json"}, "pool config file does not exist: /nonexistent/config.json"},
		{"broken config", []string{"--host-root", fixture("dgx-h100"), "--config", "serve_test.go"}, "invalid JSON"},
		{"no char devices", []string{"--host-root", noDev, "--config", config("sriov-dp.json")}, "is the ib_uverbs module loaded"},
		{"bad log level", []string{"--log-level", "loud"}, `--log-level "loud"`},
		{"bad resource prefix", []string{"--host-root", fixture("dgx-h100"), "--config", config("sriov-dp.json"), "--resource-prefix", "Not_A_Domain"},
			`resource prefix "Not_A_Domain" is not a DNS subdomain`},
		{"stray argument", []string{"serve", "now"}, `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append(tt.args, "--kubelet-dir", t.TempDir(), "--metrics-addr", "")
			var errs bytes.Buffer
			err := run(context.Background(), args, io.Discard, &errs)
			require.Error(t, err)
			require.Contains(t, err.Error(), tt.want)
		})
	}
	// A metrics port in use.
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	err = run(context.Background(), []string{"--host-root", fixture("dgx-h100"), "--config", config("sriov-dp.json"),
		"--kubelet-dir", t.TempDir(), "--metrics-addr", busy.Addr().String()}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "--metrics-addr "+busy.Addr().String())
	require.ErrorContains(t, err, "pick a free port, or empty to disable")
	// The binary exits non-zero and says why.
	out, err := exec.Command(binary(t), "--config", "/nonexistent/config.json", "--kubelet-dir", t.TempDir(), "--metrics-addr", "").CombinedOutput()
	require.Error(t, err)
	require.True(t, strings.Contains(string(out), "pool config file does not exist"), string(out))
	// Its watch of the kubelet directory comes first, before the config
	// is read.
	out, err = exec.Command(binary(t), "--host-root", fixture("dgx-h100"), "--config", config("sriov-dp.json"),
		"--kubelet-dir", filepath.Join(t.TempDir(), "missing"), "--metrics-addr", "").CombinedOutput()
	require.Error(t, err)
	require.True(t, strings.Contains(string(out), "mount the kubelet's device-plugins directory or set --kubelet-dir"), string(out))
}

// The flags the peer plugins' manifests pass are accepted.
func TestServeFlags(t *testing.T) {
	want := func(mod func(f *serveFlags)) serveFlags {
		f := serveFlags{config: defaultConfig, resourcePrefix: "mellanox.com", hostRoot: "/", nodeRoot: "/", podResources: "/var/lib/kubelet/pod-resources/kubelet.sock", kubeletDir: defaultKubeletDir, devInfoDir: defaultDevInfoDir,
			metricsAddr: defaultMetrics, logLevel: "info", dra: defaultDRAFlags(),
			provision: provisionFlags{Config: provisioner.Config{StateDir: provision.DefaultStateDir, CNIStateDir: defaultCNIStateDir, Timeout: provision.DefaultTimeout, Retry: provisioner.DefaultRetry},
				node: nodeFlags{labels: os.Getenv("FASTPATH_NODE_LABELS"), name: os.Getenv("NODE_NAME")}}}
		if mod != nil {
			mod(&f)
		}
		return f
	}
	for _, tc := range []struct {
		name string
		args []string
		want serveFlags
	}{
		{"defaults", nil, want(nil)},
		{"config-file", []string{"--config-file=/etc/pcidp/config.json"}, want(func(f *serveFlags) { f.config = "/etc/pcidp/config.json" })},
		{"use-cdi", []string{"--use-cdi"}, want(func(f *serveFlags) { f.useCDI, f.cdiDir = true, "/var/run/cdi" })},
		{"cdi dir", []string{"-use-cdi", "-cdi-spec-dir", "/etc/cdi"}, want(func(f *serveFlags) { f.useCDI, f.cdiDir = true, "/etc/cdi" })},
		{"roots", []string{"--host-root=/host", "--node-root=/"}, want(func(f *serveFlags) { f.hostRoot = "/host" })},
		{"resource-prefix", []string{"--resource-prefix=nvidia.com"}, want(func(f *serveFlags) { f.resourcePrefix = "nvidia.com" })},
		{"policy", []string{"--policy=/etc/fastpath/policy.yaml", "--node-labels=a=b"}, want(func(f *serveFlags) {
			f.provision.Policy, f.provision.node.labels = "/etc/fastpath/policy.yaml", "a=b"
		})},
		// One --node-name, in both builds: the policies' node, and DRA's.
		{"node-name", []string{"--node-name=gpu-17"}, want(func(f *serveFlags) {
			f.provision.node.name, f.dra = "gpu-17", f.dra.withNode("gpu-17")
		})},
		{"provision-retry", []string{"--policy=p.yaml", "--provision-retry=2s"}, want(func(f *serveFlags) {
			f.provision.Policy, f.provision.Retry = "p.yaml", 2*time.Second
		})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f, err := parseServeFlags(tc.args, io.Discard)
			require.NoError(t, err)
			require.Equal(t, tc.want, *f)
		})
	}
}

func TestVersionFlag(t *testing.T) {
	var out bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"--version"}, &out, io.Discard))
	require.Regexp(t, `^rdma-device-plugin \S+ \(revision \S+, go[0-9.]+\), `+draBuild+`\n$`, out.String())
	// The binary reports what the build stamped.
	bin := filepath.Join(t.TempDir(), "rdma-device-plugin")
	pkg := "github.com/fastpath-k8s/fastpath/internal/version"
	build := exec.Command("go", "build", "-buildvcs=false", "-o", bin,
		"-ldflags", "-X "+pkg+".Version=v9.9.9-test -X "+pkg+".Revision=0123abc", ".")
	b, err := build.CombinedOutput()
	require.NoError(t, err, "%s", b)
	got, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	require.Regexp(t, `^rdma-device-plugin v9\.9\.9-test \(revision 0123abc, go[0-9.]+\), `+draBuild+`\n$`, string(got))
}
