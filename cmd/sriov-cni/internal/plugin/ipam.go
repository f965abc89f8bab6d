package plugin

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
)

// ipamExec runs IPAM plugins for libcni's invoke package. Their stderr goes
// to the plugin's own Stderr; they inherit the VF's lock, so that an IPAM
// ADD orphaned by a kill of this plugin holds the VF until it has finished
// and the DEL that follows releases what it allocated, not less; and a
// failure always says what happened and never carries code 0 (which
// libcni's own exec gives a plugin that died or printed no JSON error).
type ipamExec struct {
	stderr io.Writer
	lock   *os.File
	// env is added to the plugin's environment.
	env []string
}

var _ invoke.Exec = (*ipamExec)(nil)

// maxQuoted bounds what an error quotes of a plugin's output.
const maxQuoted = 512

func quote(b []byte) string {
	if len(b) > maxQuoted {
		return fmt.Sprintf("%q… (%d bytes)", b[:maxQuoted], len(b))
	}
	return fmt.Sprintf("%q", b)
}

func (e *ipamExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path)
	cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = append(environ, e.env...), bytes.NewReader(stdin), &stdout, &stderr
	if e.lock != nil {
		cmd.ExtraFiles = []*os.File{e.lock}
	}
	runErr := cmd.Run()
	if stderr.Len() > 0 && e.stderr != nil {
		fmt.Fprintf(e.stderr, "%s: %s", filepath.Base(path), stderr.Bytes())
	}
	if runErr == nil {
		return stdout.Bytes(), nil
	}
	name := filepath.Base(path)
	out := bytes.TrimSpace(stdout.Bytes())
	if len(out) == 0 {
		return nil, fmt.Errorf("%s failed (%v) without output; stderr: %s", name, runErr, quote(bytes.TrimSpace(stderr.Bytes())))
	}
	var perr types.Error
	if err := json.Unmarshal(out, &perr); err != nil {
		return nil, fmt.Errorf("%s failed (%v) and printed no JSON error: %s", name, runErr, quote(out))
	}
	if perr.Code == 0 {
		return nil, fmt.Errorf("%s failed (%v) with an error without a code: %s", name, runErr, perr.Error())
	}
	return nil, &perr
}

func (e *ipamExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (e *ipamExec) Decode(jsonBytes []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(jsonBytes)
}

// ipamCall runs the conf's IPAM plugin for one attachment, with the
// attachment's own arguments (not the process environment, so that GC can
// release other attachments). lock, when held, is inherited.
func (p *Plugin) ipamCall(ctx context.Context, cmd string, args *skel.CmdArgs, ipamType string, lock *Lock) (types.Result, error) {
	plugin, err := invoke.FindInPath(ipamType, filepath.SplitList(args.Path))
	if err != nil {
		return nil, fmt.Errorf("IPAM plugin %q: %w", ipamType, err)
	}
	a := &invoke.Args{Command: cmd, ContainerID: args.ContainerID, NetNS: args.Netns, IfName: args.IfName,
		PluginArgsStr: args.Args, Path: args.Path}
	e := &ipamExec{stderr: p.Stderr}
	if lock != nil {
		e.lock = lock.File()
	}
	if cmd == "DEL" {
		// Releasing needs no netns, and a state an older plugin wrote
		// may name the host's, which skel would refuse forever.
		e.env = []string{"CNI_NETNS_OVERRIDE=1"}
	}
	if cmd == "ADD" {
		return invoke.ExecPluginWithResult(ctx, plugin, args.StdinData, a, e)
	}
	return nil, invoke.ExecPluginWithoutResult(ctx, plugin, args.StdinData, a, e)
}

// ipamAdd runs IPAM ADD and puts its addresses, routes and DNS into res.
func (p *Plugin) ipamAdd(ctx context.Context, c *NetConf, args *skel.CmdArgs, res *current.Result, vfio bool, lock *Lock) error {
	r, err := p.ipamCall(ctx, "ADD", args, c.IPAM.Type, lock)
	if err != nil {
		return err
	}
	ipRes, err := current.NewResultFromResult(r)
	if err != nil {
		return fmt.Errorf("result: %w", err)
	}
	if len(ipRes.IPs) == 0 && !vfio {
		return fmt.Errorf("returned no IP address")
	}
	for _, ipc := range ipRes.IPs {
		ipc.Interface = current.Int(0)
	}
	res.IPs, res.Routes, res.DNS = ipRes.IPs, ipRes.Routes, ipRes.DNS
	return nil
}

// ipamDel releases the attachment's address. A plugin that is not
// installed allocated nothing: failing would only make the runtime retry
// DEL forever.
func (p *Plugin) ipamDel(ctx context.Context, args *skel.CmdArgs, ipamType string, lock *Lock) error {
	if _, err := invoke.FindInPath(ipamType, filepath.SplitList(args.Path)); err != nil {
		return nil
	}
	if _, err := p.ipamCall(ctx, "DEL", args, ipamType, lock); err != nil {
		return fmt.Errorf("IPAM %s DEL: %w", ipamType, err)
	}
	return nil
}
