package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// rdmaPort is the RDMA port named in NCCL_IB_HCA / UCX_NET_DEVICES. Every
// mlx5 PCI function (PF or VF) has its own RDMA device with a single port 1;
// a dual-port card shows up as two functions.
const rdmaPort = 1

// server is the device plugin gRPC server of one pool.
type server struct {
	pluginapi.UnimplementedDevicePluginServer

	log     *slog.Logger
	root    string // the node root for DeviceSpec host paths (Options.NodeRoot)
	devInfo *devInfoStore
	metrics *Metrics
	onAlloc func(ids []string)

	mu    sync.Mutex // guards the fields below
	v     served
	slots []slot
	byID  map[string]int
	// changed is closed (and replaced) whenever slots change.
	changed chan struct{}
	grpc    *grpc.Server
	sock    string
	done    chan struct{} // closed when Serve returns
}

var _ pluginapi.DevicePluginServer = (*server)(nil)

// served is what a server hands out.
type served struct {
	pool pool.Pool
	// rdmaCM is the node's rdma_cm (Scan.RDMACM): a container given an
	// RDMA device gets it too.
	rdmaCM string
	// cdi: the pool's CDI spec is written; Allocate returns CDI names.
	cdi bool
}

func newServer(v served, slots []slot, log *slog.Logger, root string, di *devInfoStore, m *Metrics, onAlloc func([]string)) *server {
	s := &server{log: log.With("resource", v.pool.ResourceName()), root: root, devInfo: di, metrics: m,
		onAlloc: onAlloc, changed: make(chan struct{})}
	s.setLocked(v, slots)
	return s
}

// update replaces the pool and its device list and wakes ListAndWatch
// streams when the kubelet's view changed. It reports whether it did.
func (s *server) update(v served, slots []slot) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	same := sameSlots(s.slots, slots)
	s.setLocked(v, slots)
	if !same {
		close(s.changed)
		s.changed = make(chan struct{})
	}
	return !same
}

func (s *server) setLocked(v served, slots []slot) {
	s.v = v
	s.slots = slots
	s.byID = make(map[string]int, len(slots))
	for i := range slots {
		s.byID[slots[i].ID] = i
	}
	healthy := 0
	for i := range slots {
		if slots[i].Healthy {
			healthy++
		}
	}
	s.metrics.setDevices(v.pool.ResourceName(), len(slots), healthy)
}

// start removes a stale file at sock (a socket of an earlier run), listens
// on it and serves.
func (s *server) start(sock string) error {
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("socket %s: remove stale: %w", sock, err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return fmt.Errorf("socket %s: listen: %w", sock, err)
	}
	// The kubelet (root) is the only client: 0600, not the umask's mode.
	if err := os.Chmod(sock, 0o600); err != nil {
		l.Close()
		return fmt.Errorf("socket %s: chmod 0600: %w", sock, err)
	}
	// We remove the socket ourselves: closing must never unlink a newer
	// socket at the same path.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	g := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(g, s)
	done := make(chan struct{})
	s.mu.Lock()
	s.grpc, s.sock, s.done = g, sock, done
	s.mu.Unlock()
	go func() {
		defer close(done)
		// grpc.ErrServerStopped: stop came before Serve began; not a failure.
		if err := g.Serve(l); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("device plugin server stopped", "socket", sock, "err", err)
		}
	}()
	return nil
}

// stop stops serving, ends ListAndWatch streams and removes the socket.
func (s *server) stop() {
	s.mu.Lock()
	g, sock, done := s.grpc, s.sock, s.done
	s.grpc, s.sock, s.done = nil, "", nil
	s.mu.Unlock()
	if g == nil {
		return
	}
	g.Stop()
	<-done
	if err := os.Remove(sock); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("remove socket", "socket", sock, "err", err)
	}
}

// setServed replaces what the server hands out, its device list kept.
func (s *server) setServed(v served) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.v = v
}

// served is what the server hands out now.
func (s *server) served() served {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v
}

func (s *server) socket() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.sock
}

func (s *server) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

func (s *server) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

