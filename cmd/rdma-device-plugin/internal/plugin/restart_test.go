package plugin

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/rdma"
)

func openFDs(t testing.TB) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// settle waits (bounded) for the goroutine count to drop to at most n.
func settle(n int) int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := runtime.NumGoroutine()
		if g <= n || time.Now().After(deadline) {
			return g
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestKubeletRestart(t *testing.T) {
	h := newHarness(t, nil, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")

	// Warm up one restart so that lazily started goroutines exist.
	require.NoError(t, h.stub.Restart())
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	goroutines, fds := runtime.NumGoroutine(), openFDs(t)

	var worst time.Duration
	for i := 0; i < 100; i++ {
		start := time.Now()
		require.NoError(t, h.stub.Restart())
		regs := h.registered("mellanox.com/rails", "mellanox.com/storage")
		require.Equal(t, "mellanox.com_rails.sock", regs["mellanox.com/rails"].Endpoint)
		// A registration can race the restart's wipe of the directory;
		// the plugin then serves again and re-registers within the budget.
		require.Eventually(t, func() bool {
			for _, s := range []string{"mellanox.com_rails.sock", "mellanox.com_storage.sock"} {
				if _, err := os.Stat(filepath.Join(h.dir, s)); err != nil {
					return false
				}
			}
			return true
		}, time.Second, time.Millisecond)
		if d := time.Since(start); d > worst {
			worst = d
		}
	}
	require.Less(t, worst, time.Second, "re-registration took %v", worst)
	// The plugin serves after the last restart.
	r := h.watch(h.client("mellanox.com_rails.sock")).next()
	require.Len(t, r.Devices, 32)

	// Bounded: the watch added a stream and a client; allow those.
	require.LessOrEqual(t, settle(goroutines+12), goroutines+12, "goroutines leak across restarts")
	require.LessOrEqual(t, openFDs(t), fds+4, "fds leak across restarts")
}

func TestOwnSocketRemoved(t *testing.T) {
	h := newHarness(t, nil, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	require.NoError(t, os.Remove(filepath.Join(h.dir, "mellanox.com_storage.sock")))
	r, err := h.stub.WaitRegistration(time.Second)
	require.NoError(t, err)
	require.Equal(t, "mellanox.com/storage", r.Request.ResourceName)
	_, err = os.Stat(filepath.Join(h.dir, "mellanox.com_storage.sock"))
	require.NoError(t, err)
	// The new socket serves.
	_, err = h.client("mellanox.com_storage.sock").GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	require.NoError(t, err)
}

func TestSocketWaitsForKubelet(t *testing.T) {
	h := newHarness(t, nil, dgxPools(t)...)
	h.stub.Stop()
	h.run()
	// No kubelet.sock: no socket of ours either (the kubelet would wipe it).
	_, err := h.stub.WaitRegistration(300 * time.Millisecond)
	require.Error(t, err)
	_, err = os.Stat(filepath.Join(h.dir, "mellanox.com_rails.sock"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, h.stub.Start())
	h.registered("mellanox.com/rails", "mellanox.com/storage")
}

func TestRegistrationRetried(t *testing.T) {
	h := newHarness(t, nil, dgxPools(t)[:1]...)
	refused := make(chan struct{}, 1)
	h.stub.Validate = func(*pluginapi.RegisterRequest) error {
		select {
		case refused <- struct{}{}:
			return os.ErrPermission
		default:
			return nil
		}
	}
	h.run()
	h.registered("mellanox.com/rails")
	require.Len(t, refused, 1)
}

func TestMembershipAndConfigChange(t *testing.T) {
	pools := dgxPools(t)
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte("{}"), 0o644))
	h := newHarness(t, func(o *Options) { o.ConfigPath = cfg }, pools[0])
	h.run()
	h.registered("mellanox.com/rails")
	w := h.watch(h.client("mellanox.com_rails.sock"))
	require.Len(t, w.next().Devices, 32)

	// Fewer VFs and a new pool, applied when the config file changes.
	fewer := pools[0]
	fewer.Devices = fewer.Devices[:30]
	h.src.set(fewer, pools[1])
	require.NoError(t, os.WriteFile(cfg, []byte(`{"changed":true}`), 0o644))
	h.registered("mellanox.com/storage")
	require.Len(t, w.next().Devices, 30)

	// The rails pool goes away: its server stops and its socket goes.
	h.src.set(pools[1])
	require.NoError(t, os.WriteFile(cfg, []byte(`{"changed":2}`), 0o644))
	for range w.ch {
	}
	require.Eventually(t, func() bool {
		_, err := os.Stat(filepath.Join(h.dir, "mellanox.com_rails.sock"))
		return os.IsNotExist(err)
	}, 5*time.Second, 10*time.Millisecond)
}

// A config change while the plugin starts (after its first scan read the
// config, before Run) is answered: the watch was made before the scan.
func TestConfigChangeWhileStarting(t *testing.T) {
	pools := dgxPools(t)
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte("{}"), 0o644))
	h := newHarness(t, func(o *Options) { o.ConfigPath = cfg }, pools[0])
	w, err := NewWatch(h.opts)
	require.NoError(t, err)
	h.opts.Watch = w
	h.runAfter(func() {
		h.src.set(pools[0], pools[1])
		require.NoError(t, os.WriteFile(cfg, []byte(`{"changed":true}`), 0o644))
	})
	h.registered("mellanox.com/rails")
	h.registered("mellanox.com/storage")
	w.Close() // Run closed it already: a second Close does nothing
}

// NewWatch refuses a kubelet directory that is not there, saying what to
// mount, as Run did before the watch moved ahead of the first scan.
func TestWatchNeedsKubeletDir(t *testing.T) {
	_, err := NewWatch(Options{KubeletDir: filepath.Join(t.TempDir(), "missing"), HostRoot: t.TempDir()})
	require.ErrorContains(t, err, "mount the kubelet's device-plugins directory or set --kubelet-dir")
}

func TestPeriodicRescan(t *testing.T) {
	pools := dgxPools(t)
	h := newHarness(t, nil)
	h.src.scan = Scan{Pools: []pool.Pool{pools[0]}, RDMACM: rdma.RDMACMPath, Interval: 20 * time.Millisecond}
	h.run()
	h.registered("mellanox.com/rails")
	w := h.watch(h.client("mellanox.com_rails.sock"))
	require.Len(t, w.next().Devices, 32)
	fewer := pools[0]
	fewer.Devices = fewer.Devices[1:]
	h.src.set(fewer)
	r := w.next()
	require.Len(t, r.Devices, 31)
	require.Equal(t, "0000:18:00.2", r.Devices[0].ID)
}
