// Package deployments_test checks the plain-YAML manifests in this directory
// the way the API server and the node would: every document decodes strictly
// into its Kubernetes type (an unknown or misspelt field fails), the
// ConfigMap's config loads with fastpath's own parser, and the DaemonSet, the
// NetworkAttachmentDefinition, the example pods and the Dockerfile agree on
// paths, ports and resource names.
package deployments_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourcev1 "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	nfdv1alpha1 "sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1"
	"sigs.k8s.io/yaml"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// The device plugin's flag defaults (cmd/rdma-device-plugin/serve.go), for
// flags the DaemonSet leaves out.
var pluginFlagDefaults = map[string]string{
	"config":               "/etc/fastpath/config.json",
	"host-root":            "/",
	"node-root":            "/",
	"pod-resources-socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
	"kubelet-dir":          "/var/lib/kubelet/device-plugins",
	"devinfo-dir":          "/var/run/k8s.cni.cncf.io/devinfo/dp",
	"metrics-addr":         "127.0.0.1:8478",
	"log-level":            "info",
	"cdi-spec-dir":         "",
	"use-cdi":              "false",
	// Provisioning (components/provision).
	"policy":              "",
	"provision-state-dir": "/var/lib/fastpath/provision",
	"cni-state-dir":       "/var/lib/cni/sriov",
	"node-labels":         "",
	"node-name":           "",
	"provision-timeout":   "1m0s",
}

// pluginBoolFlags may be given without a value (--use-cdi).
var pluginBoolFlags = map[string]bool{"use-cdi": true}

const (
	nfdLabel = "feature.node.kubernetes.io/pci-15b3.present"
	// NFD's own label for a node with an SR-IOV capable netdev (its
	// network source, on by default).
	sriovLabel         = "feature.node.kubernetes.io/network-sriov.capable"
	resourceAnnotation = "k8s.v1.cni.cncf.io/resourceName"
	networksAnnotation = "k8s.v1.cni.cncf.io/networks"
	sharedResource     = "rdma/hca_shared_devices_a"
	sriovResource      = "mellanox.com/mlnx_sriov_rdma"
	cniBinary          = "/usr/bin/sriov" // where the image has the CNI
	pluginBinary       = "/usr/bin/rdma-device-plugin"
	pluginBinaryDRA    = "/usr/bin/rdma-device-plugin-dra" // the build with DRA (components/dra)
	hostCNIBinDir      = "/opt/cni/bin"
)

// NetworkAttachmentDefinition is k8s.cni.cncf.io/v1's, which k8s.io/api does
// not have: just enough for a strict decode.
type NetworkAttachmentDefinition struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	Spec              struct {
		Config string `json:"config"`
	} `json:"spec"`
}

// manifests are the decoded documents of every YAML file under deployments/.
type manifests struct {
	namespaces       []*corev1.Namespace
	serviceAccounts  []*corev1.ServiceAccount
	configMaps       []*corev1.ConfigMap
	daemonSets       []*appsv1.DaemonSet
	pods             []*corev1.Pod
	nads             []*NetworkAttachmentDefinition
	nodeFeatureRules []*nfdv1alpha1.NodeFeatureRule
	// The DRA component's (components/dra, dra_test.go).
	clusterRoles      []*rbacv1.ClusterRole
	clusterRoleBinds  []*rbacv1.ClusterRoleBinding
	admissionPolicies []*admissionv1.ValidatingAdmissionPolicy
	policyBindings    []*admissionv1.ValidatingAdmissionPolicyBinding
	deviceClasses     []*resourcev1.DeviceClass
	claims            []*resourcev1.ResourceClaim
	claimTemplates    []*resourcev1.ResourceClaimTemplate
}

// yamlFiles lists the manifests: the YAML files of deployments/ and its
// subdirectories (examples/, nfd/), but not the kustomizations
// (kustomize_test.go renders those) nor components/dra (patches and DRA
// examples: dra_test.go checks them) nor components/provision (patches:
// provision_test.go renders them) nor uninstall/ (uninstall_test.go
// renders it).
func yamlFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (p == "components/dra" || p == "components/provision" || p == "uninstall") {
			return filepath.SkipDir
		}
		if !d.IsDir() && (strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yml")) && d.Name() != kustomizationFile {
			files = append(files, p)
		}
		return nil
	})
	require.NoError(t, err)
	require.NotEmpty(t, files, "no manifests found")
	return files
}

// splitDocuments splits a multi-document YAML file on "---" lines and drops
// documents that hold only comments.
func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	var cur bytes.Buffer
	flush := func() {
		if hasContent(cur.Bytes()) {
			docs = append(docs, slices.Clone(cur.Bytes()))
		}
		cur.Reset()
	}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		if strings.TrimRight(line, " \t") == "---" {
			flush()
			continue
		}
		cur.WriteString(line)
		cur.WriteByte('\n')
	}
	flush()
	return docs
}

