package plugin

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func fixtureRoot(name string) string {
	p, err := filepath.Abs(filepath.Join("..", "..", "..", "..", "testdata", "sysfs", name))
	if err != nil {
		panic(err)
	}
	return p
}

func scanFixture(t testing.TB, name string) *nic.Snapshot {
	t.Helper()
	snap, err := nic.NewScanner(fixtureRoot(name)).Scan()
	require.NoError(t, err)
	return snap
}

// dgxPools: the 32 compute VFs (exclusive, spread) and the two NUMA-0
// storage ports (shared, 4 containers).
func dgxPools(t testing.TB) []pool.Pool {
	snap := scanFixture(t, "dgx-h100")
	require.Equal(t, rdma.RDMACMPath, snap.RDMACM)
	rails := pool.Pool{Resource: pool.Resource{Prefix: "mellanox.com", Name: "rails", Kind: pool.Exclusive, AllocationPolicy: pool.PolicySpread, NCCLEnv: true}}
	storage := pool.Pool{Resource: pool.Resource{Prefix: "mellanox.com", Name: "storage", Kind: pool.Shared, RdmaHcaMax: 4}}
	for _, d := range snap.Devices {
		switch {
		case d.IsVF() && d.DeviceID == "101e":
			rails.Devices = append(rails.Devices, d)
		case d.PCIAddress == "0000:29:00.0" || d.PCIAddress == "0000:29:00.1":
			storage.Devices = append(storage.Devices, d)
		}
	}
	require.Len(t, rails.Devices, 32)
	require.Len(t, storage.Devices, 2)
	return []pool.Pool{rails, storage}
}

// source is a ScanFunc whose answer tests change.
type source struct {
	mu    sync.Mutex // guards the fields below
	scan  Scan
	calls int
}

func (s *source) set(pools ...pool.Pool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scan.Pools = pools
}

func (s *source) fn(bool) (Scan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.scan, nil
}

type harness struct {
	t      testing.TB
	dir    string
	stub   *kubeletstub.Stub
	src    *source
	links  *ChanLinks
	opts   Options
	m      *Manager // read it only after stop
	cancel context.CancelFunc
	errc   chan error
}

func newHarness(t testing.TB, mod func(*Options), pools ...pool.Pool) *harness {
	t.Helper()
	dir := t.TempDir()
	h := &harness{t: t, dir: dir, stub: kubeletstub.New(dir), src: &source{}, links: NewChanLinks(), errc: make(chan error, 1)}
	h.src.set(pools...)
	h.src.scan.RDMACM = rdma.RDMACMPath
	require.NoError(t, h.stub.Start())
	t.Cleanup(h.stub.Stop)
	h.opts = Options{
		KubeletDir: dir, HostRoot: fixtureRoot("dgx-h100"), DevInfoDir: filepath.Join(dir, "devinfo"),
		Scan: h.src.fn, Links: h.links, Log: slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&h.opts)
	}
	return h
}

func (h *harness) run() { h.runAfter(nil) }

// runAfter is run, calling between (when not nil) between the first scan
// and Run.
func (h *harness) runAfter(between func()) {
	h.t.Helper()
	m, err := NewManager(h.opts)
	require.NoError(h.t, err)
	h.m = m
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	// The first scan is Run's, as serve.go makes it.
	first, err := h.opts.Scan(false)
	require.NoError(h.t, err)
	if between != nil {
		between()
	}
	go func() { h.errc <- m.Run(ctx, first) }()
	// What a start puts off until after registration (CDI specs, an
	// earlier run's leftovers) is done before the tests look.
	select {
	case <-m.firstRound:
	case <-time.After(10 * time.Second):
		h.t.Fatal("the manager's first round did not end within 10 s")
	}
	h.t.Cleanup(func() { h.stop() })
}

func (h *harness) stop() error {
	if h.cancel == nil {
		return nil
	}
	h.cancel()
	h.cancel = nil
	select {
	case err := <-h.errc:
		return err
	case <-time.After(10 * time.Second):
		h.t.Fatal("manager did not stop within 10s")
	}
	return nil
}

