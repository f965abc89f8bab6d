package version

import (
	"runtime"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	vcs := &debug.BuildInfo{
		Main:     debug.Module{Path: "github.com/fastpath-k8s/fastpath", Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "true"}},
	}
	tagged := &debug.BuildInfo{Main: debug.Module{Path: "github.com/fastpath-k8s/fastpath", Version: "v0.3.0"}}
	for _, tc := range []struct {
		name              string
		version, revision string
		bi                *debug.BuildInfo
		want              Info
	}{
		{"stamped wins", "v1.2.3", "f00d", vcs, Info{"v1.2.3", "f00d", runtime.Version()}},
		{"vcs revision, dirty", "", "", vcs, Info{"devel", "abc123-dirty", runtime.Version()}},
		{"module version", "", "", tagged, Info{"v0.3.0", "unknown", runtime.Version()}},
		{"nothing known", "", "", nil, Info{"devel", "unknown", runtime.Version()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := get(tc.version, tc.revision, tc.bi)
			require.Equal(t, tc.want, got)
		})
	}
	require.Equal(t, "v1.2.3 (revision f00d, go1.x)", Info{"v1.2.3", "f00d", "go1.x"}.String())
}