func hasContent(doc []byte) bool {
	for line := range strings.SplitSeq(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return true
		}
	}
	return false
}

// decodeStrict decodes one YAML document into out: duplicate keys and fields
// out's type does not have are errors.
func decodeStrict(doc []byte, out any) error {
	js, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return fmt.Errorf("trailing data after the object")
	}
	return nil
}

// decodeDocument decodes doc into the Kubernetes type its apiVersion and kind
// name, and adds it to m.
func decodeDocument(doc []byte, m *manifests) error {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return err
	}
	var obj any
	switch tm.APIVersion + " " + tm.Kind {
	case "v1 Namespace":
		o := &corev1.Namespace{}
		m.namespaces, obj = append(m.namespaces, o), o
	case "v1 ServiceAccount":
		o := &corev1.ServiceAccount{}
		m.serviceAccounts, obj = append(m.serviceAccounts, o), o
	case "v1 ConfigMap":
		o := &corev1.ConfigMap{}
		m.configMaps, obj = append(m.configMaps, o), o
	case "apps/v1 DaemonSet":
		o := &appsv1.DaemonSet{}
		m.daemonSets, obj = append(m.daemonSets, o), o
	case "v1 Pod":
		o := &corev1.Pod{}
		m.pods, obj = append(m.pods, o), o
	case "k8s.cni.cncf.io/v1 NetworkAttachmentDefinition":
		o := &NetworkAttachmentDefinition{}
		m.nads, obj = append(m.nads, o), o
	case "nfd.k8s-sigs.io/v1alpha1 NodeFeatureRule":
		o := &nfdv1alpha1.NodeFeatureRule{}
		m.nodeFeatureRules, obj = append(m.nodeFeatureRules, o), o
	case "rbac.authorization.k8s.io/v1 ClusterRole":
		o := &rbacv1.ClusterRole{}
		m.clusterRoles, obj = append(m.clusterRoles, o), o
	case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
		o := &rbacv1.ClusterRoleBinding{}
		m.clusterRoleBinds, obj = append(m.clusterRoleBinds, o), o
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicy":
		o := &admissionv1.ValidatingAdmissionPolicy{}
		m.admissionPolicies, obj = append(m.admissionPolicies, o), o
	case "admissionregistration.k8s.io/v1 ValidatingAdmissionPolicyBinding":
		o := &admissionv1.ValidatingAdmissionPolicyBinding{}
		m.policyBindings, obj = append(m.policyBindings, o), o
	case "resource.k8s.io/v1 DeviceClass":
		o := &resourcev1.DeviceClass{}
		m.deviceClasses, obj = append(m.deviceClasses, o), o
	case "resource.k8s.io/v1 ResourceClaim":
		o := &resourcev1.ResourceClaim{}
		m.claims, obj = append(m.claims, o), o
	case "resource.k8s.io/v1 ResourceClaimTemplate":
		o := &resourcev1.ResourceClaimTemplate{}
		m.claimTemplates, obj = append(m.claimTemplates, o), o
	default:
		return fmt.Errorf("unexpected apiVersion %q kind %q", tm.APIVersion, tm.Kind)
	}
	if err := decodeStrict(doc, obj); err != nil {
		return fmt.Errorf("%s %s: %w", tm.APIVersion, tm.Kind, err)
	}
	return nil
}

func loadManifests(t *testing.T) *manifests {
	t.Helper()
	m := &manifests{}
	for _, f := range yamlFiles(t) {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		docs := splitDocuments(data)
		require.NotEmpty(t, docs, "%s: no documents", f)
		for i, doc := range docs {
			require.NoError(t, decodeDocument(doc, m), "%s: document %d", f, i)
		}
	}
	return m
}

func TestDecodeStrict(t *testing.T) {
	// The decoder must reject what the API server would: a misspelt field, a
	// field at the wrong level, a duplicate key.
	bad := map[string]string{
		"unknown field": "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  hostNetwrok: true\n",
		"wrong level":   "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec:\n  containers:\n  - name: c\n    image: i\n    readOnly: true\n",
		"duplicate key": "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\ndata: {a: x}\ndata: {b: y}\n",
		"unknown kind":  "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
		"nad extra":     "apiVersion: k8s.cni.cncf.io/v1\nkind: NetworkAttachmentDefinition\nmetadata: {name: n}\nspec: {config: '{}', conifg: x}\n",
	}
	for name, doc := range bad {
		t.Run(name, func(t *testing.T) {
			require.Error(t, decodeDocument([]byte(doc), &manifests{}))
		})
	}
	t.Run("split", func(t *testing.T) {
		docs := splitDocuments([]byte("# head\n---\na: 1\n---   \n# only a comment\n---\nb: 2\n"))
		require.Len(t, docs, 2)
	})
}

