package dra_test

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
	"github.com/fastpath-k8s/fastpath/internal/netdata"
)

// send posts a network data request to the driver's socket, as the CNI
// does after its ADD.
func send(t testing.TB, e *testEnv, req netdata.Request) (*netdata.Response, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return netdata.Send(ctx, dra.NetDataSocket(e.pluginDir), req)
}

// attached is what the CNI tells of the VF at addr attached as net1 to
// pod-<pod>.
func attached(addr, pod string, ips ...string) netdata.Request {
	return netdata.Request{PCIAddress: addr, PodNamespace: "default", PodName: "pod-" + pod, PodUID: pod,
		InterfaceName: "net1", HardwareAddress: "02:00:00:0a:00:05", IPs: ips}
}

// The CNI tells the driver, after its ADD, the VF's interface in the pod:
// the metadata file the container gets then has it as the VF's
// networkData (the request's other VF keeps none), its generation bumped;
// the checkpoint keeps it, so that a restarted driver's Prepare, from the
// checkpoint or from a scan that still has the VF, writes it again.
func TestNetworkDataInDeviceMetadata(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	d := e.start(t)
	k := e.register(t)
	sock := dra.NetDataSocket(e.pluginDir)
	fi, err := os.Stat(sock)
	require.NoError(t, err)
	require.Equal(t, os.ModeSocket|0o600, fi.Mode()&(os.ModeSocket|os.ModePerm), "root's only")
	require.Equal(t, netdata.DefaultSocket, dra.NetDataSocket(dra.DefaultPluginDir), "the CNI's default")

	c := e.reserve(t, e.claim(t, "train", vf("nic", rail0vf0), vf("nic", rail1vf0)), "pod-0")
	id := metadataIDs(k.prepare(t, c)[string(c.UID)])
	require.Len(t, id, 1)
	const path = "/var/run/kubernetes.io/dra-device-attributes/resourceclaims/train/nic/rdma.fastpath-k8s.io-metadata.json"
	_, before, _ := mountedMetadata(t, e, id[0], path)
	require.EqualValues(t, 1, before.Generation)

	resp, err := send(t, e, attached(rail1vf0, "pod-0", "10.56.217.5/24", "fd00::5/64"))
	require.NoError(t, err)
	require.Equal(t, &netdata.Response{Claim: "default/train", Request: "nic"}, resp)
	want := &resourceapi.NetworkDeviceData{InterfaceName: "net1", HardwareAddress: "02:00:00:0a:00:05", IPs: []string{"10.56.217.5/24", "fd00::5/64"}}
	check := func(what string, generation int64) {
		t.Helper()
		_, md, _ := mountedMetadata(t, e, id[0], path)
		require.Equal(t, generation, md.Generation, what)
		devs := md.Requests[0].Devices
		require.Len(t, devs, 2, what)
		require.Equal(t, dra.DeviceName(rail0vf0), devs[0].Name)
		require.Nil(t, devs[0].NetworkData, "%s: the request's other VF", what)
		require.Equal(t, dra.DeviceName(rail1vf0), devs[1].Name)
		require.Equal(t, want, devs[1].NetworkData, what)
		require.Equal(t, before.Requests[0].Devices[1].Attributes, devs[1].Attributes, "%s: attributes unchanged", what)
	}
	check("after the ADD", 2)

	// Restarted with the VF still in the scan, the kubelet preparing the
	// claim again: the helper writes the file anew, with the network data.
	d.Stop()
	require.NoFileExists(t, sock, "removed at stop")
	d = e.start(t)
	k = e.register(t)
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)
	check("prepared again after a restart", 1)

	// Restarted with the VF gone from the scan (it is in the pod): the
	// Prepare answered from the checkpoint keeps it too.
	d.Stop()
	e.scan = withoutVF(e.scan, rail1vf0)
	e.start(t)
	k = e.register(t)
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)
	check("prepared from the checkpoint", 1)

	// A later ADD (a new sandbox) replaces it.
	_, err = send(t, e, attached(rail1vf0, "pod-0", "10.56.217.9/24"))
	require.NoError(t, err)
	want.IPs = []string{"10.56.217.9/24"}
	check("a second ADD", 2)
	require.Empty(t, k.unprepare(t, c)[string(c.UID)].Error)
	_, err = send(t, e, attached(rail1vf0, "pod-0", "10.56.217.9/24"))
	require.ErrorContains(t, err, "no claim prepared on node node-a holds VF "+rail1vf0)
}

