package docscheck_test

import (
	"strings"
	"testing"
	"testing/fstest"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/test/docscheck"
)

// A small repository: two pages, a file and a directory to link to.
var baseFS = map[string]string{
	"docs/other.md":         "# Other page\n\n## Set-up: `make demo`\n\n## Twice\n\n## Twice\n",
	"deployments/README.md": "# Deploying\n",
	"Makefile":              "x",
}

var smallKnown = docscheck.Known{
	MakeTargets: map[string]bool{"demo": true, "test": true, "e2e-cluster": true},
	Flags: map[string]map[string]bool{
		"rdma-device-plugin":          {"host-root": true, "config": true, "version": true},
		"rdma-device-plugin doctor":   {"host-root": true, "nccl-log": true, "pod": true, "o": true},
		"rdma-device-plugin discover": {"host-root": true, "config": true, "o": true},
		"rdma-device-plugin serve":    {"host-root": true, "config": true, "version": true},
		"rdma-device-plugin-dra":      {"host-root": true, "kubeconfig": true},
		"sriov":                       {},
	},
}

const (
	fence       = "```"
	flagsMarker = "<!-- docscheck: flags rdma-device-plugin -->"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		name string
		page string // docs/page.md
		want string // a problem's text; "" for none
	}{
		// Links and anchors.
		{"good links", "[a](other.md) [b](other.md#set-up-make-demo) [c](../deployments/README.md) [d](../deployments/) [e](#top) [f](https://example.com/x#y)\n\n# Top\n", ""},
		{"broken link", "See [the page](missing.md).\n", `link "missing.md": no such file`},
		{"broken link across lines", "See [the\npage](../deployment/README.md).\n", `no such file or directory deployment/README.md`},
		{"link out of the repository", "[x](../../etc/passwd)\n", "leaves the repository"},
		{"broken anchor in the page", "[x](#nowhere)\n\n# Somewhere\n", "docs/page.md has no heading with anchor #nowhere"},
		{"broken anchor on another page", "[x](other.md#set-up)\n", "docs/other.md has no heading with anchor #set-up"},
		{"duplicate heading's anchor", "[x](other.md#twice-1)\n", ""},
		{"no third duplicate", "[x](other.md#twice-2)\n", "no heading with anchor #twice-2"},
		{"anchor on a non-Markdown file", "[x](../Makefile#targets)\n", "not Markdown"},
		{"line anchor on a file", "[x](../Makefile#L10-L12)\n", ""},
		{"link in a code span is not a link", "`[x](missing.md)`\n", ""},
		{"link in a code block is not a link", fence + "\n[x](missing.md)\n" + fence + "\n", ""},
		{"heading slug: punctuation and code", "[x](#the-device-plugin-rdma-device-plugin) [y](#a-pods-claims)\n\n## The device plugin (`rdma-device-plugin`)\n\n### A pod's claims\n", ""},
		{"spans of several backticks", "A ```` ```json ```` block, `` `x` `` and `make demos` here.\n", "make demos: no such target"},
		{"an unclosed backtick is text", "a ` b [x](missing.md)\n", `link "missing.md"`},
		{"html anchor", `[x](#here)` + "\n\n<a id=\"here\"></a>\n", ""},

		// make targets.
		{"good make targets", "`make demo`, `sudo make test`, `BENCH=x make e2e-cluster`; make sure.\n\n" + fence + "sh\nmake demo   # the demo\n" + fence + "\n", ""},
		{"stale make target in a span", "Run `make demos`.\n", "make demos: no such target"},
		{"stale make target in a shell block", fence + "sh\ncd x && make e2e-clusters\n" + fence + "\n", "make e2e-clusters: no such target"},
		{"make target in a json block is not a command", fence + "json\n{\"a\": \"make nothing\"}\n" + fence + "\n", ""},

		// Flags.
		{"good flags", "`rdma-device-plugin doctor --nccl-log FILE -o json`, `bin/rdma-device-plugin --host-root=/host`, `--config`, `--pod PID`, `go build -tags nodra`, `udevadm trigger --action=add`\n", ""},
		{"stale flag of a subcommand", "`rdma-device-plugin doctor --nccl-logs FILE`\n", "rdma-device-plugin doctor --nccl-logs: no such flag"},
		{"flag of another subcommand", "`rdma-device-plugin discover --nccl-log x`\n", "rdma-device-plugin discover --nccl-log: no such flag"},
		{"DRA flag on the lean binary", "`rdma-device-plugin --kubeconfig k`\n", "rdma-device-plugin --kubeconfig: no such flag"},
		{"DRA flag on the DRA binary", "`rdma-device-plugin-dra --kubeconfig k`\n", ""},
		{"stale flag in a span across lines", "`rdma-device-plugin discover --host-root x\n--configs y`\n", "rdma-device-plugin discover --configs"},
		{"stale bare flag", flagsMarker + "\nSet `--host-roots /host`.\n", "--host-roots: no such flag of rdma-device-plugin"},
		{"a bare flag is another program's without a marker", "The kubelet's `--root-dir`.\n", ""},
		{"bare flag of the marker's second command", "<!-- docscheck: flags rdma-device-plugin, rdma-device-plugin doctor -->\n`--nccl-log`\n", ""},
		{"bare flag of a command the marker does not name", flagsMarker + "\n`--nccl-log`\n", "--nccl-log: no such flag of rdma-device-plugin"},
		{"marker naming an unknown command", "<!-- docscheck: flags rdma-device-plugin dance -->\n", `"rdma-device-plugin dance" is not a command`},
		{"two flags markers", flagsMarker + "\n" + flagsMarker + "\n", "a second flags marker"},
		{"stale flag after go run", fence + "sh\ngo run ./cmd/rdma-device-plugin discover --hostroot x\n" + fence + "\n", "rdma-device-plugin discover --hostroot"},
		{"stale flag on a continuation line", fence + "sh\nsudo rdma-device-plugin doctor --host-root /x \\\n    --kubelet-dirs \"\"\n" + fence + "\n", "rdma-device-plugin doctor --kubelet-dirs"},
		{"stale flag in a usage synopsis", fence + "\nrdma-device-plugin doctor [--host-root /]\n                          [--pods PID]\n" + fence + "\n", "rdma-device-plugin doctor --pods"},
		{"stale flag after kubectl exec", "`kubectl exec -n fastpath ds/rdma-device-plugin -- rdma-device-plugin doctor --nccl FILE`\n", "rdma-device-plugin doctor --nccl:"},
		{"flags after a comment are not flags", fence + "sh\nrdma-device-plugin doctor   # --anything goes here\n" + fence + "\n", ""},
		{"the CNI has no flags", "`/opt/cni/bin/sriov --debug`\n", "sriov --debug: no such flag"},

		// JSON and YAML.
		{"good json", fence + "json\n{\"a\": [1, 2]}\n" + fence + "\n", ""},
		{"broken json", fence + "json\n{\"a\": [1, 2}\n" + fence + "\n", "json block:"},
		{"two json values", fence + "json\n{} {}\n" + fence + "\n", "more than one JSON value"},
		{"good pool config", fence + "json\n{\"resourceList\": [{\"resourceName\": \"vf\", \"selectors\": {\"vendors\": [\"15b3\"]}}]}\n" + fence + "\n", ""},
		{"pool config that does not load", fence + "json\n{\"resourceList\": [{\"resourceName\": \"vf\", \"selectors\": {\"drivers\": [\"mlx5_ib\"]}}]}\n" + fence + "\n", "a pool config that does not load"},
		{"pool config key spelled as the operator does", fence + "json\n{\"ConfigList\": [{\"resourceName\": \"hca\"}]}\n" + fence + "\n", "rdmaHcaMax is required"},
		{"good multi-document yaml", fence + "yaml\na: 1\n---\nb: [x, y]\n" + fence + "\n", ""},
		{"broken second yaml document", fence + "yaml\na: 1\n---\nb: [x, y\n" + fence + "\n", "yaml block: document 2"},
		{"duplicate yaml key", fence + "yaml\na: 1\na: 2\n" + fence + "\n", "yaml block: document 1"},
		{"skip marker", docscheck.SkipMarker + "\n" + fence + "json\n{broken\n" + fence + "\n", ""},
		{"skip marker not before a block", docscheck.SkipMarker + "\nprose\n\n" + fence + "json\n{}\n" + fence + "\n", "is not followed by a code block"},
		{"skip marker at the end", "text\n\n" + docscheck.SkipMarker + "\n", "is not followed by a code block"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{"docs/page.md": {Data: []byte(tc.page)}}
			for p, s := range baseFS {
				fsys[p] = &fstest.MapFile{Data: []byte(s)}
			}
			got := docscheck.Check(fsys, []string{"docs/page.md"}, smallKnown)
			if tc.want == "" {
				require.Empty(t, got)
				return
			}
			require.Len(t, got, 1, "%v", got)
			require.Contains(t, got[0].String(), tc.want)
			require.True(t, strings.HasPrefix(got[0].String(), "docs/page.md:"), got[0].String())
		})
	}
}

