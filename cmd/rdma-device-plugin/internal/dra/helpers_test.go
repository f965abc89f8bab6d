package dra_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/links/linkstest"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

var testdata = filepath.Join("..", "..", "..", "..", "testdata")

// fixtureRoot is a committed fixture host.
func fixtureRoot(name string) string { return filepath.Join(testdata, "sysfs", name) }

// scanWith scans a host root and builds the pools of a seed config, as
// the daemon's source does.
func scanWith(t testing.TB, root, config string) plugin.Scan {
	t.Helper()
	cfg, err := pool.Load(filepath.Join(testdata, "config", config))
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	built, _ := pool.Build(cfg, snap.Devices)
	return plugin.Scan{Pools: built, RDMACM: snap.RDMACM}
}

// draPools are the pools of a scan that DRA serves.
func draPools(t testing.TB, root, config string) []pool.Pool {
	t.Helper()
	var out []pool.Pool
	for _, p := range scanWith(t, root, config).Pools {
		if dra.Serves(&p) {
			out = append(out, p)
		}
	}
	require.NotEmpty(t, out, "%s serves nothing through DRA", config)
	return out
}

// testEnv is a node for the driver: a fixture host, the kubelet's
// directories, a fake API server with the Node, and link events by hand.
type testEnv struct {
	root                                string
	pluginDir, registryDir, cdiDir, dev string
	client                              *fake.Clientset
	links                               *linkstest.Chan
	scan                                plugin.Scan
}

const testNode = "node-a"

func newTestEnv(t testing.TB, root, config string) *testEnv {
	t.Helper()
	base := t.TempDir()
	e := &testEnv{
		root: root, pluginDir: filepath.Join(base, "plugin"), registryDir: filepath.Join(base, "registry"),
		cdiDir: filepath.Join(base, "cdi"), dev: filepath.Join(base, "devinfo"),
		client: fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-a-uid"}}),
		links:  linkstest.NewChan(),
		scan:   scanWith(t, root, config),
	}
	for _, d := range []string{e.pluginDir, e.registryDir} {
		require.NoError(t, os.MkdirAll(d, 0o750))
	}
	e.apiServerWrites()
	return e
}

// simpleAPI replaces the fake API server by client-go's simple one, which
// stores objects as given, without the field management (managedFields,
// a REST mapper built per call) that the default fake spends most of a
// ResourceSlice update on: benchmarks then time the driver and the
// ResourceSlice controller, not the fake. Call it before start.
func (e *testEnv) simpleAPI() {
	e.client = fake.NewSimpleClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: testNode, UID: "node-a-uid"}})
	e.apiServerWrites()
}

// apiServerWrites makes the fake API server fill in on a write what the
// real one does: the name of an object created with generateName (the
// ResourceSlice controller creates its slices so) and a resourceVersion
// that grows with every create and update. The fake keeps versions to
// itself; without them in the objects the controller's mutation cache
// cannot tell its own last update from an older copy its informer still
// holds, takes the older one, and skips a publish that matches it — the
// change then reaches the fake only after the controller's 30 s resync.
func (e *testEnv) apiServerWrites() {
	var seq, version atomic.Int64
	e.client.PrependReactor("create", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(k8stesting.CreateAction).GetObject().(metav1.Object); ok {
			if o.GetName() == "" && o.GetGenerateName() != "" {
				o.SetName(fmt.Sprintf("%s%05d", o.GetGenerateName(), seq.Add(1)))
			}
			o.SetResourceVersion(strconv.FormatInt(version.Add(1), 10))
		}
		return false, nil, nil
	})
	e.client.PrependReactor("update", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if o, ok := a.(k8stesting.UpdateAction).GetObject().(metav1.Object); ok {
			o.SetResourceVersion(strconv.FormatInt(version.Add(1), 10))
		}
		return false, nil, nil
	})
}

// start runs a driver on the env's directories until the test ends.
func (e *testEnv) start(t testing.TB) *dra.Driver {
	t.Helper()
	d, err := dra.New(dra.Options{
		NodeName: testNode, KubeClient: e.client, HostRoot: e.root, NodeRoot: e.root,
		PluginDir: e.pluginDir, RegistryDir: e.registryDir, CDIDir: e.cdiDir, DevInfoDir: e.dev,
		Links: e.links, OnFatal: func(err error) { t.Errorf("fatal: %v", err) },
	})
	require.NoError(t, err)
	d.Update(e.scan)
	ctx, cancel := context.WithCancel(context.Background())
	require.NoError(t, d.Start(ctx))
	t.Cleanup(func() {
		d.Stop()
		cancel()
	})
	return d
}

