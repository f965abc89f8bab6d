// Package testbin builds Go commands for tests that run real binaries:
// this module's own and the CNI reference plugins pinned in go.mod's tool
// block. Each is built once per test process.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

var (
	mu    sync.Mutex // guards the fields below
	dir   string
	built = map[string]error{}
)

// Reference CNI plugins (go.mod tool block).
const (
	HostLocal  = "github.com/containernetworking/plugins/plugins/ipam/host-local"
	Static     = "github.com/containernetworking/plugins/plugins/ipam/static"
	HostDevice = "github.com/containernetworking/plugins/plugins/main/host-device"
	CNITool    = "github.com/containernetworking/cni/cnitool"
)

// Build builds each package (an import path; the binary is named after its
// last element, or renamed with "pkg=name") into one directory and returns
// it: a CNI_PATH.
func Build(tb testing.TB, pkgs ...string) string {
	tb.Helper()
	mu.Lock()
	defer mu.Unlock()
	if dir == "" {
		d, err := os.MkdirTemp("", "fastpath-testbin-")
		if err != nil {
			tb.Fatal(err)
		}
		dir = d
	}
	for _, p := range pkgs {
		name := path.Base(p)
		for i := len(p) - 1; i >= 0; i-- {
			if p[i] == '=' {
				p, name = p[:i], p[i+1:]
				break
			}
		}
		err, done := built[name]
		if !done {
			out, cerr := exec.Command("go", "build", "-buildvcs=false", "-o", filepath.Join(dir, name), p).CombinedOutput()
			if cerr != nil {
				err = fmt.Errorf("go build %s: %v\n%s", p, cerr, out)
			}
			built[name] = err
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	return dir
}

// Cleanup removes the binaries; call it from TestMain after m.Run.
func Cleanup() {
	mu.Lock()
	defer mu.Unlock()
	if dir != "" {
		os.RemoveAll(dir)
		dir = ""
		built = map[string]error{}
	}
}