func TestProblemLine(t *testing.T) {
	page := "# T\n\ntext\n\nmore [x](nowhere.md)\n"
	got := docscheck.Check(fstest.MapFS{"p.md": {Data: []byte(page)}}, []string{"p.md"}, smallKnown)
	require.Len(t, got, 1)
	require.Equal(t, 5, got[0].Line)
}

func TestSlug(t *testing.T) {
	for h, want := range map[string]string{
		"Troubleshooting: `rdma-device-plugin doctor`": "troubleshooting-rdma-device-plugin-doctor",
		"CHECK, STATUS and GC":                         "check-status-and-gc",
		"`make e2e`: the kubelet, containerd and runc": "make-e2e-the-kubelet-containerd-and-runc",
		"Shared HCAs: `configList`":                    "shared-hcas-configlist",
		"A [linked](x.md) heading_name":                "a-linked-heading_name",
		"Ünïcode — dash":                               "ünïcode--dash",
	} {
		require.Equal(t, want, docscheck.Slug(h), h)
	}
}

func TestMakeTargets(t *testing.T) {
	require.Equal(t, []string{"demo"}, docscheck.MakeTargets("sudo make demo   # the demo"))
	require.Equal(t, []string{"bench"}, docscheck.MakeTargets("make bench BENCH=Discover | tee x"))
	require.Equal(t, []string{"lint", "build"}, docscheck.MakeTargets("make -j2 lint build"))
	require.Empty(t, docscheck.MakeTargets("makes no target; remake nothing"))
}

func TestParseMakefile(t *testing.T) {
	got := docscheck.ParseMakefile(".PHONY: all test\nGO ?= go\nSHELL := bash\nall: lint build\n\t$(GO) build\ntest:\n# comment: no\ne2e e2e-cluster:\n\tx\n")
	require.Equal(t, map[string]bool{"all": true, "test": true, "e2e": true, "e2e-cluster": true}, got)
}

func TestParseHelp(t *testing.T) {
	h := "usage: rdma-device-plugin doctor [--host-root /]\n                                 [--pod PID] [-o table|json]\n\n  -config string\n    \tpool config (default \"x\")\n  -o string\n    \toutput -format\n  -use-cdi\n    \twrite CDI specs\n"
	require.Equal(t, map[string]bool{"config": true, "o": true, "use-cdi": true}, docscheck.ParseHelp(h))
}