func TestManifestsDecode(t *testing.T) {
	m := loadManifests(t)
	require.Len(t, m.namespaces, 1)
	require.Len(t, m.serviceAccounts, 1)
	require.Len(t, m.configMaps, 1)
	require.Len(t, m.daemonSets, 1)
	require.Len(t, m.nads, 1)
	require.Len(t, m.nodeFeatureRules, 1)
	require.NotEmpty(t, m.pods)

	ns := m.namespaces[0].Name
	for _, o := range []metav1.Object{m.serviceAccounts[0], m.configMaps[0], m.daemonSets[0]} {
		require.Equal(t, ns, o.GetNamespace(), "%s must be in the fastpath namespace", o.GetName())
	}
	// hostNetwork and hostPath are admitted by the privileged level only.
	require.Equal(t, "privileged", m.namespaces[0].Labels["pod-security.kubernetes.io/enforce"])
	// The NAD and the example pods go wherever the training runs.
	require.Empty(t, m.nads[0].Namespace)
	for _, p := range m.pods {
		require.Empty(t, p.Namespace, "pod %s", p.Name)
	}
}

// poolConfig returns the ConfigMap and the config file the DaemonSet gives
// the plugin, parsed by pkg/pool.
func poolConfig(t *testing.T, m *manifests) (*corev1.ConfigMap, *pool.Config) {
	t.Helper()
	cm := m.configMaps[0]
	data, ok := cm.Data["config.json"]
	require.True(t, ok, "ConfigMap %s has no config.json", cm.Name)
	cfg, err := pool.Parse([]byte(data))
	require.NoError(t, err)
	return cm, cfg
}

func TestConfigMapLoads(t *testing.T) {
	m := loadManifests(t)
	cm, cfg := poolConfig(t, m)
	require.Empty(t, cfg.Warnings)

	kinds := map[string]pool.Kind{}
	for _, r := range cfg.Resources {
		kinds[r.ResourceName()] = r.Kind
	}
	require.Equal(t, map[string]pool.Kind{sharedResource: pool.Shared, sriovResource: pool.Exclusive}, kinds)

	// Through the file path too, as the plugin reads it.
	f := filepath.Join(t.TempDir(), "config.json")
	require.NoError(t, os.WriteFile(f, []byte(cm.Data["config.json"]), 0o644))
	loaded, err := pool.Load(f)
	require.NoError(t, err)
	require.Equal(t, cfg.Resources, loaded.Resources)

	// The ConfigMap is the seed's combined config, not a drifting copy.
	seed, err := os.ReadFile("../testdata/config/combined.json")
	require.NoError(t, err)
	var want, got any
	require.NoError(t, json.Unmarshal(seed, &want))
	require.NoError(t, json.Unmarshal([]byte(cm.Data["config.json"]), &got))
	require.Equal(t, want, got, "ConfigMap config.json differs from testdata/config/combined.json")
}

// pluginFlags returns the container's --name=value flags over the defaults.
func pluginFlags(t *testing.T, c *corev1.Container) map[string]string {
	t.Helper()
	flags := maps.Clone(pluginFlagDefaults)
	for _, a := range append(c.Command[1:], c.Args...) {
		name, value, ok := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if !ok && pluginBoolFlags[name] {
			value, ok = "true", true
		}
		require.True(t, strings.HasPrefix(a, "-") && ok, "argument %q: want --name=value", a)
		_, known := pluginFlagDefaults[name]
		require.True(t, known, "argument %q: not a flag of the device plugin", a)
		flags[name] = value
	}
	return flags
}

// mountFor returns the mount of c that holds the container path p, the
// deepest one, and its volume.
func mountFor(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, p string) (corev1.VolumeMount, corev1.Volume) {
	t.Helper()
	var best *corev1.VolumeMount
	for i, vm := range c.VolumeMounts {
		if (p == vm.MountPath || strings.HasPrefix(p, strings.TrimSuffix(vm.MountPath, "/")+"/")) &&
			(best == nil || len(vm.MountPath) > len(best.MountPath)) {
			best = &c.VolumeMounts[i]
		}
	}
	require.NotNil(t, best, "container %s: nothing mounted at %s", c.Name, p)
	v := volume(t, spec, best.Name)
	return *best, v
}

func volume(t *testing.T, spec *corev1.PodSpec, name string) corev1.Volume {
	t.Helper()
	for _, v := range spec.Volumes {
		if v.Name == name {
			return v
		}
	}
	require.FailNow(t, "no volume "+name)
	return corev1.Volume{}
}

