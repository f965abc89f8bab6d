package plugin

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	"tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// A copy of the DGX fixture served through the real Source: the test
// changes its /dev as a driver reload does.
func devHarness(t *testing.T) (*harness, string) {
	t.Helper()
	host := t.TempDir()
	require.NoError(t, fixture.Write(host, "dgx-h100"))
	cfg := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(cfg, []byte(`{"periodicUpdateInterval": 0,
		"resourceList": [{"resourceName": "rails", "selectors": {"devices": ["101e"]}}]}`), 0o644))
	src, err := NewSource(cfg, nic.NewScanner(host), slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	h := newHarness(t, func(o *Options) { o.Scan = src.Scan; o.HostRoot = host })
	return h, host
}

// Char devices that go from /dev (a driver reload, a stale mount) make
// their functions Unhealthy and fail the liveness check, without waiting
// for a periodic rescan; they coming back heals both.
func TestCharDevicesGone(t *testing.T) {
	h, host := devHarness(t)
	// A kernel's class directories also hold entries that are no char
	// device, with no node under /dev/infiniband: the probe skips them.
	for _, e := range []string{"infiniband_verbs/abi_version", "infiniband_mad/abi_version", "infiniband_verbs/uverbs"} {
		require.NoError(t, os.WriteFile(filepath.Join(host, "sys", "class", e), []byte("6\n"), 0o644))
	}
	h.run()
	h.registered("mellanox.com/rails")
	w := h.watch(h.client("mellanox.com_rails.sock"))
	require.Len(t, w.next().Devices, 32)
	require.Eventually(t, func() bool { return h.m.Healthy() == nil && h.m.Ready() == nil }, 5*time.Second, 10*time.Millisecond)

	// One VF's uverbs goes.
	ib := filepath.Join(host, "dev", "infiniband")
	require.NoError(t, os.Rename(filepath.Join(ib, "uverbs14"), filepath.Join(host, "uverbs14.away")))
	hl := health(w.next())
	require.Equal(t, pluginapi.Unhealthy, hl["0000:18:00.1"])
	require.Equal(t, pluginapi.Healthy, hl["0000:18:00.2"])
	require.ErrorContains(t, h.m.Healthy(), "sysfs lists RDMA char devices that "+ib+" does not have: uverbs14")
	require.NoError(t, os.Rename(filepath.Join(host, "uverbs14.away"), filepath.Join(ib, "uverbs14")))
	require.Equal(t, pluginapi.Healthy, health(w.next())["0000:18:00.1"])
	require.NoError(t, h.m.Healthy())

	// The whole directory goes, as devtmpfs removes it when the modules
	// unload, and comes back.
	require.NoError(t, os.Rename(ib, filepath.Join(host, "ib.away")))
	for id, v := range health(w.next()) {
		require.Equal(t, pluginapi.Unhealthy, v, id)
	}
	err := h.m.Healthy()
	require.Regexp(t, `does not have: issm0, issm1, issm10, issm11, issm12 and [0-9]+ more`, err.Error())
	require.NoError(t, os.Rename(filepath.Join(host, "ib.away"), ib))
	for id, v := range health(w.next()) {
		require.Equal(t, pluginapi.Healthy, v, id)
	}
	require.NoError(t, h.m.Healthy())
}

