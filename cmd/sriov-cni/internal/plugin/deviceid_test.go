package plugin

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
	podresourcesapi "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/fastpath-k8s/fastpath/pkg/sriov/sriovtest"
)

// The deviceID check (claim.go checkDeviceID) on the edge fixture's vfio
// VF: no privilege needed, and the fake PF records every call, so "nothing
// changed" is no PF call, no address, no device-info file, no state dir.

// checked turns the deviceID check on against a kubelet that lists pods,
// and returns that kubelet.
func (u *unit) checked(pods ...*podresourcesapi.PodResources) *kubelet {
	k := &kubelet{pods: pods}
	u.p.Node.DeviceIDCheck, u.p.Node.PodResourcesSocket = DeviceIDCheckPodResources, serveKubelet(u.t, k)
	u.p.NewPodResources = NewKubeletPodResources
	return k
}

// addAs runs ADD for pod default/<pod> (CNI_ARGS as the kubelet passes
// them; "" passes none).
func (u *unit) addAs(conf, cid, pod string) error {
	a := u.args(conf, cid)
	if pod != "" {
		a.Args = "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=" + pod + ";K8S_POD_INFRA_CONTAINER_ID=" + cid + ";K8S_POD_UID=uid-" + pod
	}
	var out bytes.Buffer
	u.p.Stdout = &out
	err := u.p.Add(a)
	if err != nil {
		require.Empty(u.t, out.String(), "nothing on stdout after a failure")
	}
	return err
}

// requireNothingChanged checks that a refused ADD changed nothing: no PF call,
// no address, no device-info file, no state dir.
func (u *unit) requireNothingChanged() {
	u.t.Helper()
	require.Empty(u.t, u.pf.Calls(), "no call to the PF")
	require.Equal(u.t, sriovtest.Unconfigured, u.pf.Get(vfioPF, 0))
	require.Empty(u.t, u.leases(), "no address")
	require.Empty(u.t, ls(u.t, u.devinfoDir), "no device-info file")
	_, err := os.Stat(u.stateDir)
	require.ErrorIs(u.t, err, os.ErrNotExist, "no state dir")
}

func vfio(ids ...string) *podresourcesapi.ContainerDevices {
	return &podresourcesapi.ContainerDevices{ResourceName: "mellanox.com/vfio", DeviceIds: ids}
}

// A deviceID that names a VF the pod does not hold is refused before
// anything changes, naming the VF, the pod and what it holds.
func TestDeviceIDNotHeldRefused(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		pods        []*podresourcesapi.PodResources
		want        string
	}{
		{"another pod's", "", []*podresourcesapi.PodResources{
			podWith("default", "owner", vfio(vfioVF)),
			podWith("default", "tenant", vfio("0000:86:00.2"), &podresourcesapi.ContainerDevices{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-1"}}),
		}, "deviceID 0000:86:00.1: pod default/tenant does not hold that VF (its VFs: 0000:86:00.2)"},
		{"no pod's", "", []*podresourcesapi.PodResources{
			podWith("default", "tenant"),
		}, "deviceID 0000:86:00.1: pod default/tenant does not hold that VF (its VFs: none)"},
		{"the pod not listed", "", nil, "pod default/tenant does not hold that VF (its VFs: none)"},
		{"the pod's, of another resource than the conf's", `"resourceName":"mellanox.com/rails"`, []*podresourcesapi.PodResources{
			podWith("default", "tenant", vfio(vfioVF)),
		}, "pod default/tenant does not hold that VF (its mellanox.com/rails devices (or DRA VFs): none)"},
		{"another pod's DRA VF", "", []*podresourcesapi.PodResources{
			withDRA(podWith("default", "owner"), vfioVF),
			withDRA(podWith("default", "tenant"), "0000:86:00.3"),
		}, "(its VFs: 0000:86:00.3)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			u.checked(tc.pods...)
			err := u.addAs(u.conf(`"trust":"on","spoofchk":"off"`+prefixComma(tc.extra)), "c2", "tenant")
			require.ErrorContains(t, err, tc.want)
			require.Equal(t, uint(types.ErrInvalidNetworkConfig), CNIError(err).Code)
			u.requireNothingChanged()
		})
	}
}

func prefixComma(s string) string {
	if s == "" {
		return ""
	}
	return "," + s
}

func withDRA(p *podresourcesapi.PodResources, vfs ...string) *podresourcesapi.PodResources {
	p.Containers[1].DynamicResources = []*podresourcesapi.DynamicResource{dra(p.Name+"-claim", vfs...)}
	return p
}

