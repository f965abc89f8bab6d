// Package version is the identity of a fastpath build. Release builds stamp
// it at link time (the Makefile and the Dockerfile do):
//
//	go build -ldflags "-X github.com/fastpath-k8s/fastpath/internal/version.Version=v0.4.0 \
//	  -X github.com/fastpath-k8s/fastpath/internal/version.Revision=$(git rev-parse HEAD)"
//
// A build that was not stamped falls back to what the Go toolchain recorded
// (the module version of a `go install …@v0.4.0`, the VCS revision of a
// build in a git checkout), then to "devel" and "unknown".
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags -X at build time; empty in a plain `go build`.
var (
	Version  string
	Revision string
)

// Info is what a binary reports about itself.
type Info struct {
	Version   string
	Revision  string
	GoVersion string
}

// Get returns the stamped values, completed from the build info.
func Get() Info {
	bi, _ := debug.ReadBuildInfo()
	return get(Version, Revision, bi)
}

func get(version, revision string, bi *debug.BuildInfo) Info {
	i := Info{Version: version, Revision: revision, GoVersion: runtime.Version()}
	if bi != nil {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		if i.Revision == "" {
			modified := false
			for _, s := range bi.Settings {
				switch s.Key {
				case "vcs.revision":
					i.Revision = s.Value
				case "vcs.modified":
					modified = s.Value == "true"
				}
			}
			if i.Revision != "" && modified {
				i.Revision += "-dirty"
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	if i.Revision == "" {
		i.Revision = "unknown"
	}
	return i
}

// String is "v0.4.0 (revision 1a2b3c…, go1.26.8)".
func (i Info) String() string {
	return fmt.Sprintf("%s (revision %s, %s)", i.Version, i.Revision, i.GoVersion)
}