// Readiness waits for every pool to register; liveness fails while none
// is, and again when the kubelet goes.
func TestProbes(t *testing.T) {
	h := newHarness(t, nil, dgxPools(t)...)
	h.stub.Stop()
	m, err := NewManager(h.opts)
	require.NoError(t, err)
	require.ErrorContains(t, m.Ready(), "starting")
	require.ErrorContains(t, m.Healthy(), "starting")
	require.Equal(t, "starting", ProbeReason(m.Ready()))
	require.Equal(t, "starting", ProbeReason(m.Healthy()))
	h.run()
	require.Eventually(t, func() bool {
		err := h.m.Ready()
		return err != nil && err.Error() != "starting"
	}, 5*time.Second, 10*time.Millisecond)
	require.ErrorContains(t, h.m.Ready(), "0 of 2 pools registered with the kubelet")
	require.ErrorContains(t, h.m.Healthy(), "none of 2 pools is registered with the kubelet")
	require.Equal(t, "not-registered", ProbeReason(h.m.Ready()))
	require.Equal(t, "not-registered", ProbeReason(h.m.Healthy()))

	require.NoError(t, h.stub.Start())
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	require.Eventually(t, func() bool { return h.m.Ready() == nil && h.m.Healthy() == nil }, 5*time.Second, 10*time.Millisecond)

	h.stub.Stop()
	require.Eventually(t, func() bool { return h.m.Healthy() != nil }, 5*time.Second, 10*time.Millisecond)
	_, err = h.client("mellanox.com_rails.sock").GetDevicePluginOptions(context.Background(), &pluginapi.Empty{})
	require.Error(t, err, "no kubelet, no server")
}

// What a killed run left (device-info files, the spec of a pool since
// dropped, the temporary files of writes cut short) is cleaned by the
// next; other files are not touched, nor is the staging directory left
// after a stop.
func TestLeftoversRemoved(t *testing.T) {
	dir := t.TempDir()
	cdiDir := filepath.Join(dir, "cdi")
	devinfo := filepath.Join(dir, "devinfo")
	staging := filepath.Join(cdiDir, cdiStaging)
	require.NoError(t, os.MkdirAll(staging, 0o755))
	require.NoError(t, os.MkdirAll(devinfo, 0o755))
	write := func(p string) {
		require.NoError(t, os.WriteFile(p, []byte("{}"), 0o444))
	}
	leftInfo := DevInfoPath(devinfo, "mellanox.com", "rails", "0000:18:00.3")
	mine := []string{
		leftInfo,
		// atomicfile's temporary file, killed before its rename
		filepath.Join(devinfo, "."+filepath.Base(leftInfo)+".tmp-1234"),
		CDISpecPath(cdiDir, "mellanox.com", "gone"),
		// the CDI library's temporary file, and a spec killed between
		// its two renames
		filepath.Join(staging, "spec.1234.tmp"),
		CDISpecPath(staging, "mellanox.com", "rails"),
	}
	foreign := []string{
		DevInfoPath(devinfo, "example.com", "other", "0000:18:00.3"),
		// another pool whose name starts as a served one's
		DevInfoPath(devinfo, "mellanox.com", "rails-b", "0000:18:00.3"),
		filepath.Join(devinfo, "."+filepath.Base(DevInfoPath(devinfo, "mellanox.com", "rails-b", "0000:18:00.3"))+".tmp-1"),
		filepath.Join(cdiDir, "vendor-other.json"),
		// another vendor's write in flight
		filepath.Join(cdiDir, "spec.5678.tmp"),
	}
	for _, p := range append(slices.Clone(mine), foreign...) {
		write(p)
	}
	h := newHarness(t, func(o *Options) { o.CDIDir = cdiDir; o.DevInfoDir = devinfo }, dgxPools(t)...)
	h.run()
	h.registered("mellanox.com/rails", "mellanox.com/storage")
	for _, p := range mine {
		_, err := os.Stat(p)
		require.ErrorIs(t, err, os.ErrNotExist, p)
	}
	for _, p := range append(foreign, CDISpecPath(cdiDir, "mellanox.com", "rails")) {
		_, err := os.Stat(p)
		require.NoError(t, err, p)
	}
	spec, err := cdi.ReadSpec(CDISpecPath(cdiDir, "mellanox.com", "rails"), 0)
	require.NoError(t, err)
	require.Equal(t, "mellanox.com/rails", spec.Kind)

	require.NoError(t, h.stop())
	_, err = os.Stat(staging)
	require.ErrorIs(t, err, os.ErrNotExist, "a stop leaves no staging directory")
}