// What the driver refuses, and why: a VF no prepared claim holds, a pod
// the claim is not reserved for (or in another namespace), a request it
// cannot publish. A pod the claim was reserved for after Prepare (the API
// server says so) is taken.
func TestNetworkDataRefused(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	k := e.register(t)
	c := e.reserve(t, e.claim(t, "shared", vf("vf", rail0vf0)), "pod-0")
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)

	otherNS := attached(rail0vf0, "pod-0")
	otherNS.PodNamespace = "kube-system"
	for _, tc := range []struct {
		name string
		req  netdata.Request
		want string
	}{
		{"unknown VF", attached(rail1vf0, "pod-0"), "no claim prepared on node node-a holds VF " + rail1vf0 + " (a VF of the device plugin"},
		{"another pod", attached(rail0vf0, "pod-9"), "VF " + rail0vf0 + " is prepared for claim [default/shared (shared-uid)], which is not reserved for pod default/pod-pod-9 (pod-9)"},
		{"another namespace", otherNS, "which is not reserved for pod kube-system/pod-pod-0"},
		{"no pod UID", attached(rail0vf0, ""), "podNamespace, podName and podUID must be set"},
		{"not CIDR", attached(rail0vf0, "pod-0", "10.56.217.5"), `ips[0] "10.56.217.5": want an address in CIDR form`},
		{"bad PCI address", attached("0000:18:00", "pod-0"), `pciAddress "0000:18:00" is not a PCI address`},
		{"bad interface", func() netdata.Request { r := attached(rail0vf0, "pod-0"); r.InterfaceName = "net/1"; return r }(), `interfaceName: "net/1" is not an interface name`},
		{"bad MAC", func() netdata.Request { r := attached(rail0vf0, "pod-0"); r.HardwareAddress = "zz"; return r }(), "hardwareAddress: address zz: invalid MAC address"},
	} {
		_, err := send(t, e, tc.req)
		require.ErrorContains(t, err, tc.want, tc.name)
		require.ErrorContains(t, err, "refused", tc.name)
	}
	meta := filepath.Join(e.pluginDir, "dra-device-metadata", "default_shared", "vf", "metadata.json")
	data, err := os.ReadFile(meta)
	require.NoError(t, err)
	require.NotContains(t, string(data), "networkData", "nothing refused was written")

	// The claim is shared, and pod-9 joined it after Prepare.
	e.reserve(t, c, "pod-0", "pod-9")
	_, err = send(t, e, attached(rail0vf0, "pod-9", "10.0.0.9/8"))
	require.NoError(t, err)
	data, err = os.ReadFile(meta)
	require.NoError(t, err)
	require.Contains(t, string(data), `"10.0.0.9/8"`)

	// No socket: the CNI is told so.
	_, err = netdata.Send(context.Background(), filepath.Join(t.TempDir(), "cni.sock"), attached(rail0vf0, "pod-0"))
	require.ErrorIs(t, err, netdata.ErrNoSocket)
}

// claimStatusDevices waits (up to 10 s) until the claim's status.devices
// satisfy ok and returns them.
func (e *testEnv) claimStatusDevices(t testing.TB, name string, ok func([]resourceapi.AllocatedDeviceStatus) bool) []resourceapi.AllocatedDeviceStatus {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := e.client.ResourceV1().ResourceClaims("default").Get(context.Background(), name, metav1GetOptions)
		require.NoError(t, err)
		if ok(c.Status.Devices) {
			return c.Status.Devices
		}
		if time.Now().After(deadline) {
			t.Fatalf("claim %s's status.devices never as wanted within 10 s (last: %+v)", name, c.Status.Devices)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The network data goes into the claim's status too (KEP-4817), applied
// by the driver as its own field manager: an entry per VF that has some,
// another driver's entry untouched.
func TestNetworkDataInClaimStatus(t *testing.T) {
	e := newTestEnv(t, fixtureRoot("dgx-h100"), "dra.json")
	e.start(t)
	k := e.register(t)
	c := e.reserve(t, e.claim(t, "train", result{"gpu.example.com", "gpu", "gpu-0"}, vf("nic", rail0vf0), vf("nic", rail1vf0)), "pod-0")
	gpu := resourceapi.AllocatedDeviceStatus{Driver: "gpu.example.com", Pool: testNode, Device: "gpu-0"}
	c.Status.Devices = []resourceapi.AllocatedDeviceStatus{gpu}
	c, err := e.client.ResourceV1().ResourceClaims("default").UpdateStatus(context.Background(), c, metav1UpdateOptions)
	require.NoError(t, err)
	require.Empty(t, k.prepare(t, c)[string(c.UID)].Error)

	entry := func(addr, ip string) resourceapi.AllocatedDeviceStatus {
		return resourceapi.AllocatedDeviceStatus{Driver: dra.DriverName, Pool: testNode, Device: dra.DeviceName(addr),
			NetworkData: &resourceapi.NetworkDeviceData{InterfaceName: "net1", HardwareAddress: "02:00:00:0a:00:05", IPs: []string{ip}}}
	}
	has := func(want ...resourceapi.AllocatedDeviceStatus) func([]resourceapi.AllocatedDeviceStatus) bool {
		return func(got []resourceapi.AllocatedDeviceStatus) bool {
			if len(got) != len(want) {
				return false
			}
			for _, w := range want {
				if !slices.ContainsFunc(got, func(g resourceapi.AllocatedDeviceStatus) bool { return reflect.DeepEqual(g, w) }) {
					return false
				}
			}
			return true
		}
	}
	_, err = send(t, e, attached(rail1vf0, "pod-0", "10.56.217.5/24"))
	require.NoError(t, err)
	e.claimStatusDevices(t, "train", has(gpu, entry(rail1vf0, "10.56.217.5/24")))
	_, err = send(t, e, attached(rail0vf0, "pod-0", "10.56.218.5/24"))
	require.NoError(t, err)
	e.claimStatusDevices(t, "train", has(gpu, entry(rail1vf0, "10.56.217.5/24"), entry(rail0vf0, "10.56.218.5/24")))
}