// registered waits for registrations of the given resources (any order).
func (h *harness) registered(resources ...string) map[string]*pluginapi.RegisterRequest {
	h.t.Helper()
	got := map[string]*pluginapi.RegisterRequest{}
	gen := h.stub.Generation()
	for len(got) < len(resources) {
		r, err := h.stub.WaitRegistration(5 * time.Second)
		require.NoError(h.t, err)
		if r.Generation != gen {
			continue // a retry that reached the previous kubelet
		}
		got[r.Request.ResourceName] = r.Request
	}
	for _, r := range resources {
		require.Contains(h.t, got, r)
	}
	return got
}

func (h *harness) client(endpoint string) pluginapi.DevicePluginClient {
	h.t.Helper()
	c, conn, err := h.stub.Dial(endpoint)
	require.NoError(h.t, err)
	h.t.Cleanup(func() { conn.Close() })
	return c
}

type watch struct {
	t      testing.TB
	ch     chan *pluginapi.ListAndWatchResponse
	cancel context.CancelFunc
}

func (h *harness) watch(c pluginapi.DevicePluginClient) *watch {
	h.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(h.t, err)
	w := &watch{t: h.t, ch: make(chan *pluginapi.ListAndWatchResponse, 64), cancel: cancel}
	go func() {
		defer close(w.ch)
		for {
			r, err := stream.Recv()
			if err != nil {
				return
			}
			w.ch <- r
		}
	}()
	h.t.Cleanup(cancel)
	return w
}

func (w *watch) next() *pluginapi.ListAndWatchResponse {
	w.t.Helper()
	select {
	case r, ok := <-w.ch:
		require.True(w.t, ok, "ListAndWatch stream ended")
		return r
	case <-time.After(5 * time.Second):
		w.t.Fatal("no ListAndWatch update within 5s")
	}
	return nil
}

func health(r *pluginapi.ListAndWatchResponse) map[string]string {
	m := map[string]string{}
	for _, d := range r.Devices {
		m[d.ID] = d.Health
	}
	return m
}

func TestNames(t *testing.T) {
	for _, tc := range []struct {
		prefix, name, env, sock string
	}{
		{"mellanox.com", "mlnx_sriov_rdma", "PCIDEVICE_MELLANOX_COM_MLNX_SRIOV_RDMA", "mellanox.com_mlnx_sriov_rdma.sock"},
		{"rdma.example-1.io", "rail-0.a", "PCIDEVICE_RDMA_EXAMPLE_1_IO_RAIL_0_A", "rdma.example-1.io_rail-0.a.sock"},
		{"nvidia.com", "Hca$Shared", "PCIDEVICE_NVIDIA_COM_HCA_SHARED", "nvidia.com_Hca$Shared.sock"},
	} {
		t.Run(tc.prefix+"/"+tc.name, func(t *testing.T) {
			env := EnvName(tc.prefix, tc.name)
			require.Equal(t, tc.env, env)
			require.Regexp(t, `^[A-Z0-9_]+$`, env)
			require.Equal(t, tc.sock, SocketName(tc.prefix, tc.name))
		})
	}
	// Prefixes have no "_" (pkg/pool refuses one), so the socket name
	// determines prefix and name.
	_, err := pool.Parse([]byte(`{"resourceList":[{"resourcePrefix":"a_b","resourceName":"c","selectors":{"vendors":["15b3"]}}]}`))
	require.ErrorContains(t, err, `resource prefix "a_b" is not a DNS subdomain`)
	require.NotEqual(t, SocketName("a.b", "c"), SocketName("a", "b.c"))
}

