package doctor

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// listen serves a unix socket at path until the test ends: with a device
// plugin gRPC server when plugin is set, else a bare listener (kubelet.sock).
func listen(t *testing.T, path string, plugin bool) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	if !plugin {
		t.Cleanup(func() { l.Close() })
		go func() {
			for {
				c, err := l.Accept()
				if err != nil {
					return
				}
				c.Close()
			}
		}()
		return
	}
	s := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(s, optionsOnly{})
	go func() { _ = s.Serve(l) }()
	t.Cleanup(s.Stop)
}

// optionsOnly is a device plugin that answers GetDevicePluginOptions.
type optionsOnly struct {
	pluginapi.UnimplementedDevicePluginServer
}

func (optionsOnly) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{GetPreferredAllocationAvailable: true}, nil
}

// stale leaves a socket file nobody listens on, as a killed process does.
func stale(t *testing.T, path string) {
	t.Helper()
	l, err := net.Listen("unix", path)
	require.NoError(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	require.NoError(t, l.Close())
}

func TestKubelet(t *testing.T) {
	root := newHost(t, "generate")
	cfg := config(t, genConfig)
	run := func(dir string) *Report { return Run(Options{HostRoot: root, Config: cfg, KubeletDir: dir}) }

	t.Run("no such directory", func(t *testing.T) {
		requireCheck(t, run(filepath.Join(t.TempDir(), "nope")), "kubelet", Fail, "--root-dir", "--kubelet-dir")
	})
	t.Run("no kubelet, no plugin", func(t *testing.T) {
		r := run(t.TempDir())
		requireCheck(t, r, "kubelet", Fail, "kubelet.sock does not exist")
		requireCheck(t, r, "kubelet", Fail, "mellanox.com/rails", "mellanox.com_rails.sock does not exist", "logs ds/rdma-device-plugin")
	})
	t.Run("stale sockets", func(t *testing.T) {
		dir := t.TempDir()
		stale(t, filepath.Join(dir, "kubelet.sock"))
		stale(t, filepath.Join(dir, "mellanox.com_rails.sock"))
		r := run(dir)
		requireCheck(t, r, "kubelet", Fail, "kubelet.sock", "connection refused", "systemctl status kubelet")
		requireCheck(t, r, "kubelet", Fail, "mellanox.com/rails", "does not answer", "connection refused")
	})
	t.Run("both answer, no checkpoint", func(t *testing.T) {
		dir := t.TempDir()
		listen(t, filepath.Join(dir, "kubelet.sock"), false)
		listen(t, filepath.Join(dir, "mellanox.com_rails.sock"), true)
		r := run(dir)
		requireCheck(t, r, "kubelet", OK, "kubelet.sock", "answers")
		requireCheck(t, r, "kubelet", OK, "mellanox.com/rails", "no kubelet_internal_checkpoint")
		requireNo(t, r, "kubelet", Fail)
	})
	t.Run("registered per the checkpoint", func(t *testing.T) {
		dir := t.TempDir()
		listen(t, filepath.Join(dir, "kubelet.sock"), false)
		listen(t, filepath.Join(dir, "mellanox.com_rails.sock"), true)
		// As the kubelet (>= 1.20) writes it.
		cp := `{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"mellanox.com/rails",` +
			`"DeviceIDs":{"0":["0000:10:00.1"]},"AllocResp":"e30="}],` +
			`"RegisteredDevices":{"mellanox.com/rails":["0000:10:00.1","0000:10:00.2","0000:11:00.1","0000:11:00.2"]}},"Checksum":1}`
		require.NoError(t, os.WriteFile(filepath.Join(dir, checkpointFile), []byte(cp), 0o600))
		r := run(dir)
		requireCheck(t, r, "kubelet", OK, "mellanox.com/rails", "registered: 4 devices healthy", "1 held by pods")
	})
	t.Run("every device held", func(t *testing.T) {
		dir := t.TempDir()
		listen(t, filepath.Join(dir, "kubelet.sock"), false)
		listen(t, filepath.Join(dir, "mellanox.com_rails.sock"), true)
		cp := `{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"mellanox.com/rails","DeviceIDs":{"0":["0000:10:00.1","0000:10:00.2"],"1":["0000:11:00.1"]}}],` +
			`"RegisteredDevices":{"mellanox.com/rails":["0000:10:00.1","0000:10:00.2","0000:11:00.1"]}},"Checksum":1}`
		require.NoError(t, os.WriteFile(filepath.Join(dir, checkpointFile), []byte(cp), 0o600))
		requireCheck(t, run(dir), "kubelet", Warn, "mellanox.com/rails", "every one of its 3 healthy devices is held", "Pending")
	})
	t.Run("answers but not registered", func(t *testing.T) {
		dir := t.TempDir()
		listen(t, filepath.Join(dir, "kubelet.sock"), false)
		listen(t, filepath.Join(dir, "mellanox.com_rails.sock"), true)
		require.NoError(t, os.WriteFile(filepath.Join(dir, checkpointFile), []byte(`{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{}},"Checksum":0}`), 0o600))
		requireCheck(t, run(dir), "kubelet", Warn, "mellanox.com/rails", "does not list")
	})
	t.Run("a VF without netdev held by a pod is fine", func(t *testing.T) {
		// The CNI moved 0000:10:00.1's netdev into the pod: the node's
		// sysfs shows it without one.
		root := newHost(t, "generate", func(root string) error {
			if err := os.Remove(filepath.Join(root, "sys/class/net/ibp16s0v0")); err != nil {
				return err
			}
			return os.RemoveAll(filepath.Join(root, "sys/bus/pci/devices/0000:10:00.1/net"))
		})
		dir := t.TempDir()
		r := Run(Options{HostRoot: root, Config: cfg, KubeletDir: dir})
		requireCheck(t, r, "sriov", Warn, "0000:10:00.1", "no netdev")
		cp := `{"Data":{"PodDeviceEntries":[{"PodUID":"u1","ContainerName":"c","ResourceName":"mellanox.com/rails","DeviceIDs":["0000:10:00.1"]}],"RegisteredDevices":{}},"Checksum":1}`
		require.NoError(t, os.WriteFile(filepath.Join(dir, checkpointFile), []byte(cp), 0o600))
		r = Run(Options{HostRoot: root, Config: cfg, KubeletDir: dir})
		requireNo(t, r, "sriov", Warn)
	})
}