func container(t *testing.T, cs []corev1.Container, name string) *corev1.Container {
	t.Helper()
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	require.FailNow(t, "no container "+name)
	return nil
}

// requireHostDir checks that the container path p is the same path on the
// host, through a hostPath volume: the kubelet and the CNI read what the
// plugin writes there by host path.
func requireHostDir(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, p string, readOnly bool) {
	t.Helper()
	vm, v := mountFor(t, spec, c, p)
	require.NotNil(t, v.HostPath, "%s: volume %s is not a hostPath", p, v.Name)
	require.Equal(t, p, vm.MountPath, "%s: mounted at %s", p, vm.MountPath)
	require.Equal(t, p, v.HostPath.Path, "%s: host path %s", p, v.HostPath.Path)
	require.Equal(t, readOnly, vm.ReadOnly, "%s: readOnly", p)
}

// requireUnderHostRoot checks that the node's directory p is mounted
// read-only at <hostRoot>/p through a hostPath volume of p.
func requireUnderHostRoot(t *testing.T, spec *corev1.PodSpec, c *corev1.Container, hostRoot, p string) {
	t.Helper()
	want := path.Join(hostRoot, p)
	vm, v := mountFor(t, spec, c, want)
	require.NotNil(t, v.HostPath, "%s: volume %s is not a hostPath", want, v.Name)
	require.Equal(t, want, vm.MountPath, "%s: mounted at %s", want, vm.MountPath)
	require.Equal(t, p, v.HostPath.Path, "%s: host path %s", want, v.HostPath.Path)
	require.True(t, vm.ReadOnly, "%s: readOnly", want)
}

// pluginFlag is a flag's value: as given, or its default.
func pluginFlag(flags map[string]string, name string) string {
	if v, ok := flags[name]; ok {
		return v
	}
	return pluginFlagDefaults[name]
}

func TestDaemonSet(t *testing.T) {
	requireDaemonSet(t, loadManifests(t))
}

// requireDaemonSet checks the DaemonSet of m (the files, or what kustomize
// renders); extraHostPaths are the hostPaths an overlay adds.
func requireDaemonSet(t *testing.T, m *manifests, extraHostPaths ...string) {
	t.Helper()
	requireDaemonSetCaps(t, m, nil, extraHostPaths...)
}