func TestServeDGX(t *testing.T) {
	pools := dgxPools(t)
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	require.NoError(t, os.MkdirAll(cdiDir, 0o755))
	foreign := filepath.Join(cdiDir, "vendor-other.json")
	require.NoError(t, os.WriteFile(foreign, []byte("{}"), 0o644))
	// The plugin reads the fixture (HostRoot); on the node that tree is
	// at /node (NodeRoot): what it hands out is under /node.
	const nodeRoot = "/node"
	h := newHarness(t, func(o *Options) { o.CDIDir = cdiDir; o.NodeRoot = nodeRoot }, pools...)
	h.run()

	regs := h.registered("mellanox.com/rails", "mellanox.com/storage")
	reg := regs["mellanox.com/rails"]
	require.Equal(t, pluginapi.Version, reg.Version)
	require.Equal(t, "mellanox.com_rails.sock", reg.Endpoint)
	require.Equal(t, "mellanox.com/rails", reg.ResourceName)
	require.True(t, reg.Options.GetPreferredAllocationAvailable)
	require.False(t, reg.Options.PreStartRequired)
	require.Equal(t, "mellanox.com_storage.sock", regs["mellanox.com/storage"].Endpoint)
	// The sockets are the kubelet's (root) only, whatever the umask.
	for _, r := range regs {
		st, err := os.Stat(filepath.Join(h.dir, r.Endpoint))
		require.NoError(t, err)
		require.Equal(t, os.ModeSocket|0o600, st.Mode()&(os.ModeType|os.ModePerm), r.Endpoint)
	}

	rails := h.client("mellanox.com_rails.sock")
	opts, err := rails.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	require.NoError(t, err)
	require.True(t, opts.GetPreferredAllocationAvailable)
	require.False(t, opts.PreStartRequired)

	t.Run("ListAndWatch exclusive", func(t *testing.T) {
		r := h.watch(rails).next()
		require.Len(t, r.Devices, 32)
		require.Equal(t, "0000:18:00.1", r.Devices[0].ID)
		require.Equal(t, pluginapi.Healthy, r.Devices[0].Health)
		require.Equal(t, []int64{0}, numa(r.Devices[0]))
		last := r.Devices[31]
		require.Equal(t, "0000:dc:00.4", last.ID)
		require.Equal(t, int64(1), last.Topology.Nodes[0].ID)
		for _, d := range r.Devices {
			require.Equal(t, pluginapi.Healthy, d.Health, d.ID)
			require.Len(t, d.Topology.Nodes, 1, d.ID)
		}
	})

	t.Run("Allocate exclusive", func(t *testing.T) {
		resp, err := rails.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"0000:40:00.1", "0000:18:00.1"}},
		}})
		require.NoError(t, err)
		require.Len(t, resp.ContainerResponses, 1)
		cr := resp.ContainerResponses[0]
		root := nodeRoot
		spec := func(p string) devSpec { return devSpec{p, root + p, "rw"} }
		require.Equal(t, []devSpec{
			spec("/dev/infiniband/uverbs14"), spec("/dev/infiniband/umad12"), spec("/dev/infiniband/issm12"),
			spec("/dev/infiniband/uverbs18"), spec("/dev/infiniband/umad16"), spec("/dev/infiniband/issm16"),
			spec("/dev/infiniband/rdma_cm"),
		}, specs(cr.Devices))
		require.Equal(t, "0000:18:00.1,0000:40:00.1", cr.Envs["PCIDEVICE_MELLANOX_COM_RAILS"])
		require.Equal(t, "=mlx5_12:1,mlx5_16:1", cr.Envs["NCCL_IB_HCA"])
		require.Equal(t, "mlx5_12:1,mlx5_16:1", cr.Envs["UCX_NET_DEVICES"])
		require.NotContains(t, cr.Envs, "NCCL_IB_GID_INDEX")
		require.Len(t, cr.Envs, 4)
		// fastpath's fields and sriov-network-device-plugin's generic
		// and rdma objects, per VF (info_test.go has the other shapes).
		require.Equal(t, `{"0000:18:00.1":{"pciAddress":"0000:18:00.1","rdmaDevice":"mlx5_12",`+
			`"charDevices":["/dev/infiniband/uverbs14","/dev/infiniband/umad12","/dev/infiniband/issm12","/dev/infiniband/rdma_cm"],`+
			`"netdev":"ibp24s0v0","pfPciAddress":"0000:18:00.0","pfNetdev":"ibp24s0","linkType":"InfiniBand","numaNode":0,`+
			`"generic":{"deviceID":"0000:18:00.1"},`+
			`"rdma":{"issm":"/dev/infiniband/issm12","rdma_cm":"/dev/infiniband/rdma_cm","rdma_dev":"mlx5_12","umad":"/dev/infiniband/umad12","uverbs":"/dev/infiniband/uverbs14"}},`+
			`"0000:40:00.1":{"pciAddress":"0000:40:00.1","rdmaDevice":"mlx5_16",`+
			`"charDevices":["/dev/infiniband/uverbs18","/dev/infiniband/umad16","/dev/infiniband/issm16","/dev/infiniband/rdma_cm"],`+
			`"netdev":"ibp64s0v0","pfPciAddress":"0000:40:00.0","pfNetdev":"ibp64s0","linkType":"InfiniBand","numaNode":0,`+
			`"generic":{"deviceID":"0000:40:00.1"},`+
			`"rdma":{"issm":"/dev/infiniband/issm16","rdma_cm":"/dev/infiniband/rdma_cm","rdma_dev":"mlx5_16","umad":"/dev/infiniband/umad16","uverbs":"/dev/infiniband/uverbs18"}}}`,
			cr.Envs["PCIDEVICE_MELLANOX_COM_RAILS_INFO"])
		require.Len(t, cr.CdiDevices, 2)
		require.Equal(t, "mellanox.com/rails=0000:18:00.1", cr.CdiDevices[0].Name)
		require.Equal(t, "mellanox.com/rails=0000:40:00.1", cr.CdiDevices[1].Name)

		// device-info-spec v1.1.0 file, read-only.
		path := filepath.Join(h.dir, "devinfo", "mellanox.com-rails-0000:18:00.1-device.json")
		st, err := os.Stat(path)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o444), st.Mode().Perm())
		data, err := os.ReadFile(path)
		require.NoError(t, err)
		require.JSONEq(t, `{"type":"pci","version":"1.1.0","pci":{"pci-address":"0000:18:00.1","rdma-device":"mlx5_12","pf-pci-address":"0000:18:00.0"}}`, string(data))
	})

	var all []string
	for _, d := range pools[0].Devices {
		all = append(all, d.PCIAddress)
	}
	t.Run("Allocate errors", func(t *testing.T) {
		many := make([]string, 33)
		for i := range many {
			many[i] = "0000:18:00.1"
		}
		for _, tc := range []struct {
			name string
			reqs [][]string
			want string
		}{
			{"unknown", [][]string{{"0000:18:00.1"}, {"0000:99:00.1"}}, `"0000:99:00.1"`},
			{"too many", [][]string{many}, "request for 33 devices in 1 containers exceeds the pool's 32"},
			{"twice", [][]string{{"0000:18:00.2", "0000:18:00.2"}}, `"0000:18:00.2" requested twice`},
			{"two containers", [][]string{{"0000:18:00.2"}, {"0000:40:00.1", "0000:18:00.2"}}, `"0000:18:00.2" requested for containers 0 and 1 of one pod`},
			{"too many over containers", [][]string{all[:20], all[12:]}, "request for 40 devices in 2 containers exceeds the pool's 32"},
			{"huge ID", [][]string{{strings.Repeat("x", 1<<20)}}, `unknown device ID "` + strings.Repeat("x", 64) + `"… (1048576 bytes)`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				req := &pluginapi.AllocateRequest{}
				for _, ids := range tc.reqs {
					req.ContainerRequests = append(req.ContainerRequests, &pluginapi.ContainerAllocateRequest{DevicesIds: ids})
				}
				_, err := rails.Allocate(context.Background(), req)
				require.Equal(t, codes.InvalidArgument, status.Code(err), err)
				require.Contains(t, err.Error(), tc.want)
				require.Less(t, len(err.Error()), 300, "error messages do not echo the request")
			})
		}
		// Nothing of the failed requests was written.
		_, err := os.Stat(filepath.Join(h.dir, "devinfo", "mellanox.com-rails-0000:18:00.2-device.json"))
		require.ErrorIs(t, err, os.ErrNotExist)
	})

	t.Run("GetPreferredAllocation", func(t *testing.T) {
		for _, tc := range []struct {
			name      string
			available []string
			must      []string
			size      int32
			want      []string
		}{
			{"8 rails spread", all, nil, 8, []string{
				"0000:18:00.1", "0000:40:00.1", "0000:4f:00.1", "0000:5e:00.1",
				"0000:9a:00.1", "0000:c0:00.1", "0000:ce:00.1", "0000:dc:00.1"}},
			{"4 fit on NUMA 0", all, nil, 4, []string{"0000:18:00.1", "0000:40:00.1", "0000:4f:00.1", "0000:5e:00.1"}},
			{"must on NUMA 1 keeps NUMA 1", all, []string{"0000:ce:00.3"}, 3, []string{"0000:ce:00.3", "0000:9a:00.1", "0000:c0:00.1"}},
			{"NUMA 0 short", []string{"0000:18:00.1", "0000:9a:00.1", "0000:9a:00.2", "0000:c0:00.1"}, nil, 2, []string{"0000:9a:00.1", "0000:c0:00.1"}},
			// Sizes and lists from the kubelet are bounded, not trusted.
			{"size beyond the pool", all[:3], nil, math.MaxInt32, all[:3]},
			{"size 0", all, nil, 0, []string{}},
			{"unknown and repeated IDs", append(slices.Repeat([]string{"0000:18:00.1", "nope"}, 100000), "0000:18:00.2"), []string{"nope"}, 5,
				[]string{"0000:18:00.1", "0000:18:00.2"}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, err := rails.GetPreferredAllocation(context.Background(), &pluginapi.PreferredAllocationRequest{
					ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{
						AvailableDeviceIDs: tc.available, MustIncludeDeviceIDs: tc.must, AllocationSize: tc.size,
					}},
				})
				require.NoError(t, err)
				require.Len(t, resp.ContainerResponses, 1)
				require.Equal(t, tc.want, append([]string{}, resp.ContainerResponses[0].DeviceIDs...))
			})
		}
		for _, req := range []*pluginapi.PreferredAllocationRequest{
			{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: all, AllocationSize: -1}}},
			{ContainerRequests: []*pluginapi.ContainerPreferredAllocationRequest{{AvailableDeviceIDs: all, AllocationSize: 1}, {AllocationSize: math.MinInt32}}},
		} {
			_, err := rails.GetPreferredAllocation(context.Background(), req)
			require.Equal(t, codes.InvalidArgument, status.Code(err), err)
		}
		// The server is still there.
		_, err := rails.GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
		require.NoError(t, err)
	})

	t.Run("shared", func(t *testing.T) {
		storage := h.client("mellanox.com_storage.sock")
		r := h.watch(storage).next()
		require.Len(t, r.Devices, 4)
		for i, d := range r.Devices {
			require.Equal(t, []string{"storage-numa0-000", "storage-numa0-001", "storage-numa0-002", "storage-numa0-003"}[i], d.ID)
			require.Equal(t, pluginapi.Healthy, d.Health)
			require.Equal(t, []int64{0}, numa(d))
		}
		resp, err := storage.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"storage-numa0-002"}},
		}})
		require.NoError(t, err)
		cr := resp.ContainerResponses[0]
		var paths []string
		for _, d := range cr.Devices {
			paths = append(paths, d.ContainerPath)
			require.Equal(t, nodeRoot+d.ContainerPath, d.HostPath)
		}
		// Only the pool's two HCAs (mlx5_8 -> uverbs10, mlx5_9 -> uverbs11), not the node's others.
		require.Equal(t, []string{
			"/dev/infiniband/uverbs10", "/dev/infiniband/umad8", "/dev/infiniband/issm8",
			"/dev/infiniband/uverbs11", "/dev/infiniband/umad9", "/dev/infiniband/issm9",
			"/dev/infiniband/rdma_cm",
		}, paths)
		require.Equal(t, "0000:29:00.0,0000:29:00.1", cr.Envs["PCIDEVICE_MELLANOX_COM_STORAGE"])
		// The rails pool sets the NCCL env (NCCLEnv), this one does not.
		require.NotContains(t, cr.Envs, "NCCL_IB_HCA")
		require.NotContains(t, cr.Envs, "UCX_NET_DEVICES")
		require.Len(t, cr.Envs, 2)
	})

	t.Run("CDI spec", func(t *testing.T) {
		// Read as a runtime reads it: the CDI library parses and
		// validates the file.
		spec, err := cdi.ReadSpec(filepath.Join(cdiDir, "fastpath-mellanox.com_rails.json"), 0)
		require.NoError(t, err)
		require.Equal(t, "0.5.0", spec.Version, "the lowest version with hostPath")
		require.Equal(t, "mellanox.com/rails", spec.Kind)
		require.Len(t, spec.Devices, 32)
		dev := spec.GetDevice("0000:18:00.1")
		require.NotNil(t, dev)
		require.Equal(t, &cdispec.DeviceNode{Path: "/dev/infiniband/uverbs14", HostPath: nodeRoot + "/dev/infiniband/uverbs14", Permissions: "rw"},
			dev.ContainerEdits.DeviceNodes[0])
		require.Equal(t, "/dev/infiniband/rdma_cm", dev.ContainerEdits.DeviceNodes[3].Path)
		// Every name Allocate hands out resolves in the directory, as the
		// runtime's CDI cache resolves it.
		cache, err := cdi.NewCache(cdi.WithSpecDirs(cdiDir), cdi.WithAutoRefresh(false))
		require.NoError(t, err)
		resp, err := rails.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
			{DevicesIds: []string{"0000:dc:00.4"}}}})
		require.NoError(t, err)
		require.Len(t, resp.ContainerResponses[0].CdiDevices, 1)
		got := cache.GetDevice(resp.ContainerResponses[0].CdiDevices[0].Name)
		require.NotNil(t, got, resp.ContainerResponses[0].CdiDevices[0].Name)
		require.Equal(t, nodeRoot+"/dev/infiniband/uverbs45", got.ContainerEdits.DeviceNodes[0].HostPath)
	})

	// Stop: sockets and device-info files go; the CDI specs stay (a
	// container restarted while no plugin runs resolves its CDI names from
	// them), as do other writers' files.
	require.NoError(t, h.stop())
	for _, p := range []string{"mellanox.com_rails.sock", "mellanox.com_storage.sock", "devinfo/mellanox.com-rails-0000:18:00.1-device.json"} {
		_, err := os.Stat(filepath.Join(h.dir, p))
		require.ErrorIs(t, err, os.ErrNotExist, p)
	}
	left, err := filepath.Glob(filepath.Join(cdiDir, "*"))
	require.NoError(t, err)
	require.ElementsMatch(t, []string{foreign, filepath.Join(cdiDir, "fastpath-mellanox.com_rails.json"), filepath.Join(cdiDir, "fastpath-mellanox.com_storage.json")}, left)
}

