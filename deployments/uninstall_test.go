package deployments_test

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
)

// TestUninstall: the uninstall DaemonSet (uninstall/) runs on the device
// plugin's nodes with its image, namespace and ServiceAccount, reads the
// base's pool config, mounts read-write every node path fastpath's
// DaemonSet writes (with each component), and its command line is one the
// binary takes: on a node with nothing of fastpath's it is done at once.
func TestUninstall(t *testing.T) {
	m := render(t, "uninstall")
	require.Len(t, m.daemonSets, 1)
	require.Empty(t, m.namespaces, "the base's namespace: deleting it (delete -k deployments/) takes the uninstall too")
	require.Empty(t, m.configMaps, "the base's pool config")
	ds, base := m.daemonSets[0], render(t, ".").daemonSets[0]
	spec, bspec := &ds.Spec.Template.Spec, &base.Spec.Template.Spec
	require.Equal(t, base.Namespace, ds.Namespace)
	require.Equal(t, bspec.Affinity, spec.Affinity, "the device plugin's nodes")
	require.Equal(t, bspec.Tolerations, spec.Tolerations)
	require.Equal(t, bspec.ServiceAccountName, spec.ServiceAccountName)
	require.False(t, *spec.AutomountServiceAccountToken, "it asks the API server nothing")
	require.True(t, spec.HostNetwork, "the PFs' GUIDs are set in the node's network namespace")
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		require.Equal(t, bspec.Containers[0].Image, c.Image, "container %s: the release installed", c.Name)
		require.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy, c.Name)
		require.False(t, *c.SecurityContext.AllowPrivilegeEscalation, c.Name)
		require.False(t, *c.SecurityContext.Privileged, c.Name)
		require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem, c.Name)
		require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop, c.Name)
	}
	u := container(t, spec.InitContainers, "uninstall")
	require.Equal(t, []corev1.Capability{"NET_ADMIN"}, u.SecurityContext.Capabilities.Add, "the GUIDs of VFs made again, as components/provision")
	require.Equal(t, corev1.TerminationMessageReadFile, u.TerminationMessagePolicy)
	require.Contains(t, u.Command, "--report="+corev1.TerminationMessagePathDefault, "the report is the pod's status")
	require.Contains(t, u.Env, corev1.EnvVar{Name: "FASTPATH_HOST_ROOT", Value: "/host"})
	cfg := volume(t, spec, "config")
	require.Equal(t, volume(t, bspec, "config").ConfigMap.Name, cfg.ConfigMap.Name)

	// Every node path the device plugin's DaemonSet writes, with any
	// component, is below a read-write mount of the uninstall, at its
	// node path under /host.
	writable := map[string]string{} // node path -> mount path
	for _, vm := range u.VolumeMounts {
		if v := volume(t, spec, vm.Name); v.HostPath != nil && !vm.ReadOnly {
			require.Equal(t, "/host"+v.HostPath.Path, vm.MountPath, vm.Name)
			writable[v.HostPath.Path] = vm.MountPath
		}
	}
	for _, comps := range [][]string{nil, {"components/cdi"}, {provisionComponent}, {"components/dra"}} {
		plugin := render(t, ".")
		if comps != nil {
			plugin = renderWith(t, comps...)
		}
		ps := &plugin.daemonSets[0].Spec.Template.Spec
		for _, c := range append(slices.Clone(ps.InitContainers), ps.Containers...) {
			for _, vm := range c.VolumeMounts {
				v := volume(t, ps, vm.Name)
				if v.HostPath == nil || vm.ReadOnly {
					continue
				}
				require.True(t, slices.ContainsFunc(slices.Collect(maps.Keys(writable)), func(p string) bool {
					return v.HostPath.Path == p || strings.HasPrefix(v.HostPath.Path, p+"/")
				}), "%v: %s writes the node's %s, which the uninstall does not mount read-write", comps, c.Name, v.HostPath.Path)
			}
		}
	}

	// The command line, on a node without anything of fastpath's: done.
	host, report := t.TempDir(), filepath.Join(t.TempDir(), "termination-log")
	require.NoError(t, os.MkdirAll(filepath.Join(host, "opt", "cni", "bin"), 0o755))
	conf := filepath.Join(t.TempDir(), "config.json")
	cm, pc := poolConfig(t, loadManifests(t))
	require.NotEmpty(t, pc.Resources)
	require.NoError(t, os.WriteFile(conf, []byte(cm.Data["config.json"]), 0o644))
	args := slices.Clone(u.Command[1:])
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "--config="):
			require.Equal(t, "--config="+filepath.Join(cfgMount(t, u), "config.json"), a)
			args[i] = "--config=" + conf
		case strings.HasPrefix(a, "--report="):
			args[i] = "--report=" + report
		}
	}
	bin := filepath.Join(testbin.BuildWith(t, testbin.Flags{Tags: buildTags(false), Release: true}, pluginPkg), "rdma-device-plugin")
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "FASTPATH_HOST_ROOT="+host)
	out, err := cmd.Output()
	require.NoError(t, err, "%q: %s", args, out)
	require.Contains(t, string(out), "this node is as before fastpath")
	got, err := os.ReadFile(report)
	require.NoError(t, err)
	require.Equal(t, string(out), string(got))
}

func cfgMount(t *testing.T, c *corev1.Container) string {
	t.Helper()
	for _, vm := range c.VolumeMounts {
		if vm.Name == "config" {
			return vm.MountPath
		}
	}
	t.Fatalf("%s mounts no config", c.Name)
	return ""
}