// requireDaemonSetCaps is requireDaemonSet where the plugin's container
// adds the capabilities caps (components/provision); the init container
// never adds any.
func requireDaemonSetCaps(t *testing.T, m *manifests, caps []corev1.Capability, extraHostPaths ...string) {
	t.Helper()
	ds := m.daemonSets[0]
	spec := &ds.Spec.Template.Spec

	// The API server rejects a selector that does not match the template.
	sel, err := metav1.LabelSelectorAsSelector(ds.Spec.Selector)
	require.NoError(t, err)
	require.False(t, sel.Empty())
	require.True(t, sel.Matches(labels.Set(ds.Spec.Template.Labels)))

	require.True(t, spec.HostNetwork, "netlink link events of the host netns need hostNetwork")
	require.Empty(t, spec.NodeSelector, "nodes are chosen by affinity: a ConnectX node or any SR-IOV node")
	require.Equal(t, []map[string]string{{nfdLabel: "true"}, {sriovLabel: "true"}}, nodeTerms(t, spec))
	require.Equal(t, "system-node-critical", spec.PriorityClassName)
	require.Equal(t, m.serviceAccounts[0].Name, spec.ServiceAccountName)
	require.True(t, slices.ContainsFunc(spec.Tolerations, func(tol corev1.Toleration) bool {
		return tol.Key == "nvidia.com/gpu" && tol.Operator == corev1.TolerationOpExists
	}), "GPU nodes' nvidia.com/gpu taint must be tolerated")

	// Only the hostPaths it needs.
	var hostPaths []string
	for _, v := range spec.Volumes {
		if v.HostPath != nil {
			hostPaths = append(hostPaths, v.HostPath.Path)
		}
	}
	require.ElementsMatch(t, append([]string{
		"/var/lib/kubelet/device-plugins", "/sys", "/dev", "/var/lib/kubelet/pod-resources",
		"/var/run/k8s.cni.cncf.io/devinfo/dp", hostCNIBinDir,
	}, extraHostPaths...), hostPaths)

	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		require.Equal(t, spec.Containers[0].Image, c.Image, "container %s: one image for both binaries", c.Name)
		for _, vm := range c.VolumeMounts {
			volume(t, spec, vm.Name)
		}
		sc := c.SecurityContext
		require.NotNil(t, sc, "container %s: securityContext", c.Name)
		require.False(t, sc.Privileged != nil && *sc.Privileged, "container %s must not be privileged", c.Name)
		require.NotNil(t, sc.AllowPrivilegeEscalation)
		require.False(t, *sc.AllowPrivilegeEscalation, "container %s", c.Name)
		require.NotNil(t, sc.ReadOnlyRootFilesystem)
		require.True(t, *sc.ReadOnlyRootFilesystem, "container %s", c.Name)
		require.NotNil(t, sc.Capabilities, "container %s", c.Name)
		require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop, "container %s", c.Name)
		if c.Name == spec.Containers[0].Name && caps != nil {
			require.Equal(t, caps, sc.Capabilities.Add, "container %s", c.Name)
		} else {
			require.Empty(t, sc.Capabilities.Add, "container %s", c.Name)
		}
		for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
			require.Contains(t, c.Resources.Requests, r, "container %s requests", c.Name)
			require.Contains(t, c.Resources.Limits, r, "container %s limits", c.Name)
		}
	}

	c := container(t, spec.Containers, "rdma-device-plugin")
	require.Contains(t, []string{pluginBinary, pluginBinaryDRA}, c.Command[0])
	flags := pluginFlags(t, c)
	require.Equal(t, "/host", flags["host-root"], "the node's /sys and /dev are read under /host")
	require.Equal(t, "/", pluginFlag(flags, "node-root"), "what the plugin hands the kubelet are the node's own /dev paths")
	// kubectl exec … doctor reads the node where the plugin does.
	i := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "FASTPATH_HOST_ROOT" })
	require.GreaterOrEqual(t, i, 0, "FASTPATH_HOST_ROOT: doctor's --host-root in the container")
	require.Equal(t, flags["host-root"], c.Env[i].Value, "FASTPATH_HOST_ROOT vs --host-root")

	// The config file is the ConfigMap's key, mounted as a directory (a
	// subPath mount never sees an edit).
	cm, _ := poolConfig(t, m)
	vm, v := mountFor(t, spec, c, flags["config"])
	require.NotNil(t, v.ConfigMap, "--config %s is not on a ConfigMap volume", flags["config"])
	require.Equal(t, cm.Name, v.ConfigMap.Name)
	require.Empty(t, vm.SubPath)
	require.Equal(t, flags["config"], path.Join(vm.MountPath, "config.json"))

	// The node's /sys and its whole /dev (a mount of /dev/infiniband alone
	// goes stale when the RDMA modules reload), read-only under --host-root.
	requireUnderHostRoot(t, spec, c, flags["host-root"], "/sys")
	requireUnderHostRoot(t, spec, c, flags["host-root"], "/dev")
	// The node's CNI bin_dir, read-only under --host-root too: doctor's
	// default there (FASTPATH_HOST_ROOT/opt/cni/bin); the same volume the
	// init container installs into.
	requireUnderHostRoot(t, spec, c, flags["host-root"], hostCNIBinDir)
	_, cniVol := mountFor(t, spec, c, path.Join(flags["host-root"], hostCNIBinDir))
	require.Len(t, spec.InitContainers, 1)
	initMount, _ := mountFor(t, spec, &spec.InitContainers[0], "/host"+hostCNIBinDir)
	require.Equal(t, cniVol.Name, initMount.Name, "the plugin reads the bin_dir the init container writes")
	// Not the CNI conf_dir: it holds Multus's kubeconfig.
	for _, vm := range c.VolumeMounts {
		v := volume(t, spec, vm.Name)
		if v.HostPath != nil {
			require.False(t, strings.HasPrefix(v.HostPath.Path, "/etc/cni"), "the plugin mounts %s", v.HostPath.Path)
		}
	}
	requireHostDir(t, spec, c, flags["kubelet-dir"], false)
	requireHostDir(t, spec, c, flags["devinfo-dir"], false)
	requireHostDir(t, spec, c, path.Dir(pluginFlag(flags, "pod-resources-socket")), true)

	// Liveness and readiness on the port --metrics-addr listens on, which
	// is bound to the node's own address (issue 44, finding 7): the
	// kubelet's probes go to the pod's IP, the node's under hostNetwork.
	hostStr, portStr, err := net.SplitHostPort(flags["metrics-addr"])
	require.NoError(t, err)
	require.Equal(t, "$(HOST_IP)", hostStr, "--metrics-addr: the node's address, not every interface")
	require.Contains(t, c.Env, corev1.EnvVar{Name: "HOST_IP", ValueFrom: &corev1.EnvVarSource{
		FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.hostIP"}}})
	require.True(t, spec.HostNetwork, "the pod's IP is the node's")
	for name, probe := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		require.NotNil(t, probe, "%s probe", name)
		require.NotNil(t, probe.HTTPGet, "%s probe", name)
		require.Equal(t, map[string]string{"liveness": "/healthz", "readiness": "/readyz"}[name], probe.HTTPGet.Path, "%s probe", name)
		port := probe.HTTPGet.Port.String()
		if probe.HTTPGet.Port.IntValue() == 0 { // a named port
			i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == port })
			require.GreaterOrEqual(t, i, 0, "%s probe: no container port named %q", name, port)
			port = fmt.Sprint(c.Ports[i].ContainerPort)
		}
		require.Equal(t, portStr, port, "%s probe port vs --metrics-addr %s", name, flags["metrics-addr"])
		require.Empty(t, probe.HTTPGet.Host, "%s probe: the pod's IP, where --metrics-addr listens", name)
	}
}

