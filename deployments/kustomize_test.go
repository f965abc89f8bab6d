package deployments_test

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kustypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	nfdv1alpha1 "sigs.k8s.io/node-feature-discovery/api/nfd/v1alpha1"
)

const (
	kustomizationFile = "kustomization.yaml"
	imageName         = "ghcr.io/fastpath-k8s/fastpath" // the images: entry of kustomization.yaml
)

// render runs kustomize on dir as `kubectl kustomize dir` does (kubectl
// v1.37 embeds this kustomize/api) and decodes every object strictly.
func render(t *testing.T, dir string) *manifests {
	t.Helper()
	return renderFS(t, filesys.MakeFsOnDisk(), dir)
}

func renderFS(t *testing.T, fs filesys.FileSystem, dir string) *manifests {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	resMap, err := k.Run(fs, dir)
	require.NoError(t, err, "kustomize %s", dir)
	out, err := resMap.AsYaml()
	require.NoError(t, err)
	m := &manifests{}
	for i, doc := range splitDocuments(out) {
		require.NoError(t, decodeDocument(doc, m), "kustomize %s: object %d", dir, i)
	}
	return m
}

// kustomization decodes dir/kustomization.yaml strictly into kustomize's
// own type: a Kustomization, or a Component where dir is under components/.
func kustomization(t *testing.T, dir string) *kustypes.Kustomization {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, kustomizationFile))
	require.NoError(t, err)
	k := &kustypes.Kustomization{}
	require.NoError(t, decodeStrict(data, k), "%s/%s", dir, kustomizationFile)
	if strings.HasPrefix(dir, "components/") {
		require.Equal(t, kustypes.ComponentVersion, k.APIVersion, dir)
		require.Equal(t, kustypes.ComponentKind, k.Kind, dir)
	} else {
		require.Equal(t, kustypes.KustomizationVersion, k.APIVersion, dir)
		require.Equal(t, kustypes.KustomizationKind, k.Kind, dir)
	}
	return k
}

func TestKustomizationsDecode(t *testing.T) {
	var dirs []string
	require.NoError(t, filepath.WalkDir(".", func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Name() == kustomizationFile {
			dirs = append(dirs, filepath.Dir(p))
		}
		return err
	}))
	require.ElementsMatch(t, []string{".", "components/cdi", "nfd", "components/dra", "components/provision", "uninstall"}, dirs)
	for _, d := range dirs {
		if kustomization(t, d).Kind == kustypes.KustomizationKind {
			render(t, d)
		}
	}
}

// TestKustomizeBase: `kubectl kustomize deployments/` is the YAML files of
// deployments/, all of them, with only the image changed — the one edit
// kustomization.yaml's images: entry stands for.
func TestKustomizeBase(t *testing.T) {
	k := kustomization(t, ".")
	var files []string
	entries, err := os.ReadDir(".")
	require.NoError(t, err)
	for _, e := range entries {
		if !e.IsDir() && strings.HasSuffix(e.Name(), ".yaml") && e.Name() != kustomizationFile {
			files = append(files, e.Name())
		}
	}
	require.ElementsMatch(t, files, k.Resources, "every manifest of deployments/ is a resource of the kustomization")
	require.Len(t, k.Images, 1)
	img := k.Images[0]
	require.Equal(t, imageName, img.Name)
	want := img.NewName + ":" + img.NewTag
	if img.Digest != "" { // a release's (kustomize edit set image NAME:TAG@sha256:…)
		want += "@" + img.Digest
	}

	got := render(t, ".")
	requireDaemonSet(t, got)
	m := loadManifests(t)
	require.Len(t, got.daemonSets, 1)
	ds, fileDS := got.daemonSets[0], m.daemonSets[0]
	spec := &ds.Spec.Template.Spec
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		require.Equal(t, want, c.Image, "container %s", c.Name)
	}
	// Nothing else changed: put the files' image back and compare.
	for _, cs := range [][]corev1.Container{spec.InitContainers, spec.Containers} {
		for i := range cs {
			cs[i].Image = fileDS.Spec.Template.Spec.Containers[0].Image
		}
	}
	require.Equal(t, fileDS, ds)
	require.Equal(t, m.namespaces, got.namespaces)
	require.Equal(t, m.serviceAccounts, got.serviceAccounts)
	require.Equal(t, m.configMaps, got.configMaps)
	// The NetworkAttachmentDefinition's file names no namespace (so that
	// kubectl apply -n TEAM -f takes it anywhere); apply -k states one.
	require.Len(t, got.nads, len(m.nads))
	for i, nad := range got.nads {
		require.Empty(t, m.nads[i].Namespace, "%s: the file names no namespace", nad.Name)
		require.Equal(t, "default", nad.Namespace, "%s: apply -k does not leave it to kubectl's current namespace", nad.Name)
		nad.Namespace = ""
		require.Equal(t, m.nads[i], nad)
	}
	require.Empty(t, got.pods, "the examples are not part of the install")
	require.Empty(t, got.nodeFeatureRules, "the NodeFeatureRule needs NFD's CRD: it is applied on its own (nfd/)")
}

