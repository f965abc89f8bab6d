package plugin

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"

	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/stretchr/testify/require"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fastpath-k8s/fastpath/internal/netdata"
)

// fakeDriver is the DRA driver's side of its network data socket: a real
// HTTP server on a unix socket that records what it is told, and takes
// it, or refuses with refuse.
type fakeDriver struct {
	socket string
	mu     sync.Mutex // guards the fields below
	got    []netdata.Request
	refuse string
}

func serveDriver(t *testing.T) *fakeDriver {
	t.Helper()
	f := &fakeDriver{socket: filepath.Join(t.TempDir(), netdata.SocketName)}
	ln, err := net.Listen("unix", f.socket)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc(netdata.Path, func(w http.ResponseWriter, r *http.Request) {
		var req netdata.Request
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		f.got = append(f.got, req)
		if f.refuse != "" {
			http.Error(w, f.refuse, http.StatusForbidden)
			return
		}
		_ = json.NewEncoder(w).Encode(netdata.Response{Claim: "default/c", Request: "vf"})
	})
	srv := &http.Server{Handler: mux}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return f
}

// told returns and forgets what the driver was told.
func (f *fakeDriver) told() []netdata.Request {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.got
	f.got = nil
	return out
}

const seedVF = "0000:3b:01.2" // ens1f1v0 of roce-cx6dx

// podArgs are CNI_ARGS naming the pod as a Kubernetes runtime does.
const podArgs = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=nccl-seed;K8S_POD_UID=7e3c-uid"

// addAs runs ADD with podArgs and returns its result.
func (e *env) addAs(conf, podNS, cid string) *current.Result {
	e.t.Helper()
	a := e.args(conf, podNS, cid, "net1")
	a.Args = podArgs
	var out bytes.Buffer
	e.p.Stdout = &out
	require.NoError(e.t, e.p.Add(a))
	r, err := current.NewResult(out.Bytes())
	require.NoError(e.t, err)
	return r.(*current.Result)
}

// After the ADD of a VF the pod holds through fastpath's DRA driver (the
// seed's NAD: PodResources gave it), the plugin tells the driver the VF's
// interface in the pod — name, MAC, the address IPAM gave — and waits
// for it. A driver that refuses, or no driver socket, leaves the ADD
// successful, with a warning that names the VF and why.
func TestAddTellsDRADriverTheInterface(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	a := e.standIn("ens1f1v0")
	p := podWith("default", "nccl-seed")
	p.Containers[1].DynamicResources = []*podresourcesapi.DynamicResource{dra("nccl-seed-extended-resources-abcde", seedVF)}
	e.p.NewPodResources = NewKubeletPodResources
	podres := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{p}})
	drv := serveDriver(t)
	// The sockets are the node's (NodeConfig): conf sets them there.
	conf := func(socket string, more string) string {
		e.p.Node.PodResourcesSocket, e.p.Node.DRASocket = podres, socket
		return e.conf(e.hostLocal("10.56.217.0/24", "") + more)
	}
	podNS := e.pod()

	r := e.addAs(conf(drv.socket, ""), podNS, "c1")
	require.Equal(t, []netdata.Request{{PCIAddress: seedVF, PodNamespace: "default", PodName: "nccl-seed", PodUID: "7e3c-uid",
		InterfaceName: "net1", HardwareAddress: r.Interfaces[0].Mac, IPs: []string{r.IPs[0].Address.String()}}}, drv.told())
	require.NotEmpty(t, r.Interfaces[0].Mac)
	require.Contains(t, r.IPs[0].Address.String(), "10.56.217.")
	require.Contains(t, e.log.String(), "device metadata has the VF's interface")
	require.NotContains(t, e.log.String(), "level=WARN")
	require.NoError(t, e.del(conf(drv.socket, ""), podNS, "c1", "net1"))

	for _, tc := range []struct {
		name, socket, refuse, want string
	}{
		{"the driver refuses", drv.socket, "VF 0000:3b:01.2 is prepared for claim [default/c], which is not reserved for pod", "refused (403 Forbidden): VF 0000:3b:01.2 is prepared for claim"},
		{"no driver socket", filepath.Join(t.TempDir(), "cni.sock"), "", "no DRA driver socket: "},
	} {
		e.log.Reset()
		drv.mu.Lock()
		drv.refuse = tc.refuse
		drv.mu.Unlock()
		e.p.Node.LogDir = t.TempDir()
		logFile := filepath.Join(e.p.Node.LogDir, "sriov.log")
		e.addAs(conf(tc.socket, `,"logFile":"`+logFile+`"`), podNS, "c2")
		// The log goes to the file; stderr (the runtime's log) still has the warning.
		require.Contains(t, e.log.String(), "sriov: warning: VF "+seedVF+" attached as net1, but the DRA driver was not told its interface", tc.name)
		require.Contains(t, e.log.String(), tc.want, tc.name)
		require.NoError(t, e.del(conf(tc.socket, ""), podNS, "c2", "net1"), tc.name)
		drv.told()
	}
	e.requireRestored(a, seedVF)
}

