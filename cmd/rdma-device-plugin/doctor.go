package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/doctor"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
	"github.com/fastpath-k8s/fastpath/internal/version"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// exitError ends the process with a status of its own (doctor: 1 for
// warnings, 2 for failures); main prints its message when there is one.
type exitError struct {
	code int
	msg  string
}

func (e *exitError) Error() string { return e.msg }

// ExitCode is the process's exit status.
func (e *exitError) ExitCode() int { return e.code }

const doctorUsage = `usage: rdma-device-plugin doctor [--host-root /] [--config FILE] [--kubelet-dir DIR]
                                 [--cni-bin-dir /opt/cni/bin] [--cni-conf-dir /etc/cni/net.d]
                                 [--pod PID] [--nccl-log FILE] [-o table|json]

Says why NCCL on this node would use NET/Socket instead of NET/IB, and how to
fix it: kernel modules, /dev/infiniband, VFs and pools, ports and subnet
manager, RoCE GIDs, the RDMA netns mode, the kubelet registration, the sriov
CNI and Multus, GPU-NIC affinity; with --pod, what a pod's container sees and
its NCCL/UCX environment; with --nccl-log, what an NCCL_DEBUG=INFO log says.
Exit status: 0 all ok, 1 warnings only, 2 any failure (or bad usage).

`

func runDoctor(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("doctor", doctorUsage, stderr)
	defRoot := defaultHostRoot()
	hostRoot := fs.String("host-root", defRoot, "directory that stands for / on the node (sysfs at DIR/sys, devices at DIR/dev); default $FASTPATH_HOST_ROOT or /")
	configPath := fs.String("config", defaultConfig, "pool config file; when the default is missing, the checks cover every function with an RDMA device")
	kubeletDir := fs.String("kubelet-dir", defaultKubeletDir, "the kubelet's device plugin directory (empty: skip the kubelet checks)")
	// The plugin's container has the node's CNI bin_dir under
	// FASTPATH_HOST_ROOT too (not its conf_dir: that holds Multus's
	// kubeconfig).
	cniBin := fs.String("cni-bin-dir", filepath.Join(defRoot, "opt/cni/bin"), "the container runtime's CNI bin_dir (empty: skip); default $FASTPATH_HOST_ROOT/opt/cni/bin or /opt/cni/bin")
	cniConf := fs.String("cni-conf-dir", "/etc/cni/net.d", "the container runtime's CNI conf_dir (empty: skip)")
	pid := fs.Int("pod", 0, "PID of a process in the pod's container to inspect (run on the node, as root)")
	ncclLog := fs.String("nccl-log", "", "an NCCL_DEBUG=INFO log to explain")
	output := fs.String("o", "table", "output format: table or json")
	policyPath := fs.String("policy", "", "SriovNetworkNodePolicy file: say where the node and the policies disagree, and why")
	var node nodeFlags
	registerNodeFlags(fs, &node)
	usage := func(format string, a ...any) error {
		return &exitError{code: 2, msg: "doctor: " + fmt.Sprintf(format, a...)}
	}
	switch help, err := parseFlags(fs, args); {
	case help:
		return nil
	case errors.Is(err, errStrayArgument):
		return usage("%v", err)
	case err != nil:
		return &exitError{code: 2} // the flag package said why
	}
	if *output != "table" && *output != "json" {
		return usage("-o %q: want table or json", *output)
	}
	if *pid < 0 {
		return usage("--pod %d: want a process ID", *pid)
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	o := doctor.Options{
		HostRoot: *hostRoot, ConfigPath: *configPath, KubeletDir: *kubeletDir,
		CNIBinDir: *cniBin, CNIConfDir: *cniConf, PodPID: *pid, NCCLLog: *ncclLog,
	}
	if *configPath != "" {
		cfg, err := pool.Load(*configPath)
		switch {
		case err == nil:
			o.Config = cfg
		case errors.Is(err, pool.ErrNoConfig) && !set["config"]:
			o.ConfigPath = "" // the default is not there: no config
		default:
			o.ConfigErr = err
		}
	}
	if *policyPath != "" {
		ps, err := provision.Load(*policyPath)
		if err != nil {
			return usage("%v", err)
		}
		if _, err := parseLabels(node.labels); err != nil {
			return usage("%v", err)
		}
		f := provisionFlags{Config: provisioner.Config{Policy: *policyPath, StateDir: provision.DefaultStateDir, CNIStateDir: defaultCNIStateDir}, node: node}
		p := f.newProvisioner(*hostRoot, plugin.DefaultPodResourcesSocket, draPrepared(draFlags{}), slog.New(slog.DiscardHandler), podEnv())
		p.Policies = ps
		if plan, _, err := p.Plan(ctx); err == nil {
			o.Plan, o.PolicyPath = plan, *policyPath
		}
	}
	if doctor.IsFixture(*hostRoot) {
		// A fixture has no kubelet or CNI: this machine's directories
		// say nothing of it, so only the ones named are checked.
		o.Fixture = true
		for flagName, dir := range map[string]*string{"kubelet-dir": &o.KubeletDir, "cni-bin-dir": &o.CNIBinDir, "cni-conf-dir": &o.CNIConfDir} {
			if !set[flagName] {
				*dir = ""
			}
		}
	}
	if doctor.SameKernel(*hostRoot) {
		o.Kernel = doctor.NewKernel()
	}
	v := version.Get()
	o.Build = doctor.Build{Version: v.Version, Revision: v.Revision}
	if o.Build.Revision == "unknown" {
		o.Build.Revision = ""
	}
	r := doctor.Run(o)
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		writeDoctorTable(stdout, r)
	}
	if code := r.ExitCode(); code != 0 {
		return &exitError{code: code}
	}
	return nil
}

// statusWord is how the table shows a status.
var statusWord = map[doctor.Status]string{doctor.Fail: "FAIL", doctor.Warn: "WARN", doctor.Skip: "SKIP", doctor.OK: "ok"}

// writeDoctorTable prints one line per check, failures first, the fix
// beside the finding, and a count.
func writeDoctorTable(w io.Writer, r *doctor.Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STATUS\tCHECK\tSUBJECT\tFINDING → FIX")
	for _, c := range r.Sorted() {
		finding := oneLine(c.Message)
		if c.Fix != "" {
			finding += " → " + oneLine(c.Fix)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", statusWord[c.Status], c.Name, dash(c.Subject), finding)
	}
	tw.Flush()
	fmt.Fprintf(w, "\n%d failed, %d warnings, %d skipped, %d ok\n",
		r.Count(doctor.Fail), r.Count(doctor.Warn), r.Count(doctor.Skip), r.Count(doctor.OK))
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
