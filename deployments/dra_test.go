package deployments_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"sigs.k8s.io/kustomize/kyaml/filesys"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// The DRA component's names, as the driver (cmd/rdma-device-plugin/internal/dra)
// spells them.
const (
	draDriver      = "rdma.fastpath-k8s.io"
	draDeviceClass = "mlnx-sriov-rdma.fastpath-k8s.io"
	draSA          = "system:serviceaccount:fastpath:rdma-device-plugin"
	pcieRoot       = "resource.kubernetes.io/pcieRoot"
)

// renderWith renders deployments/ as a user edits it to turn components
// on: the base kustomization with a components: line, in memory.
func renderWith(t *testing.T, components ...string) *manifests {
	t.Helper()
	fs := filesys.MakeFsInMemory()
	copyTo := func(name string, data []byte) {
		require.NoError(t, fs.MkdirAll(filepath.Dir("/d/"+name)))
		require.NoError(t, fs.WriteFile("/d/"+name, data))
	}
	files := kustomization(t, ".").Resources
	for _, c := range components {
		k := kustomization(t, c)
		files = append(files, c+"/"+kustomizationFile)
		for _, r := range k.Resources {
			files = append(files, c+"/"+r)
		}
		for _, p := range k.Patches {
			if p.Path != "" {
				files = append(files, c+"/"+p.Path)
			}
		}
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		copyTo(f, data)
	}
	base, err := os.ReadFile(kustomizationFile)
	require.NoError(t, err)
	copyTo(kustomizationFile, []byte(string(base)+"components: [\""+strings.Join(components, `", "`)+"\"]\n"))
	return renderFS(t, fs, "/d")
}

// The device-plugin-only install has no RBAC: its service account gets no
// token and may do nothing.
func TestBaseHasNoRBAC(t *testing.T) {
	m := render(t, ".")
	require.Empty(t, m.clusterRoles)
	require.Empty(t, m.clusterRoleBinds)
	require.Empty(t, m.admissionPolicies)
	require.Empty(t, m.deviceClasses)
	require.False(t, *m.serviceAccounts[0].AutomountServiceAccountToken)
	require.False(t, *m.daemonSets[0].Spec.Template.Spec.AutomountServiceAccountToken)
	require.Equal(t, pluginBinary, m.daemonSets[0].Spec.Template.Spec.Containers[0].Command[0], "the lean build, without DRA")
}