// The init container installs the CNI binary with rdma-device-plugin
// install-cni (cmd/rdma-device-plugin/internal/installcni): only sriov, in
// the node's CNI bin_dir, from the image's CNI binary; no shell, which could
// write anything anywhere in /opt/cni/bin (issue 44, finding 6).
func TestInstallCNI(t *testing.T) {
	m := loadManifests(t)
	spec := &m.daemonSets[0].Spec.Template.Spec
	require.Len(t, spec.InitContainers, 1)
	c := &spec.InitContainers[0]
	require.Empty(t, c.Args)
	require.GreaterOrEqual(t, len(c.Command), 2)
	require.Equal(t, []string{pluginBinary, "install-cni"}, c.Command[:2], "the device plugin's install-cni, not a shell")
	flags := map[string]string{}
	for _, a := range c.Command[2:] {
		k, v, ok := strings.Cut(strings.TrimPrefix(a, "--"), "=")
		require.True(t, ok && strings.HasPrefix(a, "--"), "argument %q: --flag=value", a)
		flags[k] = v
	}
	require.Equal(t, map[string]string{"from": cniBinary, "to": "/host" + hostCNIBinDir}, flags)

	vm, v := mountFor(t, spec, c, flags["to"])
	require.NotNil(t, v.HostPath)
	require.False(t, vm.ReadOnly)
	require.Equal(t, hostCNIBinDir, path.Join(v.HostPath.Path, strings.TrimPrefix(flags["to"], vm.MountPath)))
}

// The image is a release's version, never latest nor tag-less: a tag that
// moves gives nodes different binaries under one name, and IfNotPresent
// then keeps whichever a node pulled first (issue 44, finding 6). A digest,
// where a release set one, must be a sha256.
func TestImagePinned(t *testing.T) {
	versionTag := regexp.MustCompile(`^v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$`)
	for _, tc := range []struct {
		image string
		ok    bool
	}{
		{"ghcr.io/fastpath-k8s/fastpath:v0.5.0", true},
		{"ghcr.io/fastpath-k8s/fastpath:v0.5.0@sha256:" + strings.Repeat("ab", 32), true},
		{"ghcr.io/fastpath-k8s/fastpath:latest", false},
		{"ghcr.io/fastpath-k8s/fastpath", false},
		{"ghcr.io/fastpath-k8s/fastpath:main", false},
		{"localhost:5000/fastpath", false},
		{"ghcr.io/fastpath-k8s/fastpath:v0.5.0@sha256:abc", false},
	} {
		require.Equal(t, tc.ok, imagePinned(versionTag, tc.image) == nil, "%s: %v", tc.image, imagePinned(versionTag, tc.image))
	}

	k := kustomization(t, ".")
	require.Len(t, k.Images, 1)
	img := k.Images[0]
	ref := img.NewName + ":" + img.NewTag
	if img.Digest != "" {
		ref += "@" + img.Digest
	}
	require.NoError(t, imagePinned(versionTag, ref), "kustomization.yaml")
	for _, comps := range [][]string{nil, {"components/dra"}, {"components/provision"}, {"components/cdi", "components/dra"}} {
		got := render(t, ".")
		if comps != nil {
			got = renderWith(t, comps...)
		}
		spec := &got.daemonSets[0].Spec.Template.Spec
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			require.NoError(t, imagePinned(versionTag, c.Image), "%v: container %s", comps, c.Name)
			require.Equal(t, corev1.PullIfNotPresent, c.ImagePullPolicy, "%v: container %s: a version tag does not move, so a node pulls it once", comps, c.Name)
		}
	}
}