// list is the current ListAndWatch response and the channel closed on the
// next change.
func (s *server) list() (*pluginapi.ListAndWatchResponse, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	resp := &pluginapi.ListAndWatchResponse{Devices: make([]*pluginapi.Device, len(s.slots))}
	for i := range s.slots {
		sl := &s.slots[i]
		d := &pluginapi.Device{ID: sl.ID, Health: pluginapi.Unhealthy}
		if sl.Healthy {
			d.Health = pluginapi.Healthy
		}
		if len(sl.Topology) > 0 {
			d.Topology = &pluginapi.TopologyInfo{}
			for _, n := range sl.Topology {
				d.Topology.Nodes = append(d.Topology.Nodes, &pluginapi.NUMANode{ID: int64(n)})
			}
		}
		resp.Devices[i] = d
	}
	return resp, s.changed
}

func (s *server) ListAndWatch(_ *pluginapi.Empty, stream grpc.ServerStreamingServer[pluginapi.ListAndWatchResponse]) error {
	for {
		resp, changed := s.list()
		if err := stream.Send(resp); err != nil {
			return fmt.Errorf("listandwatch: send: %w", err)
		}
		select {
		case <-changed:
		case <-stream.Context().Done():
			return nil
		}
	}
}

// GetPreferredAllocation answers each container request with the devices
// preferred() picks. Everything the kubelet sends is bounded before it is
// used: a negative size is an error, a size beyond the pool is clamped to
// it (by preferred), and the ID lists are only ever looked up, never used
// to size memory.
func (s *server) GetPreferredAllocation(_ context.Context, req *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	s.mu.Lock()
	all := make(map[string]candidate, len(s.slots))
	for i := range s.slots {
		sl := &s.slots[i]
		all[sl.ID] = candidate{ID: sl.ID, NUMA: sl.NUMA, PF: sl.PF}
	}
	policy := s.v.pool.AllocationPolicy
	name := s.v.pool.ResourceName()
	s.mu.Unlock()
	resp := &pluginapi.PreferredAllocationResponse{}
	for i, cr := range req.ContainerRequests {
		if cr.AllocationSize < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "%s: container request %d: allocation size %d is negative", name, i, cr.AllocationSize)
		}
		ids := preferred(all, cr.AvailableDeviceIDs, cr.MustIncludeDeviceIDs, int(cr.AllocationSize), policy)
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: ids})
	}
	return resp, nil
}

// maxQuoted is how much of a device ID from a request an error message
// repeats: the kubelet's requests are not bounded, our messages are.
const maxQuoted = 64

// quoteID quotes an ID for an error message, cut to maxQuoted bytes.
func quoteID(id string) string {
	if len(id) <= maxQuoted {
		return strconv.Quote(id)
	}
	return strconv.Quote(id[:maxQuoted]) + fmt.Sprintf("… (%d bytes)", len(id))
}

func (s *server) Allocate(_ context.Context, req *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	s.mu.Lock()
	v := s.v
	p := &v.pool
	fns, err := s.resolveLocked(req)
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}

	resp := &pluginapi.AllocateResponse{ContainerResponses: make([]*pluginapi.ContainerAllocateResponse, len(fns))}
	for i, devs := range fns {
		resp.ContainerResponses[i] = s.containerResponse(v, devs)
	}
	if p.Kind == pool.Exclusive {
		for _, devs := range fns {
			for _, d := range devs {
				if err := s.devInfo.write(p.Prefix, p.Name, d); err != nil {
					return nil, status.Errorf(codes.Internal, "%s: %v", p.ResourceName(), err)
				}
			}
		}
	}
	var ids []string
	for _, cr := range req.ContainerRequests {
		ids = append(ids, cr.DevicesIds...)
	}
	if s.onAlloc != nil {
		s.onAlloc(ids)
	}
	s.metrics.allocated(p.ResourceName(), len(ids))
	s.log.Debug("allocate", "devices", ids)
	return resp, nil
}