func TestKustomizeDRA(t *testing.T) {
	for _, comps := range [][]string{{"components/dra"}, {"components/cdi", "components/dra"}} {
		t.Run(strings.Join(comps, "+"), func(t *testing.T) {
			m := renderWith(t, comps...)
			dirs := []string{"/var/lib/kubelet/plugins_registry", "/var/lib/kubelet/plugins/" + draDriver, "/var/run/cdi"}
			requireDaemonSet(t, m, dirs...) // also: no hostPath twice
			spec := &m.daemonSets[0].Spec.Template.Spec
			c := container(t, spec.Containers, "rdma-device-plugin")
			require.Equal(t, []string{pluginBinaryDRA}, c.Command, "the build with DRA")
			for _, d := range dirs {
				requireHostDir(t, spec, c, d, false)
			}
			mounts := map[string]bool{}
			for _, vm := range c.VolumeMounts {
				require.False(t, mounts[vm.MountPath], "%s mounted twice", vm.MountPath)
				mounts[vm.MountPath] = true
			}
			// The plugin's defaults are the kubelet's paths: no DRA flag needed.
			flags := pluginFlags(t, c)
			require.Equal(t, map[bool]string{true: "true", false: "false"}[len(comps) == 2], flags["use-cdi"])

			require.True(t, *spec.AutomountServiceAccountToken, "the DRA plugin talks to the API server")
			require.Contains(t, c.Env, corev1.EnvVar{Name: "NODE_NAME", ValueFrom: &corev1.EnvVarSource{
				FieldRef: &corev1.ObjectFieldSelector{FieldPath: "spec.nodeName"}}})

			// The config: the VF pool on DRA, the shared pool on the device plugin.
			cm, cfg := poolConfig(t, m)
			want, err := os.ReadFile(filepath.Join("..", "testdata", "config", "dra.json"))
			require.NoError(t, err)
			require.JSONEq(t, string(want), cm.Data["config.json"])
			served := map[string]string{}
			for _, r := range cfg.Resources {
				served[r.ResourceName()] = r.ServedBy
			}
			require.Equal(t, map[string]string{sharedResource: pool.ServedByDevicePlugin, sriovResource: pool.ServedByDRA}, served)
			// No NetworkAttachmentDefinition left naming a resource the
			// device plugin does not advertise: its pods would stay Pending.
			for _, n := range m.nads {
				r := n.Annotations["k8s.v1.cni.cncf.io/resourceName"]
				require.Equal(t, pool.ServedByDevicePlugin, served[r], "NAD %s names %q, which the device plugin does not serve", n.Name, r)
			}

			// RBAC: what the kubeletplugin helper calls, for this service account.
			require.Len(t, m.clusterRoles, 1)
			require.ElementsMatch(t, []rbacv1.PolicyRule{
				{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceslices"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
				{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims"}, Verbs: []string{"get"}},
				{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/status"}, Verbs: []string{"patch"}},
				{APIGroups: []string{"resource.k8s.io"}, Resources: []string{"resourceclaims/driver"}, ResourceNames: []string{"rdma.fastpath-k8s.io"}, Verbs: []string{"associated-node:patch"}},
				{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get"}},
			}, m.clusterRoles[0].Rules)
			require.Len(t, m.clusterRoleBinds, 1)
			b := m.clusterRoleBinds[0]
			require.Equal(t, m.clusterRoles[0].Name, b.RoleRef.Name)
			require.Equal(t, []rbacv1.Subject{{Kind: "ServiceAccount", Name: m.serviceAccounts[0].Name, Namespace: m.serviceAccounts[0].Namespace}}, b.Subjects)
			require.Equal(t, draSA, "system:serviceaccount:"+b.Subjects[0].Namespace+":"+b.Subjects[0].Name)

			// The admission policies (ResourceSlices, ResourceClaims'
			// status) bind to the plugin's service account.
			require.Len(t, m.admissionPolicies, 2)
			require.Len(t, m.policyBindings, 2)
			for i, p := range m.admissionPolicies {
				require.Len(t, p.Spec.MatchConditions, 1)
				require.Contains(t, p.Spec.MatchConditions[0].Expression, `"`+draSA+`"`)
				require.Equal(t, p.Name, m.policyBindings[i].Spec.PolicyName)
			}
			require.Contains(t, m.admissionPolicies[0].Spec.Validations[1].Expression, `"`+draDriver+`"`)

			require.Len(t, m.deviceClasses, 1)
			require.Equal(t, draDeviceClass, m.deviceClasses[0].Name)
			// Pod specs written for the device plugin (resources.limits of
			// the VF pool) are served through the class (KEP-5004): its
			// extended resource is the pool DRA serves, which the device
			// plugin then does not advertise.
			ext := m.deviceClasses[0].Spec.ExtendedResourceName
			require.NotNil(t, ext, "extendedResourceName")
			require.Equal(t, sriovResource, *ext)
			require.Equal(t, pool.ServedByDRA, served[*ext])
		})
	}
}

// The examples decode strictly and fit together: the claim's VF request
// names the DeviceClass, the GPU and the VF are aligned on pcieRoot, and
// for Multus the NAD's resourceName is the claim's name.
func TestDRAExamples(t *testing.T) {
	m := &manifests{}
	files, err := filepath.Glob(filepath.Join("components", "dra", "examples", "*.yaml"))
	require.NoError(t, err)
	require.Len(t, files, 2)
	for _, f := range files {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		for i, doc := range splitDocuments(data) {
			require.NoError(t, decodeDocument(doc, m), "%s: document %d", f, i)
		}
	}
	require.Len(t, m.claimTemplates, 1)
	require.Len(t, m.claims, 1)
	for name, spec := range map[string]*resourcev1.DeviceClaim{
		m.claimTemplates[0].Name: &m.claimTemplates[0].Spec.Spec.Devices,
		m.claims[0].Name:         &m.claims[0].Spec.Devices,
	} {
		var reqs []string
		for _, r := range spec.Requests {
			reqs = append(reqs, r.Name)
			require.NotNil(t, r.Exactly, "%s: request %s", name, r.Name)
			if r.Name == "vf" {
				require.Equal(t, draDeviceClass, r.Exactly.DeviceClassName, name)
			}
		}
		require.Equal(t, []string{"gpu", "vf"}, reqs, name)
		require.Len(t, spec.Constraints, 1, name)
		c := spec.Constraints[0]
		require.Equal(t, pcieRoot, string(*c.MatchAttribute), name)
		require.Equal(t, []string{"gpu", "vf"}, c.Requests, name)
	}

	require.Len(t, m.nads, 1)
	require.Equal(t, m.claims[0].Name, m.nads[0].Annotations[resourceAnnotation], "Multus v4.3.0 keys a claim's devices by the claim's name")
	require.Len(t, m.pods, 2)
	for _, p := range m.pods {
		require.Len(t, p.Spec.ResourceClaims, 1)
		rc := p.Spec.ResourceClaims[0]
		require.Equal(t, []corev1.ResourceClaim{{Name: rc.Name}}, p.Spec.Containers[0].Resources.Claims)
		if net := p.Annotations[networksAnnotation]; net != "" {
			require.Equal(t, m.nads[0].Name, net)
			require.Equal(t, m.claims[0].Name, *rc.ResourceClaimName)
		} else {
			require.Equal(t, m.claimTemplates[0].Name, *rc.ResourceClaimTemplateName)
		}
	}
}