// slices returns the devices of the driver's ResourceSlices, by name.
func (e *testEnv) slices(t testing.TB) map[string]resourceapi.Device {
	t.Helper()
	list, err := e.client.ResourceV1().ResourceSlices().List(context.Background(), metav1.ListOptions{})
	require.NoError(t, err)
	out := map[string]resourceapi.Device{}
	for _, s := range list.Items {
		require.Equal(t, dra.DriverName, s.Spec.Driver)
		require.Equal(t, testNode, s.Spec.Pool.Name)
		require.NotNil(t, s.Spec.NodeName)
		require.Equal(t, testNode, *s.Spec.NodeName)
		for _, d := range s.Spec.Devices {
			out[d.Name] = d
		}
	}
	return out
}

// waitSlices waits (up to 10 s) until the published devices satisfy ok.
func (e *testEnv) waitSlices(t testing.TB, what string, ok func(map[string]resourceapi.Device) bool) map[string]resourceapi.Device {
	t.Helper()
	var got map[string]resourceapi.Device
	deadline := time.Now().Add(10 * time.Second)
	for {
		got = e.slices(t)
		if ok(got) {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("ResourceSlices never showed %s within 10 s (last: %d devices)", what, len(got))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// kubelet is the kubelet's side of the plugin: registration and the DRA
// gRPC service, over the real unix sockets.
type kubelet struct {
	conn *grpc.ClientConn
	dra  drapbv1.DRAPluginClient
	info *registerapi.PluginInfo
}

// register does what the kubelet's plugin watcher does with a new
// registration socket, and connects to the endpoint it names.
func (e *testEnv) register(t testing.TB) *kubelet {
	t.Helper()
	sock := filepath.Join(e.registryDir, dra.DriverName+"-reg.sock")
	reg, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer reg.Close()
	rc := registerapi.NewRegistrationClient(reg)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := rc.GetInfo(ctx, &registerapi.InfoRequest{})
	require.NoError(t, err)
	_, err = rc.NotifyRegistrationStatus(ctx, &registerapi.RegistrationStatus{PluginRegistered: true})
	require.NoError(t, err)
	conn, err := grpc.NewClient("unix://"+info.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	return &kubelet{conn: conn, dra: drapbv1.NewDRAPluginClient(conn), info: info}
}

func (k *kubelet) prepare(t testing.TB, claims ...*resourceapi.ResourceClaim) map[string]*drapbv1.NodePrepareResourceResponse {
	t.Helper()
	req := &drapbv1.NodePrepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := k.dra.NodePrepareResources(ctx, req)
	require.NoError(t, err)
	require.Len(t, resp.Claims, len(claims))
	return resp.Claims
}

func (k *kubelet) unprepare(t testing.TB, claims ...*resourceapi.ResourceClaim) map[string]*drapbv1.NodeUnprepareResourceResponse {
	t.Helper()
	req := &drapbv1.NodeUnprepareResourcesRequest{}
	for _, c := range claims {
		req.Claims = append(req.Claims, &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := k.dra.NodeUnprepareResources(ctx, req)
	require.NoError(t, err)
	require.Len(t, resp.Claims, len(claims))
	return resp.Claims
}

// result is one allocation result: driver, request and device.
type result struct{ driver, request, device string }

// claim stores an allocated ResourceClaim in the fake API server, as the
// scheduler leaves it.
func (e *testEnv) claim(t testing.TB, name string, results ...result) *resourceapi.ResourceClaim {
	t.Helper()
	c := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID(name + "-uid")},
		Status:     resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{}},
	}
	for _, r := range results {
		c.Status.Allocation.Devices.Results = append(c.Status.Allocation.Devices.Results,
			resourceapi.DeviceRequestAllocationResult{Driver: r.driver, Request: r.request, Pool: testNode, Device: r.device})
	}
	got, err := e.client.ResourceV1().ResourceClaims("default").Create(context.Background(), c, metav1.CreateOptions{})
	require.NoError(t, err)
	return got
}

// vf is an allocation result of this driver for the VF at addr.
func vf(request, addr string) result { return result{dra.DriverName, request, dra.DeviceName(addr)} }

type nicDevice = nic.Device

var (
	metav1UpdateOptions = metav1.UpdateOptions{}
	metav1GetOptions    = metav1.GetOptions{}
	metav1ListOptions   = metav1.ListOptions{}
)
