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

	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// Where the CNI keeps what it attached (cmd/sriov-cni's default stateDir).
const defaultCNIStateDir = cnistate.DefaultDir

// provisionFlags say where the policies are and what may be asked about
// the node; serve and the provision subcommand share them.
type provisionFlags struct {
	policy, stateDir, cniStateDir string
	node                          nodeFlags
	timeout                       time.Duration
	retry                         time.Duration // serve only
}

func registerProvisionFlags(fs *flag.FlagSet, f *provisionFlags) {
	fs.StringVar(&f.policy, "policy", "", "SriovNetworkNodePolicy file (YAML or JSON: one, a List, or several documents): create the VFs it asks for before serving, and serve its resourceName pools; empty: no provisioning")
	fs.StringVar(&f.stateDir, "provision-state-dir", provision.DefaultStateDir, "where provisioning keeps its write-ahead record of a PF being changed (keep it on the node: a hostPath)")
	fs.StringVar(&f.cniStateDir, "cni-state-dir", defaultCNIStateDir, "the sriov CNI's stateDir: a VF it attached to a pod is in use")
	registerNodeFlags(fs, &f.node)
	fs.DurationVar(&f.timeout, "provision-timeout", provision.DefaultTimeout, "how long one PF's new VFs may take to show their netdevs and RDMA devices")
}

// inUse names who holds each VF, from every place that says: the
// kubelet's PodResources, the CNI's state and the DRA checkpoint. A
// source that cannot be read (other than a kubelet that is not there)
// holds every VF on the node: nothing in use is changed on a guess.
func inUse(ctx context.Context, snap *nic.Snapshot, podResources, cniStateDir string, dra func() (map[string]string, error)) (map[string]string, []string) {
	out := map[string]string{}
	var warns []string
	unknown := func(what string, err error) {
		warns = append(warns, fmt.Sprintf("%s: %v: every VF counts as in use", what, err))
		for _, d := range snap.Devices {
			if d.IsVF() {
				out[d.PCIAddress] = "unknown (" + what + " unreadable)"
			}
		}
	}
	if podResources != "" {
		held, err := plugin.KubeletPodResources{Socket: podResources}.Holders(ctx)
		switch {
		case errors.Is(err, plugin.ErrNoPodResources):
			warns = append(warns, fmt.Sprintf("no kubelet PodResources socket at %s: pods' VFs are not known", podResources))
		case err != nil:
			unknown("PodResources", err)
		}
		for id, who := range held {
			if pci.ValidAddress(id) {
				out[id] = who
			}
		}
	}
	// A VF a pod was allocated is also the CNI's attachment: both are
	// named, the pod first.
	add := func(a, who string) {
		if prev, ok := out[a]; ok && prev != who {
			who = prev + "; " + who
		}
		out[a] = who
	}
	if cniStateDir != "" {
		held, err := cnistate.Attached(cniStateDir)
		if err != nil {
			unknown("CNI state "+cniStateDir, err)
		}
		for a, who := range held {
			add(a, who)
		}
	}
	if dra != nil {
		held, err := dra()
		if err != nil {
			unknown("DRA checkpoint", err)
		}
		for a, who := range held {
			add(a, who)
		}
	}
	return out, warns
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// provisioner makes and applies plans for one node.
type provisioner struct {
	flags        provisionFlags
	hostRoot     string
	podResources string
	dra          func() (map[string]string, error)
	log          *slog.Logger
	policies     []provision.Policy
	// env is where the node's labels are read from (podEnv).
	env nodeEnv
	// labelsFrom and labelsErr are the last plan's: where the node's
	// labels came from; why they were unreadable (the policies with a
	// nodeSelector then wait for them).
	labelsFrom string
	labelsErr  error
}

// plan scans the node and plans the policies on it.
func (p *provisioner) plan(ctx context.Context) (*provision.Plan, *nic.Snapshot, error) {
	snap, err := nic.NewScanner(p.hostRoot).Scan()
	if err != nil {
		return nil, nil, fmt.Errorf("provision: scan %s: %w", p.hostRoot, err)
	}
	nl, err := p.flags.node.resolve(ctx, p.env)
	if err != nil {
		return nil, nil, err
	}
	p.labelsFrom, p.labelsErr = nl.source, nl.err
	if nl.err != nil {
		p.log.Error("provision: this node's labels could not be read: the policies with a nodeSelector are not applied until they can be", "err", nl.err)
	} else {
		p.log.Info("provision: node labels", "from", nl.source, "labels", nl.labels)
	}
	node := provision.Node{Root: p.hostRoot, Snapshot: snap, Labels: nl.labels, LabelsErr: nl.err}
	if routes, err := plugin.DefaultRouteNetdevs(nil); err == nil {
		node.DefaultRoutes = routes
	} else {
		p.log.Warn("provision: the node's default routes are unknown; no PF is left alone as the node's own network", "err", err)
	}
	var warns []string
	node.InUse, warns = inUse(ctx, snap, p.podResources, p.flags.cniStateDir, p.dra)
	for _, w := range warns {
		p.log.Warn("provision", "warning", w)
	}
	if node.Records, err = provision.LoadRecords(p.flags.stateDir); err != nil {
		return nil, nil, err
	}
	return provision.NewPlan(p.policies, node), snap, nil
}

// apply carries a plan out on the node's kernel.
func (p *provisioner) apply(ctx context.Context, plan *provision.Plan) (provision.Result, error) {
	k := provision.NewSysfsKernel(p.hostRoot, sriov.NewNetlinkPFLink(&netlink.Handle{}))
	a := &provision.Applier{Kernel: k, Root: p.hostRoot, StateDir: p.flags.stateDir, Timeout: p.flags.timeout, Log: p.log}
	return a.Apply(ctx, plan)
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
	if f.policy == "" {
		return errors.New("provision: --policy FILE is required")
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("provision: -o %q: want table or json", *output)
	}
	policies, err := provision.Load(f.policy)
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p := &provisioner{flags: f, hostRoot: *hostRoot, podResources: *podResources, dra: draPrepared(draFlags{}), log: log, policies: policies, env: podEnv()}
	plan, _, err := p.plan(ctx)
	if err != nil {
		return err
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		r := planReport(plan)
		r.NodeLabels = p.labelsFrom
		if err := enc.Encode(r); err != nil {
			return err
		}
	} else {
		writePlan(stdout, plan, !*dryRun)
		fmt.Fprintf(stdout, "node labels: %s\n", p.labelsFrom)
	}
	if *dryRun {
		return nil
	}
	start := time.Now()
	res, err := p.apply(ctx, plan)
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
