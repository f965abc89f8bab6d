package deployments_test

import (
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

const (
	provisionComponent = "components/provision"
	policiesConfigMap  = "fastpath-policies"
	pluginPkg          = "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// provisionCaps are the capabilities the component adds: CAP_NET_ADMIN
// for the GUIDs' rtnetlink call (and a PF's mtu), nothing else.
var provisionCaps = []corev1.Capability{"NET_ADMIN"}

func TestKustomizeProvision(t *testing.T) {
	for _, tc := range []struct {
		comps   []string
		dra     bool
		useCDI  bool
		extraHP []string
	}{
		{comps: []string{provisionComponent}},
		{comps: []string{"components/cdi", provisionComponent}, useCDI: true, extraHP: []string{"/var/run/cdi"}},
		{comps: []string{"components/dra", provisionComponent}, dra: true,
			extraHP: []string{"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/" + draDriver, "/var/run/cdi"}},
	} {
		t.Run(strings.Join(tc.comps, "+"), func(t *testing.T) {
			m := renderWith(t, tc.comps...)
			hostPaths := append([]string{"/sys/devices", "/sys/bus/pci", provision.DefaultStateDir, "/var/lib/cni/sriov"}, tc.extraHP...)
			requireDaemonSetCaps(t, m, provisionCaps, hostPaths...) // also: hostNetwork, not privileged, drop ALL
			spec := &m.daemonSets[0].Spec.Template.Spec
			c := container(t, spec.Containers, "rdma-device-plugin")
			require.True(t, spec.HostNetwork, "the GUIDs are set on the PF, in the node's network namespace")
			require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
			mounts := map[string]bool{}
			for _, vm := range c.VolumeMounts {
				require.False(t, mounts[vm.MountPath], "%s mounted twice", vm.MountPath)
				mounts[vm.MountPath] = true
			}
			flags := pluginFlags(t, c)
			require.Equal(t, map[bool]string{true: "true", false: "false"}[tc.useCDI], flags["use-cdi"])
			if tc.dra {
				require.Equal(t, []string{pluginBinaryDRA}, c.Command)
			} else {
				require.Equal(t, []string{pluginBinary}, c.Command)
			}

			// --policy is the ConfigMap's policies.yaml, mounted as a
			// directory, and loads as the seed's policy.
			require.NotEmpty(t, flags["policy"])
			vm, v := mountFor(t, spec, c, flags["policy"])
			require.NotNil(t, v.ConfigMap, "--policy %s is not on a ConfigMap volume", flags["policy"])
			require.Equal(t, policiesConfigMap, v.ConfigMap.Name)
			require.Empty(t, vm.SubPath)
			require.True(t, vm.ReadOnly)
			key := strings.TrimPrefix(flags["policy"], vm.MountPath+"/")
			i := slices.IndexFunc(m.configMaps, func(cm *corev1.ConfigMap) bool { return cm.Name == policiesConfigMap })
			require.GreaterOrEqual(t, i, 0, "ConfigMap %s", policiesConfigMap)
			requireSeedPolicy(t, m.configMaps[i].Data[key])
			// The policy feeds the pool the NetworkAttachmentDefinition (or
			// DRA's DeviceClass) asks for, which the pool config defines too:
			// the config's definition is kept.
			seed, err := provision.Load(filepath.Join("..", "testdata", "policy", "seed.yaml"))
			require.NoError(t, err)
			require.Equal(t, sriovResource, pool.DefaultExclusivePrefix+"/"+seed[0].ResourceName)
			_, cfg := poolConfig(t, m)
			require.True(t, slices.ContainsFunc(cfg.Resources, func(r pool.Resource) bool { return r.ResourceName() == sriovResource }))

			// The write-ahead record outlives the pod: a hostPath at its own path.
			require.Equal(t, provision.DefaultStateDir, flags["provision-state-dir"])
			requireHostDir(t, spec, c, flags["provision-state-dir"], false)
			// The CNI's attachments count as in use: read-only, at the path the CNI writes.
			requireHostDir(t, spec, c, flags["cni-state-dir"], true)
			// The PodResources socket (base) and, with DRA, its checkpoint.
			requireHostDir(t, spec, c, path.Dir(flags["pod-resources-socket"]), true)

			requireSysfsWritable(t, spec, c, flags["host-root"])

			// The policies' nodeSelector: the node's name, its token, get nodes.
			require.Contains(t, c.Env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})
			require.Equal(t, 1, len(slices.DeleteFunc(slices.Clone(c.Env), func(e corev1.EnvVar) bool { return e.Name != "NODE_NAME" })))
			require.False(t, slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "FASTPATH_NODE_LABELS" }),
				"labels come from the API server")
			require.Empty(t, flags["node-labels"])
			require.True(t, *spec.AutomountServiceAccountToken)
			requireGetNodes(t, m, tc.dra)

			// VFs are created before /healthz passes: the startup probe
			// holds the liveness probe off meanwhile.
			require.NotNil(t, c.StartupProbe)
			require.Equal(t, c.LivenessProbe.HTTPGet.Path, c.StartupProbe.HTTPGet.Path)
			require.Equal(t, c.LivenessProbe.HTTPGet.Port, c.StartupProbe.HTTPGet.Port)
			budget := c.StartupProbe.PeriodSeconds * c.StartupProbe.FailureThreshold
			require.GreaterOrEqual(t, budget, int32(8*provision.DefaultTimeout.Seconds()), "8 PFs that each time out")

			// The binary accepts every argument (its own flag set parses them).
			bin := filepath.Join(testbin.BuildWith(t, testbin.Flags{Tags: buildTags(tc.dra), Release: true}, pluginPkg), "rdma-device-plugin")
			out, err := exec.Command(bin, append(slices.Clone(c.Args), "--version")...).CombinedOutput()
			require.NoError(t, err, "%s %q: %s", c.Command[0], c.Args, out)
			require.Contains(t, string(out), map[bool]string{true: "with DRA", false: "without DRA"}[tc.dra])
		})
	}
}

