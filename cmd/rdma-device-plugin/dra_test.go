//go:build !nodra

package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/dra"
)

func defaultDRAFlags() draFlags {
	return draFlags{nodeName: os.Getenv("NODE_NAME"), pluginDir: dra.DefaultPluginDir, registryDir: dra.DefaultRegistryDir, cdiDir: dra.DefaultCDIDir}
}

func TestDRAFlags(t *testing.T) {
	f, err := parseServeFlags([]string{"--kubeconfig=/etc/kubernetes/kubelet.conf", "--node-name=gpu-17",
		"--dra-plugin-dir=/var/lib/k/plugins/rdma.fastpath-k8s.io", "--dra-registry-dir=/var/lib/k/plugins_registry", "--dra-cdi-dir=/etc/cdi"}, io.Discard)
	require.NoError(t, err)
	require.Equal(t, draFlags{kubeconfig: "/etc/kubernetes/kubelet.conf", nodeName: "gpu-17", pluginDir: "/var/lib/k/plugins/rdma.fastpath-k8s.io",
		registryDir: "/var/lib/k/plugins_registry", cdiDir: "/etc/cdi"}, f.dra)
}

// A config that serves a pool through DRA needs the API server: outside a
// pod and without --kubeconfig the daemon says so instead of serving the
// pool by neither API.
func TestServeDRANeedsTheAPIServer(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	err := run(context.Background(), []string{"--host-root", fixture("dgx-h100"), "--config", config("dra.json"),
		"--kubelet-dir", t.TempDir(), "--metrics-addr", "", "--node-name", "n"}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "the config serves pools through DRA, which needs the API server: run in a pod with a service account or pass --kubeconfig")

	err = run(context.Background(), []string{"--host-root", fixture("dgx-h100"), "--config", config("dra.json"),
		"--kubelet-dir", t.TempDir(), "--metrics-addr", "", "--node-name", "", "--kubeconfig", "/nonexistent/kubeconfig"}, io.Discard, io.Discard)
	require.ErrorContains(t, err, "/nonexistent/kubeconfig")
}

// One daemon, both APIs, one scan: the pool marked for DRA registers with
// the kubelet as a DRA plugin and gets no device plugin socket; the
// shared pool stays a device plugin resource.
func TestServeBothAPIs(t *testing.T) {
	base := t.TempDir()
	kubeconfig := filepath.Join(base, "kubeconfig")
	// An API server that is not there: the DRA plugin still registers
	// with the kubelet; publishing retries in the background.
	require.NoError(t, os.WriteFile(kubeconfig, []byte(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: c, context: {cluster: c, user: u}}]
current-context: c
`), 0o600))
	pluginDir, registryDir := filepath.Join(base, "plugin"), filepath.Join(base, "registry")
	for _, d := range []string{pluginDir, registryDir} {
		require.NoError(t, os.MkdirAll(d, 0o755))
	}
	d := startDaemonWith(t, daemonOpts{host: fixture("dgx-h100"), config: config("dra.json"), dra: true, args: []string{
		"--kubeconfig", kubeconfig, "--node-name", "node-a", "--dra-plugin-dir", pluginDir,
		"--dra-registry-dir", registryDir, "--dra-cdi-dir", filepath.Join(base, "cdi")}})
	d.registrations("rdma/hca_shared_devices_a")
	// The manager starts every server it serves before it registers any.
	require.NoFileExists(t, filepath.Join(d.dir, "mellanox.com_mlnx_sriov_rdma.sock"), "a DRA pool must not also be a device plugin resource")

	sock := filepath.Join(registryDir, dra.DriverName+"-reg.sock")
	require.Eventually(t, func() bool { _, err := os.Stat(sock); return err == nil }, 10*time.Second, 10*time.Millisecond, "no DRA registration socket; log:\n%s", d.log.String())
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := registerapi.NewRegistrationClient(conn).GetInfo(ctx, &registerapi.InfoRequest{})
	require.NoError(t, err)
	require.Equal(t, dra.DriverName, info.Name)
	require.Equal(t, filepath.Join(pluginDir, "dra.sock"), info.Endpoint)

	// The DRA build serves client_golang's process and Go collectors too.
	code, m := d.get("/metrics")
	require.Equal(t, 200, code, m)
	require.Regexp(t, `(?m)^process_resident_memory_bytes [0-9.e+]+$`, m)
	require.Regexp(t, `(?m)^go_goroutines [0-9]+$`, m)
	require.Contains(t, m, `fastpath_device_plugin_devices{resource="rdma/hca_shared_devices_a"}`)

	d.stop()
	require.NoFileExists(t, sock, "the registration socket goes with the plugin")
}

// The lean build (-tags nodra, the default DaemonSet's binary) links no
// Kubernetes API client; a config that serves a pool through DRA is a
// startup error there that names the pool and the binary to run instead.
func TestLeanBuildHasNoDRA(t *testing.T) {
	bin := binary(t)
	deps, err := exec.Command("go", "list", "-tags", "nodra", "-deps", ".").Output()
	require.NoError(t, err)
	for _, pkg := range strings.Fields(string(deps)) {
		require.False(t, strings.HasPrefix(pkg, "k8s.io/client-go/") || strings.HasPrefix(pkg, "k8s.io/dynamic-resource-allocation/"), "the lean build links %s", pkg)
	}

	v, err := exec.Command(bin, "--version").Output()
	require.NoError(t, err)
	require.Contains(t, string(v), ", without DRA\n")

	out, err := exec.Command(bin, "--host-root", fixture("dgx-h100"), "--config", config("dra.json"),
		"--kubelet-dir", t.TempDir(), "--metrics-addr", "").CombinedOutput()
	require.Error(t, err)
	require.Contains(t, string(out), `pool mellanox.com/mlnx_sriov_rdma is served by DRA ("servedBy": "dra"), but this build has no DRA: run rdma-device-plugin-dra (deployments/components/dra)`)
}