// TestKustomizeCDI: the CDI component, turned on by uncommenting the line
// kustomization.yaml has for it, adds --use-cdi and gives the plugin the
// node's /var/run/cdi, where the runtime reads the specs.
func TestKustomizeCDI(t *testing.T) {
	base, err := os.ReadFile(kustomizationFile)
	require.NoError(t, err)
	const off, on = `# components: ["components/cdi"]`, `components: ["components/cdi"]`
	require.Contains(t, string(base), "\n"+off+"\n", "kustomization.yaml: the line the CDI component's comment names")

	// deployments/ as a user edits it, in memory.
	fs := filesys.MakeFsInMemory()
	copyTo := func(name string, data []byte) {
		require.NoError(t, fs.MkdirAll(filepath.Dir("/d/"+name)))
		require.NoError(t, fs.WriteFile("/d/"+name, data))
	}
	for _, f := range append(kustomization(t, ".").Resources, "components/cdi/"+kustomizationFile) {
		data, err := os.ReadFile(f)
		require.NoError(t, err)
		copyTo(f, data)
	}
	copyTo(kustomizationFile, []byte(strings.Replace(string(base), off, on, 1)))
	m := renderFS(t, fs, "/d")

	const cdiDir = "/var/run/cdi"
	requireDaemonSet(t, m, cdiDir)
	spec := &m.daemonSets[0].Spec.Template.Spec
	c := container(t, spec.Containers, "rdma-device-plugin")
	require.Equal(t, "true", pluginFlags(t, c)["use-cdi"])
	requireHostDir(t, spec, c, cdiDir, false)
	// Everything else is the base's.
	plain := render(t, ".")
	require.Equal(t, plain.configMaps, m.configMaps)
	require.Equal(t, plain.nads, m.nads)
	require.Equal(t, plain.daemonSets[0].Spec.Template.Spec.InitContainers, spec.InitContainers)
}

// TestNodeFeatureRule: NFD's default config labels no ConnectX NIC; the rule
// labels exactly the nodes the DaemonSet selects, and matches the NIC
// functions of the fixture hosts (and nothing else of theirs) the way NFD
// evaluates its pci.device features.
func TestNodeFeatureRule(t *testing.T) {
	m := loadManifests(t)
	rendered := render(t, "nfd")
	require.Equal(t, m.nodeFeatureRules, rendered.nodeFeatureRules)
	require.Len(t, m.nodeFeatureRules, 1)
	r := m.nodeFeatureRules[0]
	require.Empty(t, r.Namespace, "NodeFeatureRule is cluster-scoped")
	require.Len(t, r.Spec.Rules, 1)
	rule := r.Spec.Rules[0]

	terms := nodeTerms(t, &m.daemonSets[0].Spec.Template.Spec)
	require.Contains(t, terms, map[string]string{nfdLabel: "true"})
	require.Equal(t, terms[0], rule.Labels, "the rule sets exactly one of the DaemonSet's node terms")
	require.Empty(t, rule.MatchAny)
	require.Empty(t, rule.Taints)
	require.Empty(t, rule.ExtendedResources)

	for _, tc := range []struct {
		host string
		want []string // PCI addresses matched
	}{
		{"dgx-h100", nil}, // filled below: every NIC function discover lists
		{"roce-cx6dx", nil},
	} {
		t.Run(tc.host, func(t *testing.T) {
			devs := pciDevices(t, filepath.Join("..", "testdata", "sysfs", tc.host))
			var matched, mlx []string
			for addr, attrs := range devs {
				if matchPCI(t, rule.MatchFeatures, attrs) {
					matched = append(matched, addr)
				}
				if attrs["vendor"] == "15b3" && (attrs["class"] == "0200" || attrs["class"] == "0207") {
					mlx = append(mlx, addr)
				}
				// NFD's default labels (classes 03, 0b40, 12) never cover a NIC.
				for _, c := range []string{"03", "0b40", "12"} {
					if attrs["vendor"] == "15b3" && strings.HasPrefix(attrs["class"], c) {
						t.Errorf("%s: class %s is in NFD's default list", addr, attrs["class"])
					}
				}
			}
			require.NotEmpty(t, mlx, "fixture %s has Mellanox NICs", tc.host)
			require.ElementsMatch(t, mlx, matched)
			require.Less(t, len(matched), len(devs), "fixture %s has other PCI functions too (bridges, GPUs)", tc.host)
		})
	}
}

// pciDevices reads each PCI function's vendor and class under a fixture
// host as NFD's pci source does: no "0x", the class cut to base class and
// subclass (4 hex digits).
func pciDevices(t *testing.T, host string) map[string]map[string]string {
	t.Helper()
	dir := filepath.Join(host, "sys", "bus", "pci", "devices")
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	out := map[string]map[string]string{}
	for _, e := range entries {
		attrs := map[string]string{}
		for _, a := range []string{"vendor", "class"} {
			b, err := os.ReadFile(filepath.Join(dir, e.Name(), a))
			require.NoError(t, err)
			v := strings.TrimPrefix(strings.TrimSpace(string(b)), "0x")
			if a == "class" && len(v) > 4 {
				v = v[:4]
			}
			attrs[a] = v
		}
		out[e.Name()] = attrs
	}
	return out
}

// matchPCI evaluates matchFeatures against one pci.device element. Only
// what the rule uses is implemented (feature pci.device, op In); anything
// else fails the test rather than being guessed.
func matchPCI(t *testing.T, terms nfdv1alpha1.FeatureMatcher, attrs map[string]string) bool {
	t.Helper()
	require.NotEmpty(t, terms)
	for _, term := range terms {
		require.Equal(t, "pci.device", term.Feature)
		require.Nil(t, term.MatchName)
		require.NotNil(t, term.MatchExpressions)
		for attr, exp := range *term.MatchExpressions {
			require.Equal(t, nfdv1alpha1.MatchIn, exp.Op, "attribute %s", attr)
			require.Contains(t, []string{"vendor", "class"}, attr)
			if !slices.Contains(exp.Value, attrs[attr]) {
				return false
			}
		}
	}
	return true
}