func buildTags(dra bool) string {
	if dra {
		return "grpcnotrace"
	}
	return "nodra,grpcnotrace"
}

// requireSeedPolicy: the ConfigMap's policies load with provisioning's own
// loader and are the seed's, testdata/policy/seed.yaml — not a drifting copy.
func requireSeedPolicy(t *testing.T, data string) {
	t.Helper()
	require.NotEmpty(t, data)
	f := filepath.Join(t.TempDir(), "policies.yaml")
	require.NoError(t, os.WriteFile(f, []byte(data), 0o644))
	got, err := provision.Load(f)
	require.NoError(t, err)
	want, err := provision.Load(filepath.Join("..", "testdata", "policy", "seed.yaml"))
	require.NoError(t, err)
	for i := range got {
		got[i].Source = ""
	}
	for i := range want {
		want[i].Source = ""
	}
	require.Equal(t, want, got, "ConfigMap %s differs from testdata/policy/seed.yaml", policiesConfigMap)
}

// requireSysfsWritable: every file provisioning writes (pkg/provision's
// SysfsKernel), followed through sysfs's links as the kernel lays them out
// (the DGX fixture's), lands on a read-write hostPath of that same node
// directory; the rest of the node's /sys stays read-only.
func requireSysfsWritable(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, hostRoot string) {
	t.Helper()
	fixture := filepath.Join("..", "testdata", "sysfs", "dgx-h100")
	const pf, vf = "0000:18:00.0", "0000:18:00.1"
	writes := map[string]string{ // what -> file under the node's /
		"sriov_numvfs":            "sys/bus/pci/devices/" + pf + "/sriov_numvfs",
		"sriov_drivers_autoprobe": "sys/bus/pci/devices/" + pf + "/sriov_drivers_autoprobe",
		"driver_override":         "sys/bus/pci/devices/" + vf + "/driver_override",
		"drivers_probe":           "sys/bus/pci/drivers_probe",
		"unbind":                  "sys/bus/pci/devices/" + vf + "/driver/unbind",
		"mtu":                     "sys/class/net/ibp24s0/mtu",
	}
	for what, p := range writes {
		dir, err := filepath.EvalSymlinks(filepath.Join(fixture, path.Dir(p)))
		require.NoError(t, err, "%s: %s", what, p)
		abs, err := filepath.Abs(fixture)
		require.NoError(t, err)
		dir, err = filepath.Abs(dir)
		require.NoError(t, err)
		rel, err := filepath.Rel(abs, filepath.Join(dir, path.Base(p)))
		require.NoError(t, err)
		node := "/" + filepath.ToSlash(rel) // the file on the node, links followed
		inPod := path.Join(hostRoot, node)
		vm, v := mountFor(t, spec, c, inPod)
		require.NotNil(t, v.HostPath, "%s (%s): volume %s", what, inPod, v.Name)
		require.False(t, vm.ReadOnly, "%s: %s is on the read-only mount %s", what, inPod, vm.MountPath)
		require.Equal(t, node, path.Join(v.HostPath.Path, strings.TrimPrefix(inPod, vm.MountPath)), "%s: not the node's file", what)
		require.NotEqual(t, "/sys", v.HostPath.Path, "%s: the whole /sys read-write", what)
	}
	for _, ro := range []string{"/sys/fs/cgroup/cgroup.procs", "/sys/module/mlx5_core/parameters/prof_sel", "/sys/kernel/debug", "/sys/class/net"} {
		vm, v := mountFor(t, spec, c, path.Join(hostRoot, ro))
		require.True(t, vm.ReadOnly, "%s: mount %s", ro, vm.MountPath)
		require.Equal(t, "/sys", v.HostPath.Path)
		require.NotNil(t, vm.RecursiveReadOnly, "%s: submounts of /sys (cgroupfs) read-only too", ro)
	}
}

// requireGetNodes: the component's RBAC is get on nodes, for the plugin's
// service account, and nothing else (DRA's role is dra_test.go's).
func requireGetNodes(t *testing.T, m *manifests, dra bool) {
	t.Helper()
	i := slices.IndexFunc(m.clusterRoles, func(r *rbacv1.ClusterRole) bool { return r.Name == "fastpath-rdma-provision" })
	require.GreaterOrEqual(t, i, 0)
	require.Equal(t, []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}}}, m.clusterRoles[i].Rules)
	require.Len(t, m.clusterRoles, map[bool]int{true: 2, false: 1}[dra])
	j := slices.IndexFunc(m.clusterRoleBinds, func(b *rbacv1.ClusterRoleBinding) bool { return b.RoleRef.Name == "fastpath-rdma-provision" })
	require.GreaterOrEqual(t, j, 0)
	b := m.clusterRoleBinds[j]
	require.Equal(t, rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "fastpath-rdma-provision"}, b.RoleRef)
	sa := m.serviceAccounts[0]
	require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}}, b.Subjects)
	require.Equal(t, m.daemonSets[0].Spec.Template.Spec.ServiceAccountName, sa.Name)
	if !dra {
		require.Empty(t, m.admissionPolicies)
	}
}