// The review's case: a vfio VF, which has no netdev to move, attached by
// one pod, then named by another pod's network: with its own stateDir,
// so that no state of the first was found, the second ADD succeeded and
// set the VF's settings on the PF again; with the same one it was busy
// (code 11: the runtime retries). Both are refused now (code 7) before
// anything changes, and the first attachment's settings stay.
func TestVFIOAttachedTwiceByTwoPods(t *testing.T) {
	for _, tc := range []struct {
		name     string
		stateDir func(u *unit) string
	}{
		{"its own stateDir", func(*unit) string { return filepath.Join(t.TempDir(), "tenant-state") }},
		{"the same stateDir", func(u *unit) string { return u.stateDir }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			k := u.checked(podWith("default", "owner", vfio(vfioVF)), podWith("default", "tenant"))
			require.NoError(t, u.addAs(u.conf(`"trust":"on"`), "c1", "owner"))
			require.True(t, u.pf.Get(vfioPF, 0).Trust)
			u.pf.ResetCalls()

			dir := tc.stateDir(u)
			conf := `{"cniVersion":"1.1.0","name":"tenant-net","type":"sriov","stateDir":"` + dir + `","deviceID":"` + vfioVF + `","trust":"off","max_tx_rate":1}`
			err := u.addAs(conf, "c2", "tenant")
			require.Error(t, err)
			// With the node's stateDir enforced, another stateDir may be
			// refused for that first, with the same code.
			require.Equal(t, uint(types.ErrInvalidNetworkConfig), CNIError(err).Code, "%v", err)
			if dir == u.stateDir {
				require.ErrorContains(t, err, "deviceID 0000:86:00.1: pod default/tenant does not hold that VF (its VFs: none)")
				require.Equal(t, int32(2), k.lists.Load(), "one List per ADD")
			} else {
				require.Empty(t, ls(t, dir))
			}
			require.Empty(t, u.pf.Calls(), "the first attachment's VF settings stay")
			require.True(t, u.pf.Get(vfioPF, 0).Trust)

			// The same pod's second attachment of its VF, under another
			// container ID (a new sandbox while the old one holds it), is
			// busy.
			err = u.addAs(u.conf(`"trust":"on"`), "c3", "owner")
			require.ErrorIs(t, err, ErrBusy)
			require.Empty(t, u.pf.Calls())

			require.NoError(t, u.del(u.conf(`"trust":"on"`), "c1"))
			u.requireClean()
		})
	}
}

// With the check on, a deviceID needs the pod's name in CNI_ARGS: without
// it the ADD is refused before the kubelet is asked or anything changes,
// and the error says how to run without the kubelet.
func TestDeviceIDWithoutPodArgsRefused(t *testing.T) {
	u := newUnit(t)
	u.p.Node.DeviceIDCheck = DeviceIDCheckPodResources
	err := u.addAs(u.conf(`"trust":"on"`), "c1", "")
	require.Error(t, err)
	require.Equal(t, uint(types.ErrInvalidEnvironmentVariables), CNIError(err).Code)
	require.ErrorContains(t, err, "deviceID 0000:86:00.1: CNI_ARGS lack K8S_POD_NAMESPACE and K8S_POD_NAME")
	require.ErrorContains(t, err, `set "deviceIDCheck": "off" in the node's config`)
	u.requireNothingChanged()
}

// The kubelet not answering is a "try again later" (11), as for the
// resourceName lookup, and changes nothing.
func TestDeviceIDCheckKubeletDown(t *testing.T) {
	u := newUnit(t)
	u.p.Node.DeviceIDCheck, u.p.Node.PodResourcesSocket = DeviceIDCheckPodResources, filepath.Join(t.TempDir(), "kubelet.sock")
	u.p.NewPodResources = NewKubeletPodResources
	err := u.addAs(u.conf(""), "c1", "owner")
	require.Error(t, err)
	require.Equal(t, uint(types.ErrTryAgainLater), CNIError(err).Code)
	require.ErrorContains(t, err, "ask the kubelet whether pod default/owner holds VF 0000:86:00.1 (deviceID)")
	u.p.NewPodResources = func(string) PodResources { return failingPodResources{} }
	err = u.addAs(u.conf(""), "c1", "owner")
	require.Error(t, err)
	require.Equal(t, uint(types.ErrTryAgainLater), CNIError(err).Code)
	u.requireNothingChanged()
}