// A deviceID (Multus passes one for the device plugin's VFs, and for a
// VF of a claim its NAD names): the driver is told only when its socket
// exists and PodResources lists the VF among the pod's DRA VFs. A node
// without the socket has no DRA driver: PodResources is not even asked.
func TestAddDeviceIDTellsDRAOnlyItsVFs(t *testing.T) {
	e := newEnv(t, "roce-cx6dx")
	e.standIn("ens1f1v0")
	drv := serveDriver(t)
	podNS := e.pod()
	// The sockets are the node's (NodeConfig): conf sets them there.
	conf := func(socket, podres string) string {
		e.p.Node.DRASocket = socket
		if podres != "" {
			e.p.Node.PodResourcesSocket = podres
		}
		return e.conf(`"deviceID":"` + seedVF + `"`)
	}
	missing := filepath.Join(t.TempDir(), "cni.sock")

	// No driver socket: newEnv's PodResources fails the test if asked.
	e.addAs(conf(missing, "/nonexistent/kubelet.sock"), podNS, "c1")
	require.NoError(t, e.del(conf(missing, ""), podNS, "c1", "net1"))
	e.p.Node.DRASocket = ""
	e.addAs(e.conf(`"deviceID":"`+seedVF+`"`), podNS, "c1") // no draSocket, no default
	require.NoError(t, e.del(e.conf(`"deviceID":"`+seedVF+`"`), podNS, "c1", "net1"))
	require.Empty(t, drv.told())

	// The device plugin's VF on a node where the DRA driver runs too.
	e.p.NewPodResources = NewKubeletPodResources
	dp := podWith("default", "nccl-seed", &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/rails", DeviceIds: []string{seedVF}})
	podres := serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{dp}})
	e.addAs(conf(drv.socket, podres), podNS, "c1")
	require.NoError(t, e.del(conf(drv.socket, podres), podNS, "c1", "net1"))
	require.Empty(t, drv.told(), "a VF of the device plugin")
	require.NotContains(t, e.log.String(), "level=WARN")

	// The VF of a claim the NAD names.
	withClaim := podWith("default", "nccl-seed")
	withClaim.Containers[0].DynamicResources = []*podresourcesapi.DynamicResource{dra("rank-0-gpu-vf", seedVF)}
	podres = serveKubelet(t, &kubelet{pods: []*podresourcesapi.PodResources{withClaim}})
	e.addAs(conf(drv.socket, podres), podNS, "c1")
	got := drv.told()
	require.Len(t, got, 1)
	require.Equal(t, seedVF, got[0].PCIAddress)
	require.Equal(t, "7e3c-uid", got[0].PodUID)
	require.NoError(t, e.del(conf(drv.socket, podres), podNS, "c1", "net1"))
}
