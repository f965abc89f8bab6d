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
	"strings"
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
	return BuildWith(tb, Flags{}, pkgs...)
}

// Flags are how BuildWith builds.
type Flags struct {
	Tags string // go build -tags
	// Release builds as the Dockerfile does: static (CGO_ENABLED=0),
	// -trimpath, no symbol table or DWARF (-ldflags "-s -w").
	Release bool
}

// BuildWith is Build with f. Each set of flags has its own directory.
func BuildWith(tb testing.TB, f Flags, pkgs ...string) string {
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
	out := dir
	if f != (Flags{}) {
		out = filepath.Join(dir, fmt.Sprintf("tags=%s,release=%t", f.Tags, f.Release))
	}
	for _, p := range pkgs {
		name := path.Base(p)
		for i := len(p) - 1; i >= 0; i-- {
			if p[i] == '=' {
				p, name = p[:i], p[i+1:]
				break
			}
		}
		bin := filepath.Join(out, name)
		err, done := built[bin]
		if !done {
			args := []string{"build", "-buildvcs=false", "-o", bin}
			if f.Tags != "" {
				args = append(args, "-tags", f.Tags)
			}
			if f.Release {
				args = append(args, "-trimpath", "-ldflags", "-s -w")
			}
			cmd := exec.Command("go", append(args, p)...)
			if f.Release {
				cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
			}
			if b, cerr := cmd.CombinedOutput(); cerr != nil {
				err = fmt.Errorf("go %s: %v\n%s", strings.Join(args, " "), cerr, b)
			}
			built[bin] = err
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	return out
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

// Output is what a running process printed: its writes (the process's
// output goroutines) and the test's reads may come at the same time.
type Output struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.Write(p)
}

func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.b.String()
}