// resolveLocked checks every container request of an Allocate before any
// side effect, so that nothing is half-allocated, and returns the PCI
// functions each container gets. An ID the pool does not have, or one
// asked for twice — in one container or in two containers of the call — is
// an error.
func (s *server) resolveLocked(req *pluginapi.AllocateRequest) ([][]*nic.Device, error) {
	name := s.v.pool.ResourceName()
	total := 0
	for _, cr := range req.ContainerRequests {
		total += len(cr.DevicesIds)
	}
	if total > len(s.slots) {
		return nil, status.Errorf(codes.InvalidArgument, "%s: request for %d devices in %d containers exceeds the pool's %d",
			name, total, len(req.ContainerRequests), len(s.slots))
	}
	owner := make(map[string]int, total) // device ID → container
	fns := make([][]*nic.Device, len(req.ContainerRequests))
	for i, cr := range req.ContainerRequests {
		for _, id := range cr.DevicesIds {
			j, ok := s.byID[id]
			if !ok {
				return nil, status.Errorf(codes.InvalidArgument, "%s: unknown device ID %s", name, quoteID(id))
			}
			if c, dup := owner[id]; dup {
				if c == i {
					return nil, status.Errorf(codes.InvalidArgument, "%s: device ID %s requested twice", name, quoteID(id))
				}
				return nil, status.Errorf(codes.InvalidArgument, "%s: device ID %s requested for containers %d and %d of one pod", name, quoteID(id), c, i)
			}
			owner[id] = i
			for _, f := range s.slots[j].Functions {
				if !slices.Contains(fns[i], f) {
					fns[i] = append(fns[i], f)
				}
			}
		}
		slices.SortFunc(fns[i], func(a, b *nic.Device) int { return strings.Compare(a.PCIAddress, b.PCIAddress) })
	}
	return fns, nil
}

// containerResponse builds what one container gets for devs.
//
// NCCL_IB_HCA uses NCCL's exact-match syntax: a leading "=" makes every
// entry of the list match a device name exactly (no prefix match, so
// mlx5_1 does not also pick mlx5_12..mlx5_19); ":1" is the port.
// UCX_NET_DEVICES takes "<device>:<port>" entries.
//
// No RoCE GID index is set. With NCCL_IB_GID_INDEX unset (its default -1),
// NCCL (2.21 and later) picks the GID itself: on a RoCE port it takes the
// GID of RoCE version NCCL_IB_ROCE_VERSION_NUM (default 2) whose address
// family matches NCCL_IB_ADDR_FAMILY / NCCL_SOCKET_FAMILY (IPv4 unless set
// to AF_INET6) — the index is not stable across hosts or address changes,
// so hard-coding one would be wrong as soon as an address is added.
// InfiniBand ports do not need a GID index.
func (s *server) containerResponse(v served, devs []*nic.Device) *pluginapi.ContainerAllocateResponse {
	p, rdmaCM := &v.pool, v.rdmaCM
	cr := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{}}
	env := EnvName(p.Prefix, p.Name)
	addrs := make([]string, 0, len(devs))
	info := make(map[string]DeviceInfo, len(devs))
	var hcas, ucx []string
	seen := map[string]bool{}
	for _, d := range devs {
		addrs = append(addrs, d.PCIAddress)
		info[d.PCIAddress] = NewDeviceInfo(d, rdmaCM)
		if d.UsesRDMA() {
			hcas = append(hcas, fmt.Sprintf("%s:%d", d.RDMADevice, rdmaPort))
			ucx = append(ucx, fmt.Sprintf("%s:%d", d.RDMADevice, rdmaPort))
		}
		for _, path := range devicePaths(d, rdmaCM) {
			if seen[path] {
				continue
			}
			seen[path] = true
			cr.Devices = append(cr.Devices, &pluginapi.DeviceSpec{
				ContainerPath: path, HostPath: hostPath(s.root, path), Permissions: "rw",
			})
		}
		if v.cdi {
			cr.CdiDevices = append(cr.CdiDevices, &pluginapi.CDIDevice{Name: CDIDeviceName(p, d.PCIAddress)})
		}
	}
	// rdma_cm is node-wide and comes once per device; keep it last.
	slices.SortStableFunc(cr.Devices, func(a, b *pluginapi.DeviceSpec) int {
		ca, cb := filepath.Base(a.ContainerPath) == "rdma_cm", filepath.Base(b.ContainerPath) == "rdma_cm"
		switch {
		case ca == cb:
			return 0
		case ca:
			return 1
		}
		return -1
	})
	cr.Envs[env] = strings.Join(addrs, ",")
	if js, err := json.Marshal(info); err == nil {
		cr.Envs[env+"_INFO"] = string(js)
	}
	// One pool per node sets these (pool.Resource.NCCLEnv): the kubelet
	// keeps one value per variable for a container holding several pools.
	if p.NCCLEnv && len(hcas) > 0 {
		cr.Envs["NCCL_IB_HCA"] = "=" + strings.Join(hcas, ",")
		cr.Envs["UCX_NET_DEVICES"] = strings.Join(ucx, ",")
	}
	return cr
}