// imagePinned says why image is not a version-tagged (and optionally
// digest-pinned) reference.
func imagePinned(versionTag *regexp.Regexp, image string) error {
	ref, digest, hasDigest := strings.Cut(image, "@")
	if hasDigest && !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(digest) {
		return fmt.Errorf("image %s: digest %q is not sha256:<64 hex>", image, digest)
	}
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return fmt.Errorf("image %s has no tag: name a release's version", image)
	}
	if tag := ref[i+1:]; !versionTag.MatchString(tag) {
		return fmt.Errorf("image %s: tag %q is not a release version (vX.Y.Z)", image, tag)
	}
	return nil
}

// networks parses a k8s.v1.cni.cncf.io/networks annotation (the comma list
// or the JSON list form) into NetworkAttachmentDefinition names.
func networks(t *testing.T, s string) []string {
	t.Helper()
	s = strings.TrimSpace(s)
	var out []string
	if strings.HasPrefix(s, "[") {
		var sel []struct {
			Name string `json:"name"`
		}
		require.NoError(t, json.Unmarshal([]byte(s), &sel))
		for _, n := range sel {
			out = append(out, n.Name)
		}
		return out
	}
	for e := range strings.SplitSeq(s, ",") {
		e = strings.TrimSpace(e)
		if i := strings.LastIndex(e, "/"); i >= 0 {
			e = e[i+1:]
		}
		e, _, _ = strings.Cut(e, "@")
		out = append(out, e)
	}
	return out
}

func TestNetworkAttachmentDefinition(t *testing.T) {
	m := loadManifests(t)
	nad := m.nads[0]
	require.Equal(t, "sriov-rdma", nad.Name)

	res := nad.Annotations[resourceAnnotation]
	require.Equal(t, sriovResource, res)
	_, cfg := poolConfig(t, m)
	i := slices.IndexFunc(cfg.Resources, func(r pool.Resource) bool { return r.ResourceName() == res })
	require.GreaterOrEqual(t, i, 0, "%s is not a pool of the ConfigMap", res)
	require.Equal(t, pool.Exclusive, cfg.Resources[i].Kind, "a CNI attachment takes one VF: the pool must be exclusive")

	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Type       string `json:"type"`
		Name       string `json:"name"`
		IPAM       struct {
			Type  string `json:"type"`
			Range string `json:"range"`
		} `json:"ipam"`
	}
	dec := json.NewDecoder(strings.NewReader(nad.Spec.Config))
	require.NoError(t, dec.Decode(&conf), "spec.config is not JSON")
	require.False(t, dec.More())
	require.Equal(t, "sriov", conf.Type, "the CNI binary is installed as /opt/cni/bin/sriov")
	require.Equal(t, "0.3.1", conf.CNIVersion)
	require.Equal(t, nad.Name, conf.Name)
	require.Equal(t, "whereabouts", conf.IPAM.Type)
	_, _, err := net.ParseCIDR(conf.IPAM.Range)
	require.NoError(t, err)
}

func TestTrainingPods(t *testing.T) {
	m := loadManifests(t)
	nadResource := map[string]string{}
	for _, n := range m.nads {
		nadResource[n.Name] = n.Annotations[resourceAnnotation]
	}
	for _, p := range m.pods {
		t.Run(p.Name, func(t *testing.T) {
			nets := networks(t, p.Annotations[networksAnnotation])
			require.NotEmpty(t, nets)
			// Each attachment takes one VF of its NAD's resource.
			want := map[string]int64{}
			for _, n := range nets {
				r, ok := nadResource[n]
				require.True(t, ok, "network %s has no NetworkAttachmentDefinition here", n)
				want[r]++
			}
			got := map[string]int64{}
			for _, c := range p.Spec.Containers {
				for r := range want {
					lim := c.Resources.Limits[corev1.ResourceName(r)]
					got[r] += lim.Value()
					if req, ok := c.Resources.Requests[corev1.ResourceName(r)]; ok {
						require.True(t, req.Equal(lim), "container %s: extended resource %s: requests must equal limits", c.Name, r)
					}
				}
			}
			require.Equal(t, want, got, "VFs requested vs network attachments")

			var shm *corev1.Volume
			for _, c := range p.Spec.Containers {
				for _, e := range c.Env {
					require.NotContains(t, []string{"NCCL_IB_HCA", "UCX_NET_DEVICES"}, e.Name,
						"container %s: the device plugin sets %s at Allocate", c.Name, e.Name)
				}
				require.Empty(t, c.EnvFrom, "container %s: envFrom could bring in NCCL_IB_HCA", c.Name)
				require.True(t, slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
					return e.Name == "NCCL_DEBUG" && e.Value == "INFO"
				}), "container %s: NCCL_DEBUG=INFO", c.Name)
				require.NotNil(t, c.SecurityContext)
				require.NotNil(t, c.SecurityContext.Capabilities)
				require.Contains(t, c.SecurityContext.Capabilities.Add, corev1.Capability("IPC_LOCK"),
					"container %s: RDMA pins memory", c.Name)
				_, v := mountFor(t, &p.Spec, &c, "/dev/shm")
				shm = &v
			}
			require.NotNil(t, shm.EmptyDir, "/dev/shm")
			require.Equal(t, corev1.StorageMediumMemory, shm.EmptyDir.Medium)
			// An unbounded /dev/shm lets a pod eat the node's memory.
			require.NotNil(t, shm.EmptyDir.SizeLimit)
			require.Equal(t, 1, shm.EmptyDir.SizeLimit.Cmp(resource.MustParse("64Mi")))
		})
	}
}

