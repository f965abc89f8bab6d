package docscheck_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// layoutPaths are the paths docs/architecture.md's Layout table names in
// its first column, in backticks.
func layoutPaths(t *testing.T, page string) map[string]bool {
	t.Helper()
	_, rest, ok := strings.Cut(page, "\n## Layout\n")
	require.True(t, ok, "docs/architecture.md has no ## Layout section")
	rest, _, _ = strings.Cut(rest, "\n## ")
	quoted := regexp.MustCompile("`([^`]+)`")
	named := map[string]bool{}
	for _, line := range strings.Split(rest, "\n") {
		cells := strings.Split(line, "|")
		if !strings.HasPrefix(line, "|") || len(cells) < 3 {
			continue
		}
		for _, m := range quoted.FindAllStringSubmatch(cells[1], -1) {
			named[m[1]] = true
		}
	}
	return named
}

// TestArchitectureNamesEveryPackage: every package of the module (go list
// ./...) has a line in docs/architecture.md's Layout table, and every path
// the table names exists.
func TestArchitectureNamesEveryPackage(t *testing.T) {
	root := repoRoot(t)
	page, err := os.ReadFile(filepath.Join(root, "docs", "architecture.md"))
	require.NoError(t, err)
	named := layoutPaths(t, string(page))
	require.NotEmpty(t, named)

	cmd := exec.Command("go", "list", "-f", "{{.Dir}}", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	require.NoError(t, err, "go list ./...")
	var missing []string
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		require.NoError(t, err)
		if !named[filepath.ToSlash(rel)] {
			missing = append(missing, filepath.ToSlash(rel))
		}
	}
	require.Empty(t, missing, "packages with no line in docs/architecture.md's Layout table: add a row saying what each is")

	var gone []string
	for p := range named {
		if _, err := os.Stat(filepath.Join(root, filepath.FromSlash(p))); err != nil {
			gone = append(gone, p)
		}
	}
	require.Empty(t, gone, "docs/architecture.md's Layout table names paths that do not exist: remove or rename their rows")
}

func TestLayoutPaths(t *testing.T) {
	page := "# A\n\n## Layout\n\n| path | what |\n|---|---|\n| `pkg/a`, `pkg/b` | two, see `pkg/c` |\n| `cmd/x` | x |\n\n## Next\n\n| `pkg/z` | not the layout |\n"
	require.Equal(t, map[string]bool{"pkg/a": true, "pkg/b": true, "cmd/x": true}, layoutPaths(t, page))
}
