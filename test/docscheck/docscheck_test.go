package docscheck_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"sigs.k8s.io/yaml"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/test/docscheck"
)

func TestMain(m *testing.M) {
	code := m.Run()
	testbin.Cleanup()
	os.Exit(code)
}

// repoRoot is the module root, two levels up from this package.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	require.NoError(t, err)
	require.FileExists(t, filepath.Join(root, "go.mod"))
	return root
}

// docFiles are README.md and every page of docs/.
func docFiles(t *testing.T, root string) []string {
	t.Helper()
	pages, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	require.NoError(t, err)
	require.NotEmpty(t, pages, "docs/ has no pages")
	files := []string{"README.md", "deployments/README.md", "test/e2e/README.md", "test/e2e-cluster/README.md"}
	for _, p := range pages {
		files = append(files, "docs/"+filepath.Base(p))
	}
	sort.Strings(files[4:])
	return files
}

// help runs bin with args and --help, with an empty environment (the CNI
// reads CNI_COMMAND from it), and returns what it printed.
func help(t *testing.T, bin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(bin, append(args, "--help")...)
	cmd.Env = []string{}
	out, _ := cmd.CombinedOutput() // --help's exit status is the flag package's business
	require.NotEmpty(t, out, "%s %v --help printed nothing", bin, args)
	return string(out)
}

// knownFlags builds the binaries as `make build` does and reads each
// command's flags from its --help: the lean build for rdma-device-plugin
// (it has no DRA flags), the DRA build for rdma-device-plugin-dra.
func knownFlags(t *testing.T) map[string]map[string]bool {
	t.Helper()
	lean := testbin.BuildWith(t, testbin.Flags{Tags: "grpcnotrace,nodra"}, "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin")
	dra := testbin.BuildWith(t, testbin.Flags{Tags: "grpcnotrace"},
		"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin=rdma-device-plugin-dra",
		"github.com/fastpath-k8s/fastpath/cmd/sriov-cni=sriov")
	bins := map[string]string{
		"rdma-device-plugin":     filepath.Join(lean, "rdma-device-plugin"),
		"rdma-device-plugin-dra": filepath.Join(dra, "rdma-device-plugin-dra"),
		"sriov":                  filepath.Join(dra, "sriov"),
	}
	flags := map[string]map[string]bool{}
	for name, subs := range docscheck.Commands {
		flags[name] = docscheck.ParseHelp(help(t, bins[name]))
		for _, sub := range subs {
			flags[name+" "+sub] = docscheck.ParseHelp(help(t, bins[name], sub))
		}
	}
	// The flag package answers -h and -help of every flag set without
	// listing them; the CNI reads no arguments at all.
	for cmd, f := range flags {
		if strings.HasPrefix(cmd, "rdma-device-plugin") {
			f["h"], f["help"] = true, true
		}
	}
	return flags
}

// The real docs against the real Makefile and binaries.
func TestDocs(t *testing.T) {
	root := repoRoot(t)
	mk, err := os.ReadFile(filepath.Join(root, "Makefile"))
	require.NoError(t, err)
	k := docscheck.Known{MakeTargets: docscheck.ParseMakefile(string(mk)), Flags: knownFlags(t)}

	// The inputs are what they should be, or every check below would pass
	// (or fail) for the wrong reason.
	require.True(t, k.MakeTargets["test"] && k.MakeTargets["demo"] && k.MakeTargets["e2e-cluster"], "Makefile targets: %v", k.MakeTargets)
	require.True(t, k.Flags["rdma-device-plugin"]["host-root"], "rdma-device-plugin --help: %v", k.Flags["rdma-device-plugin"])
	require.False(t, k.Flags["rdma-device-plugin"]["kubeconfig"], "the lean build has no DRA flags")
	require.True(t, k.Flags["rdma-device-plugin-dra"]["kubeconfig"])
	require.True(t, k.Flags["rdma-device-plugin doctor"]["nccl-log"])
	require.True(t, k.Flags["rdma-device-plugin discover"]["o"])
	require.Empty(t, k.Flags["sriov"], "the CNI takes no flags (its input is the environment and stdin)")

	for _, p := range docscheck.Check(os.DirFS(root), docFiles(t, root), k) {
		t.Error(p)
	}
}

func TestReadmeShort(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "README.md"))
	require.NoError(t, err)
	n := strings.Count(string(b), "\n")
	require.LessOrEqual(t, n, 200, "README.md has %d lines: move the detail into docs/", n)
}

// The README shows deployments/'s NetworkAttachmentDefinition and
// example training pod as they are (comments aside).
func TestReadmeExample(t *testing.T) {
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	_, rest, ok := strings.Cut(string(b), "\n```yaml\n")
	require.True(t, ok, "README.md has no yaml block")
	block, _, ok := strings.Cut(rest, "\n```\n")
	require.True(t, ok)
	docs := strings.Split(block, "\n---\n")
	require.Len(t, docs, 2)
	for i, f := range []string{"30-network-attachment.yaml", "examples/training-pod.yaml"} {
		shipped, err := os.ReadFile(filepath.Join(root, "deployments", f))
		require.NoError(t, err)
		want, err := yaml.YAMLToJSON(shipped)
		require.NoError(t, err)
		got, err := yaml.YAMLToJSON([]byte(docs[i] + "\n")) // the newline the split took
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(got), "README.md's example differs from deployments/%s", f)
	}
}

// helpPages are the pages that document each command's flags: every flag
// its --help lists is there. rdma-device-plugin-dra's are its DRA flags
// (the others are rdma-device-plugin's, on that command's page).
var helpPages = map[string]string{
	"rdma-device-plugin":             "docs/device-plugin.md",
	"rdma-device-plugin serve":       "docs/device-plugin.md",
	"rdma-device-plugin discover":    "docs/install.md",
	"rdma-device-plugin doctor":      "docs/troubleshooting.md",
	"rdma-device-plugin provision":   "docs/vfs.md",
	"rdma-device-plugin install-cni": "docs/install.md",
	"rdma-device-plugin uninstall":   "docs/install.md",
	"rdma-device-plugin-dra":         "docs/dra.md",
}

// Every flag of every --help is documented on its command's page (the
// other direction, every documented flag exists, is TestDocs').
func TestEveryHelpFlagDocumented(t *testing.T) {
	root := repoRoot(t)
	flags := knownFlags(t)
	for cmd, fs := range flags {
		if cmd == "sriov" {
			require.Empty(t, fs, "the CNI takes flags now: give it a page in helpPages")
			continue
		}
		page, ok := helpPages[cmd]
		if !ok {
			// The DRA build's subcommands are the lean build's.
			require.True(t, strings.HasPrefix(cmd, "rdma-device-plugin-dra "), "%s: no page in helpPages", cmd)
			continue
		}
		b, err := os.ReadFile(filepath.Join(root, page))
		require.NoError(t, err)
		for f := range fs {
			if f == "h" || f == "help" || cmd == "rdma-device-plugin-dra" && flags["rdma-device-plugin"][f] {
				continue
			}
			re := regexp.MustCompile(`(^|[\s` + "`" + `\[(])--?` + regexp.QuoteMeta(f) + `([^A-Za-z0-9-]|$)`)
			if !re.Match(b) {
				t.Errorf("%s --help has --%s, which %s does not document", cmd, f, page)
			}
		}
	}
}