// TestDockerfile checks that the image has the binaries where the manifests
// run them from, built from the right packages.
func TestDockerfile(t *testing.T) {
	data, err := os.ReadFile("../Dockerfile")
	require.NoError(t, err)
	df := string(data)

	builds := map[string]string{} // output -> package
	for _, m := range regexp.MustCompile(`-o\s+(\S+)\s+(\./cmd/\S+)`).FindAllStringSubmatch(df, -1) {
		builds[m[1]] = m[2]
	}
	installed := map[string]string{} // image path -> package
	for _, m := range regexp.MustCompile(`(?m)^COPY\s+--from=\S+\s+(\S+)\s+(\S+)\s*$`).FindAllStringSubmatch(df, -1) {
		if pkg, ok := builds[m[1]]; ok {
			installed[m[2]] = pkg
		}
	}
	require.Equal(t, map[string]string{
		pluginBinary:    "./cmd/rdma-device-plugin",
		pluginBinaryDRA: "./cmd/rdma-device-plugin",
		cniBinary:       "./cmd/sriov-cni",
	}, installed)
	// The default DaemonSet's plugin is the lean build; components/dra's is not.
	require.Regexp(t, `-tags \S*\bnodra\b\S* .*-o /out/rdma-device-plugin \./cmd/`, df)
	require.NotRegexp(t, `-tags \S*\bnodra\b\S* .*-o /out/rdma-device-plugin-dra `, df)
	require.Regexp(t, `(?m)^COPY\s+--from=\S+\s+\S*pci\.ids\s+/usr/share/misc/pci\.ids\s*$`, df)
	require.Regexp(t, `CGO_ENABLED=0`, df)
	// --version tells which build runs: every binary gets the version.
	require.Regexp(t, `(?m)^ENV VERSION_PKG=github\.com/fastpath-k8s/fastpath/internal/version$`, df)
	require.Regexp(t, `-X \$\{VERSION_PKG\}\.Version=\$\{VERSION\} -X \$\{VERSION_PKG\}\.Revision=\$\{REVISION\}`, df)
	require.Equal(t, 3, strings.Count(df, `-ldflags "$LDFLAGS"`), "every go build embeds the version")

	// Base images by full version (issue 44, finding 6): golang:X.Y.Z-…
	// at the toolchain go.mod names, debian:N.M-slim; a digest may follow.
	froms := regexp.MustCompile(`(?m)^FROM\s+(?:--platform=\S+\s+)?(\S+)`).FindAllStringSubmatch(df, -1)
	require.Len(t, froms, 2)
	gomod, err := os.ReadFile("../go.mod")
	require.NoError(t, err)
	toolchain := regexp.MustCompile(`(?m)^toolchain go(\S+)$`).FindSubmatch(gomod)
	require.NotNil(t, toolchain, "go.mod names a toolchain")
	require.Regexp(t, `^golang:`+regexp.QuoteMeta(string(toolchain[1]))+`-[a-z]+(@sha256:[0-9a-f]{64})?$`, froms[0][1])
	require.Regexp(t, `^debian:\d+\.\d+-slim(@sha256:[0-9a-f]{64})?$`, froms[1][1])
}

// nodeTerms are the DaemonSet's required node affinity terms, each as the
// labels it requires (key In [one value] only; anything else fails).
func nodeTerms(t *testing.T, spec *corev1.PodSpec) []map[string]string {
	t.Helper()
	require.NotNil(t, spec.Affinity)
	require.NotNil(t, spec.Affinity.NodeAffinity)
	req := spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	require.NotNil(t, req)
	var out []map[string]string
	for _, term := range req.NodeSelectorTerms {
		require.Empty(t, term.MatchFields)
		labels := map[string]string{}
		for _, e := range term.MatchExpressions {
			require.Equal(t, corev1.NodeSelectorOpIn, e.Operator, e.Key)
			require.Len(t, e.Values, 1, e.Key)
			labels[e.Key] = e.Values[0]
		}
		out = append(out, labels)
	}
	return out
}
