package plugin

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// The first memory release after registration waits for a pause in the
// Allocates (a restarted plugin is sent every waiting pod's right away),
// and comes anyway once releaseMaxWait has passed.
func TestFirstReleaseWaitsForAllocatePause(t *testing.T) {
	quiet, maxWait := releaseQuiet, releaseMaxWait
	t.Cleanup(func() { releaseQuiet, releaseMaxWait = quiet, maxWait })
	releaseQuiet, releaseMaxWait = 100*time.Millisecond, time.Hour

	released := make(chan time.Time, 16)
	h := newHarness(t, func(o *Options) { o.ReleaseMemory = func() { released <- time.Now() } }, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	rails := h.client("mellanox.com_rails.sock")
	req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:40:00.1"}}}}

	// Allocates every 20 ms for five quiet periods: no release.
	var last time.Time
	for end := time.Now().Add(5 * releaseQuiet); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		_, err := rails.Allocate(context.Background(), req)
		require.NoError(t, err)
		last = time.Now()
		select {
		case at := <-released:
			t.Fatalf("memory released %v after registration, while Allocates came every 20 ms", at.Sub(h.m.registeredAt))
		default:
		}
	}
	// Then none: the release comes a quiet period after the last.
	select {
	case at := <-released:
		require.GreaterOrEqual(t, at.Sub(last), releaseQuiet-10*time.Millisecond, "released before a quiet period passed")
	case <-time.After(5 * time.Second):
		t.Fatal("no memory release within 5 s of the last Allocate")
	}
	select {
	case <-released:
		t.Fatal("the first round released twice")
	case <-time.After(3 * releaseQuiet):
	}
}

func TestFirstReleaseNotPutOffPastMaxWait(t *testing.T) {
	quiet, maxWait := releaseQuiet, releaseMaxWait
	t.Cleanup(func() { releaseQuiet, releaseMaxWait = quiet, maxWait })
	releaseQuiet, releaseMaxWait = time.Hour, 300*time.Millisecond

	released := make(chan time.Time, 16)
	h := newHarness(t, func(o *Options) { o.ReleaseMemory = func() { released <- time.Now() } }, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	rails := h.client("mellanox.com_rails.sock")
	_, err := rails.Allocate(context.Background(), &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: []string{"0000:40:00.1"}}}})
	require.NoError(t, err)
	select {
	case at := <-released:
		require.GreaterOrEqual(t, at.Sub(h.m.registeredAt), releaseMaxWait-10*time.Millisecond)
	case <-time.After(5 * time.Second):
		t.Fatal("no memory release within 5 s although releaseMaxWait is 300 ms")
	}
}