// The host root is where the plugin reads; it never shows in what the
// kubelet and the runtime get: with the default node root, DeviceSpecs and
// CDI specs name the node's own /dev paths.
func TestHostRootNotHandedOut(t *testing.T) {
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	h := newHarness(t, func(o *Options) { o.CDIDir = cdiDir }, dgxPools(t)...)
	require.Equal(t, fixtureRoot("dgx-h100"), h.opts.HostRoot)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	resp, err := h.client("mellanox.com_rails.sock").Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:18:00.1"}}}})
	require.NoError(t, err)
	for _, d := range resp.ContainerResponses[0].Devices {
		require.Equal(t, d.ContainerPath, d.HostPath)
		require.True(t, strings.HasPrefix(d.HostPath, "/dev/infiniband/"), d.HostPath)
	}
	data, err := os.ReadFile(filepath.Join(cdiDir, "fastpath-mellanox.com_rails.json"))
	require.NoError(t, err)
	require.NotContains(t, string(data), fixtureRoot("dgx-h100"))
	require.Contains(t, string(data), `"hostPath":"/dev/infiniband/uverbs14"`)
}

// A pool that Serves turns down (left to another API) gets nothing from
// the Manager: no socket, no registration, no CDI spec.
func TestServesPicksPools(t *testing.T) {
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	h := newHarness(t, func(o *Options) {
		o.CDIDir = cdiDir
		o.Serves = func(p *pool.Pool) bool { return p.Kind == pool.Exclusive }
	}, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails")
	_, err := h.stub.WaitRegistration(300 * time.Millisecond)
	require.Error(t, err, "the shared pool is not registered")
	_, err = os.Stat(filepath.Join(h.dir, "mellanox.com_storage.sock"))
	require.ErrorIs(t, err, os.ErrNotExist)
	specs, err := filepath.Glob(filepath.Join(cdiDir, "*"))
	require.NoError(t, err)
	require.Equal(t, []string{filepath.Join(cdiDir, "fastpath-mellanox.com_rails.json")}, specs)
}

// A pool whose name the CDI library refuses as a class (Kubernetes allows
// a leading digit, CDI does not) gets no spec, and Allocate hands out no
// CDI name that would fail the container; its devices still go out as
// DeviceSpecs.
func TestCDISpecRefused(t *testing.T) {
	cdiDir := filepath.Join(t.TempDir(), "cdi")
	pools := dgxPools(t)
	pools[0].Name = "0rails"
	var logs syncLog
	h := newHarness(t, func(o *Options) { o.CDIDir = cdiDir; o.Log = slog.New(slog.NewJSONHandler(&logs, nil)) }, pools...)
	h.run()
	h.registered("mellanox.com/0rails", "mellanox.com/storage")
	resp, err := h.client("mellanox.com_0rails.sock").Allocate(context.Background(), &pluginapi.AllocateRequest{
		ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:18:00.1"}}}})
	require.NoError(t, err)
	require.Empty(t, resp.ContainerResponses[0].CdiDevices)
	require.Len(t, resp.ContainerResponses[0].Devices, 4)
	require.Contains(t, logs.String(), "write CDI spec; Allocate returns no CDI device names for the pool")
	require.Contains(t, logs.String(), "should start with letter")
	_, err = os.Stat(filepath.Join(cdiDir, "fastpath-mellanox.com_0rails.json"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// syncLog is a log buffer the manager writes while the test reads it.
type syncLog struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestHealthEvents(t *testing.T) {
	pools := dgxPools(t)
	h := newHarness(t, nil, pools...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	rails := h.client("mellanox.com_rails.sock")
	w := h.watch(rails)
	require.Len(t, w.next().Devices, 32)
	ws := h.watch(h.client("mellanox.com_storage.sock"))
	require.Len(t, ws.next().Devices, 4)

	// PF ibp24s0 oper-down: its four VFs go unhealthy.
	h.links.C <- LinkEvent{Name: "ibp24s0", Up: false}
	hl := health(w.next())
	for _, id := range []string{"0000:18:00.1", "0000:18:00.2", "0000:18:00.3", "0000:18:00.4"} {
		require.Equal(t, pluginapi.Unhealthy, hl[id], id)
	}
	require.Equal(t, pluginapi.Healthy, hl["0000:40:00.1"])
	unhealthy := 0
	for _, v := range hl {
		if v == pluginapi.Unhealthy {
			unhealthy++
		}
	}
	require.Equal(t, 4, unhealthy)

	h.links.C <- LinkEvent{Name: "ibp24s0", Up: true}
	for id, v := range health(w.next()) {
		require.Equal(t, pluginapi.Healthy, v, id)
	}

	// A VF's netdev disappears: unhealthy; it comes back: healthy.
	h.links.C <- LinkEvent{Name: "ibp64s0v2", Deleted: true}
	require.Equal(t, pluginapi.Unhealthy, health(w.next())["0000:40:00.3"])
	h.links.C <- LinkEvent{Name: "ibp64s0v2", Up: false}
	require.Equal(t, pluginapi.Healthy, health(w.next())["0000:40:00.3"])

	// An allocated VF's netdev leaving (moved into the pod) is not a fault.
	_, err := rails.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:4f:00.1"}},
	}})
	require.NoError(t, err)
	h.links.C <- LinkEvent{Name: "ibp79s0v0", Deleted: true}
	// The next change proves the previous event was processed without an update.
	h.links.C <- LinkEvent{Name: "ibp94s0", Up: false}
	hl = health(w.next())
	require.Equal(t, pluginapi.Healthy, hl["0000:4f:00.1"])
	require.Equal(t, pluginapi.Unhealthy, hl["0000:5e:00.1"])

	// The shared pool's HCA going down: shared slots stay while one HCA is up.
	h.links.C <- LinkEvent{Name: "enp41s0f0np0", Up: false}
	h.links.C <- LinkEvent{Name: "enp41s0f1np1", Up: false}
	for id, v := range health(ws.next()) {
		require.Equal(t, pluginapi.Unhealthy, v, id)
	}
	h.links.C <- LinkEvent{Name: "enp41s0f1np1", Up: true}
	for id, v := range health(ws.next()) {
		require.Equal(t, pluginapi.Healthy, v, id)
	}
}

// Events of interfaces no pool uses (pods' veths) change nothing, and an
// interface that is gone is forgotten: pod churn must not grow the state.
func TestUnrelatedLinkEvents(t *testing.T) {
	h := newHarness(t, nil, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	w := h.watch(h.client("mellanox.com_rails.sock"))
	require.Len(t, w.next().Devices, 32)
	for i := 0; i < 100; i++ {
		name := fmt.Sprintf("veth%04x", i)
		h.links.C <- LinkEvent{Name: name, Up: true}
		h.links.C <- LinkEvent{Name: name, Deleted: true}
	}
	h.links.C <- LinkEvent{Name: "eth0", Up: true}
	// The next update is the PF's: nothing before it was pushed.
	h.links.C <- LinkEvent{Name: "ibp24s0", Up: false}
	hl := health(w.next())
	require.Equal(t, pluginapi.Unhealthy, hl["0000:18:00.1"])
	require.Equal(t, pluginapi.Healthy, hl["0000:40:00.1"])
	require.NoError(t, h.stop())
	require.Equal(t, map[string]linkState{"eth0": {up: true}, "ibp24s0": {}}, h.m.links)
}

type devSpec struct{ ContainerPath, HostPath, Permissions string }

func specs(in []*pluginapi.DeviceSpec) []devSpec {
	out := make([]devSpec, len(in))
	for i, d := range in {
		out[i] = devSpec{d.ContainerPath, d.HostPath, d.Permissions}
	}
	return out
}

func numa(d *pluginapi.Device) []int64 {
	if d.Topology == nil {
		return nil
	}
	var out []int64
	for _, n := range d.Topology.Nodes {
		out = append(out, n.ID)
	}
	return out
}

// A VF in a pod since before this run (rdmaIsolation: its netdev and RDMA
// device out of the host's sysfs) is left out of the pool that asks for
// RDMA; when its pod ends, its netdev's appearing brings a rescan that
// puts it back, without waiting for the periodic one. A veth appearing
// does not.
func TestReturningVFRescans(t *testing.T) {
	root := t.TempDir()
	require.NoError(t, os.CopyFS(root, os.DirFS(fixtureRoot("dgx-h100"))))
	back, err := fixture.MoveToPod(root, "0000:18:00.1", true)
	require.NoError(t, err)
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"periodicUpdateInterval": 0, "resourceList": [{"resourceName": "rails", "selectors": {"devices": ["101e"], "isRdma": true}}]}`), 0o644))
	src, err := NewSource(cfg, nic.NewScanner(root), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	scans := 0
	var mu sync.Mutex
	h := newHarness(t, func(o *Options) {
		o.HostRoot = root
		o.Scan = func(reload bool) (Scan, error) {
			mu.Lock()
			scans++
			mu.Unlock()
			return src.Scan(reload)
		}
	})
	h.run()
	h.registered("mellanox.com/rails")
	w := h.watch(h.client("mellanox.com_rails.sock"))
	require.Len(t, w.next().Devices, 31)

	h.links.C <- LinkEvent{Name: "veth1234", Up: true} // a pod's veth: no device link
	h.links.C <- LinkEvent{Name: "ibp24s0", Up: true}  // a PF the pools know
	time.Sleep(3 * devSettleDelay)
	mu.Lock()
	require.Equal(t, 1, scans, "only the first scan")
	mu.Unlock()

	require.NoError(t, back())
	h.links.C <- LinkEvent{Name: "ibp24s0v0", Up: true}
	r := w.next()
	require.Len(t, r.Devices, 32)
	require.Equal(t, pluginapi.Healthy, health(r)["0000:18:00.1"])
}

// Without kubelet.sock the plugin says at once that it waits, again every
// WaitLogInterval while it does, and registers when the kubelet comes.
func TestSaysItWaitsForTheKubelet(t *testing.T) {
	var logs syncLog
	h := newHarness(t, func(o *Options) {
		o.Log = slog.New(slog.NewTextHandler(&logs, nil))
		o.WaitLogInterval = 20 * time.Millisecond
	}, dgxPools(t)...)
	h.stub.Stop() // removes kubelet.sock
	h.run()
	require.Eventually(t, func() bool { return strings.Count(logs.String(), "still waiting for the kubelet") >= 2 },
		10*time.Second, 5*time.Millisecond, "reminders while kubelet.sock is absent: %s", logs.String())
	require.Equal(t, 1, strings.Count(logs.String(), "waiting for the kubelet: no kubelet.sock yet"), "the first notice once")
	require.Contains(t, logs.String(), "level=WARN")

	require.NoError(t, h.stub.Start())
	h.registered("mellanox.com/rails", "mellanox.com/storage")
}
