package plugin

import (
	"context"
	"errors"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/kubeletstub"
)

// A VF whose netdev left the host netns is healthy while a live pod holds
// it, by the kubelet's PodResources, and unhealthy once no pod does — not
// forever healthy because it was allocated once.
func TestHealthFollowsPodResources(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pod-resources.sock")
	pr := kubeletstub.NewPodResources(sock)
	require.NoError(t, pr.Start())
	t.Cleanup(pr.Stop)
	h := newHarness(t, func(o *Options) { o.PodResources = KubeletPodResources{Socket: sock} }, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	rails := h.client("mellanox.com_rails.sock")
	w := h.watch(rails)
	require.Len(t, w.next().Devices, 32)

	// The kubelet gives 0000:4f:00.1 to a pod; its CNI moves the netdev.
	_, err := rails.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:4f:00.1"}}}})
	require.NoError(t, err)
	pr.Set(kubeletstub.Pod("default", "train", "mellanox.com/rails", "0000:4f:00.1"))
	h.links.C <- LinkEvent{Name: "ibp79s0v0", Deleted: true}
	// The next change proves the event was processed without an update.
	h.links.C <- LinkEvent{Name: "ibp94s0", Up: false}
	hl := health(w.next())
	require.Equal(t, pluginapi.Healthy, hl["0000:4f:00.1"], "held by a live pod")
	require.Equal(t, pluginapi.Unhealthy, hl["0000:5e:00.1"])

	// The pod is gone but the netdev did not come back (it went
	// elsewhere): at the next look the VF is unhealthy, although this
	// plugin once allocated it.
	pr.Set()
	h.links.C <- LinkEvent{Name: "ibp94s0", Up: true}
	hl = health(w.next())
	require.Equal(t, pluginapi.Unhealthy, hl["0000:4f:00.1"], "no live pod holds it")
	require.Equal(t, pluginapi.Healthy, hl["0000:5e:00.1"])

	// Another pod's VF, never allocated by this process (the plugin
	// restarted): the kubelet's word is what counts.
	pr.Set(kubeletstub.Pod("default", "old", "mellanox.com/rails", "0000:9a:00.2"))
	h.links.C <- LinkEvent{Name: "ibp154s0v1", Deleted: true}
	h.links.C <- LinkEvent{Name: "ibp79s0v0", Up: true} // back on the host
	hl = health(w.next())
	require.Equal(t, pluginapi.Healthy, hl["0000:9a:00.2"])
	require.Equal(t, pluginapi.Healthy, hl["0000:4f:00.1"])
}

// Without the kubelet's answer the Allocate calls seen decide, until the
// VF's netdev comes back to the host netns.
func TestHealthWithoutPodResources(t *testing.T) {
	h := newHarness(t, func(o *Options) {
		o.PodResources = KubeletPodResources{Socket: filepath.Join(t.TempDir(), "none.sock")}
	}, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	rails := h.client("mellanox.com_rails.sock")
	w := h.watch(rails)
	require.Len(t, w.next().Devices, 32)
	_, err := rails.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{
		{DevicesIds: []string{"0000:4f:00.1"}}}})
	require.NoError(t, err)
	h.links.C <- LinkEvent{Name: "ibp79s0v0", Deleted: true}
	h.links.C <- LinkEvent{Name: "ibp94s0", Up: false}
	require.Equal(t, pluginapi.Healthy, health(w.next())["0000:4f:00.1"], "allocated, gone into its pod")
	h.links.C <- LinkEvent{Name: "ibp79s0v0", Up: true}
	h.links.C <- LinkEvent{Name: "ibp94s0", Up: true}
	require.Equal(t, pluginapi.Healthy, health(w.next())["0000:4f:00.1"])
	// Back on the host, the allocation is over: leaving again is a fault.
	h.links.C <- LinkEvent{Name: "ibp79s0v0", Deleted: true}
	require.Equal(t, pluginapi.Unhealthy, health(w.next())["0000:4f:00.1"])
}

func TestKubeletPodResourcesHeld(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "pr.sock")
	_, err := KubeletPodResources{Socket: sock}.Held(context.Background(), map[string]bool{"a/b": true})
	require.True(t, errors.Is(err, ErrNoPodResources), err)
	pr := kubeletstub.NewPodResources(sock)
	require.NoError(t, pr.Start())
	t.Cleanup(pr.Stop)
	pr.Set(kubeletstub.Pod("ns", "p1", "a/b", "x", "y"), kubeletstub.Pod("ns", "p2", "c/d", "z"))
	held, err := KubeletPodResources{Socket: sock}.Held(context.Background(), map[string]bool{"a/b": true})
	require.NoError(t, err)
	require.Equal(t, map[string]bool{"x": true, "y": true}, held)
}
