package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"text/tabwriter"
	"time"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/provisioner"
	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Where the CNI keeps what it attached (cmd/sriov-cni's default stateDir).
const defaultCNIStateDir = cnistate.DefaultDir

// provisionFlags say where the policies are and what may be asked about
// the node; serve and the provision subcommand share them.
type provisionFlags struct {
	provisioner.Config
	node nodeFlags
}

func registerProvisionFlags(fs *flag.FlagSet, f *provisionFlags) {
	fs.StringVar(&f.Policy, "policy", "", "SriovNetworkNodePolicy file (YAML or JSON: one, a List, or several documents): create the VFs it asks for before serving, and serve its resourceName pools; empty: no provisioning")
	fs.StringVar(&f.StateDir, "provision-state-dir", provision.DefaultStateDir, "where provisioning keeps its write-ahead record of a PF being changed (keep it on the node: a hostPath)")
	fs.StringVar(&f.CNIStateDir, "cni-state-dir", defaultCNIStateDir, "the sriov CNI's stateDir: a VF it attached to a pod is in use")
	registerNodeFlags(fs, &f.node)
	fs.DurationVar(&f.Timeout, "provision-timeout", provision.DefaultTimeout, "how long one PF's new VFs may take to show their netdevs and RDMA devices")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// newProvisioner wires the flags, the node's labels and the DRA
// checkpoint into the provisioning loop.
func (f provisionFlags) newProvisioner(hostRoot, podResources string, dra func() (map[string]string, error), log *slog.Logger, env nodeEnv) *provisioner.Provisioner {
	return &provisioner.Provisioner{Config: f.Config, HostRoot: hostRoot, PodResources: podResources, DRA: dra, Log: log,
		Labels: func(ctx context.Context) (provisioner.NodeLabels, error) { return f.node.resolve(ctx, env) }}
}

const provisionUsage = "usage: rdma-device-plugin provision --policy FILE [--dry-run] [--host-root DIR] [-o table|json]\n\n" +
	"Creates the VFs the SriovNetworkNodePolicies in FILE ask for on this node (sriov_numvfs,\n" +
	"InfiniBand GUIDs, driver binding, PF MTU), or with --dry-run prints what it would do.\n\n"

func runProvision(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("provision", provisionUsage, stderr)
	var f provisionFlags
	registerProvisionFlags(fs, &f)
	hostRoot := fs.String("host-root", defaultHostRoot(), "directory that stands for / on the node (sysfs at DIR/sys); default $FASTPATH_HOST_ROOT or /")
	podResources := fs.String("pod-resources-socket", plugin.DefaultPodResourcesSocket, "the kubelet's PodResources API, asked which VFs pods hold; empty: do not ask")
	dryRun := fs.Bool("dry-run", false, "print the plan and write nothing")
	output := fs.String("o", "table", "output format: table or json")
	if help, err := parseFlags(fs, args); help || err != nil {
		if errors.Is(err, errStrayArgument) {
			return fmt.Errorf("provision: %w", err)
		}
		return err
	}
	if f.Policy == "" {
		return errors.New("provision: --policy FILE is required")
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("provision: -o %q: want table or json", *output)
	}
	policies, err := provision.Load(f.Policy)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := f.newProvisioner(*hostRoot, *podResources, draPrepared(draFlags{}), log, podEnv())
	p.Policies = policies
	plan, _, err := p.Plan(ctx)
	if err != nil {
		return err
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		r := planReport(plan)
		r.NodeLabels = p.LabelsFrom()
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		writePlan(stdout, plan, !*dryRun)
		fmt.Fprintf(stdout, "node labels: %s\n", p.LabelsFrom())
	}
	if *dryRun {
		return nil
	}
	start := time.Now()
	res, err := p.Apply(ctx, plan)
	if *output == "table" {
		for _, a := range res.Changed {
			fmt.Fprintf(stdout, "%s: done in %s\n", a, res.PerPF[a].Round(time.Millisecond))
		}
		fmt.Fprintf(stdout, "%d PFs changed in %s\n", len(res.Changed), time.Since(start).Round(time.Millisecond))
	}
	return err
}

// pfReport is one PF of a plan as `provision -o json` prints it.
type pfReport struct {
	PF       string   `json:"pf"`
	Netdev   string   `json:"netdev"`
	Policy   string   `json:"policy"`
	NumVFs   int      `json:"numVfs"`
	TotalVFs int      `json:"totalVfs"`
	Want     int      `json:"want"`
	Steps    []string `json:"steps"`
	Refused  string   `json:"refused,omitempty"`
	Warnings []string `json:"warnings,omitempty"`
}

type planJSON struct {
	PFs      []pfReport `json:"pfs"`
	Warnings []string   `json:"warnings"`
	// NodeLabels says where the labels the nodeSelectors were matched
	// against came from (provision only).
	NodeLabels string `json:"nodeLabels,omitempty"`
}

func planReport(plan *provision.Plan) planJSON {
	out := planJSON{PFs: []pfReport{}, Warnings: append([]string{}, plan.Warnings...)}
	for _, pf := range plan.PFs {
		r := pfReport{PF: pf.Address, Netdev: pf.Netdev, Policy: pf.Policy, NumVFs: pf.NumVFs, TotalVFs: pf.TotalVFs,
			Want: pf.Want, Steps: []string{}, Warnings: pf.Warnings}
		for _, s := range pf.Steps {
			r.Steps = append(r.Steps, s.String())
		}
		if pf.Refused != nil {
			r.Refused = pf.Refused.Error()
		}
		out.PFs = append(out.PFs, r)
	}
	return out
}

// writePlan prints one line per PF, then each PF's steps.
func writePlan(w io.Writer, plan *provision.Plan, applying bool) {
	verb := "would"
	if applying {
		verb = "will"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PF\tNETDEV\tPOLICY\tVFS\tWANT\tPLAN")
	for _, pf := range plan.PFs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%d\t%s\n", pf.Address, orDash(pf.Netdev), pf.Policy, pf.NumVFs, pf.TotalVFs, pf.Want, pf.Summary())
	}
	tw.Flush()
	for _, pf := range plan.PFs {
		if len(pf.Steps) > 0 {
			fmt.Fprintf(w, "\n%s %s:\n", pf.Address, verb)
			for i, s := range pf.Steps {
				fmt.Fprintf(w, "  %2d. %s\n", i+1, s)
			}
		}
		for _, warn := range pf.Warnings {
			fmt.Fprintf(w, "warning: %s: %s\n", pf.Address, warn)
		}
	}
	for _, warn := range plan.Warnings {
		fmt.Fprintln(w, "warning:", warn)
	}
	if plan.Changes() == 0 {
		fmt.Fprintln(w, "\nnothing to change")
	}
}