// deviceIDCheck "off" trusts deviceID, for a runtime without the kubelet:
// no pod in CNI_ARGS, the kubelet never asked (newUnit's PodResources
// fails the test when asked).
func TestDeviceIDCheckOffTrusts(t *testing.T) {
	u := newUnit(t)
	u.p.Node.DeviceIDCheck = DeviceIDCheckOff
	require.NoError(t, u.addAs(u.conf(`"trust":"on"`), "c1", ""))
	require.True(t, u.pf.Get(vfioPF, 0).Trust)
	require.NoError(t, u.del(u.conf(`"trust":"on"`), "c1"))
	u.requireClean()
}

// The VF the pod holds passes: of the conf's resourceName, of any resource
// without one, or in the pod's claim of fastpath's DRA driver (Multus
// passes the claim's VF as deviceID), with a resourceName the pod has no
// device of (a limit the scheduler turned into a claim) or without one.
// tellDRA reads what the check asked: one List per ADD.
func TestDeviceIDHeldAccepted(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		pod         *podresourcesapi.PodResources
	}{
		{"resourceName", `"resourceName":"mellanox.com/vfio"`, podWith("default", "owner", vfio("0000:86:00.2", vfioVF))},
		{"any resource", "", podWith("default", "owner", vfio(vfioVF))},
		{"DRA claim", "", withDRA(podWith("default", "owner"), vfioVF)},
		{"DRA claim, extended resource", `"resourceName":"mellanox.com/mlnx_sriov_rdma"`, withDRA(podWith("default", "owner"), "0000:86:00.2", vfioVF)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := newUnit(t)
			k := u.checked(podWith("default", "other", vfio("0000:86:00.2")), tc.pod)
			// A DRA driver socket that exists: tellDRA looks whether the
			// VF is the driver's (it then fails to send, with a warning).
			sock := filepath.Join(t.TempDir(), "dra.sock")
			require.NoError(t, os.WriteFile(sock, nil, 0o600))
			u.p.Node.DRASocket = sock
			conf := u.conf(`"trust":"on"` + prefixComma(tc.extra))
			require.NoError(t, u.addAs(conf, "c1", "owner"))
			require.True(t, u.pf.Get(vfioPF, 0).Trust)
			require.Equal(t, int32(1), k.lists.Load(), "one List per ADD")
			require.NoError(t, u.del(conf, "c1"))
			u.requireClean()
		})
	}
}

// BenchmarkDeviceIDCheck is what the deviceID check adds to an ADD: one
// PodResources List over a unix socket (dial, call, close) against a
// gRPC server that lists pods pods, as a kubelet with that many pods
// does, each with two containers, one holding a VF and a GPU of device
// plugins, every fourth pod a claim of fastpath's DRA driver; the pod
// asked about is listed last. Besides ns/op (wall time, which a loaded
// machine stretches) it reports cpu-µs/op: the process's user and system
// CPU time per check, the client's and the server's (the kubelet's part)
// together.
func BenchmarkDeviceIDCheck(b *testing.B) {
	for _, pods := range []int{10, 110, 250} {
		b.Run(fmt.Sprintf("pods=%d", pods), func(b *testing.B) {
			k := &kubelet{}
			for i := range pods {
				p := podWith("default", fmt.Sprintf("pod-%d", i),
					vfio(fmt.Sprintf("0000:%02x:%02x.%d", 0x18+i/64, i/8%8, i%8)),
					&podresourcesapi.ContainerDevices{ResourceName: "nvidia.com/gpu", DeviceIds: []string{fmt.Sprintf("GPU-%08x-0000-0000-0000-000000000000", i)}})
				if i%4 == 0 {
					withDRA(p, fmt.Sprintf("0000:%02x:%02x.%d", 0x86+i/64, i/8%8, i%8))
				}
				k.pods = append(k.pods, p)
			}
			last := k.pods[pods-1]
			vf := last.Containers[1].Devices[0].DeviceIds[0]
			p := &Plugin{Node: NodeConfig{DeviceIDCheck: DeviceIDCheckPodResources, PodResourcesSocket: serveKubelet(b, k)},
				NewPodResources: NewKubeletPodResources}
			c := &NetConf{DeviceID: vf}
			ctx := context.Background()
			b.ReportAllocs()
			before := cpuTime(b)
			for b.Loop() {
				if _, _, err := p.checkDeviceID(ctx, c, vf, "default", last.Name); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64((cpuTime(b)-before).Microseconds())/float64(b.N), "cpu-µs/op")
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
