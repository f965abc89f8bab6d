package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// discoverReport is what `discover -o json` prints.
type discoverReport struct {
	Devices  []deviceReport `json:"devices"`
	Pools    []poolReport   `json:"pools"`
	Warnings []string       `json:"warnings"`
	// Provisioning is what --policy's SriovNetworkNodePolicies would do
	// to each PF they select.
	Provisioning []pfReport `json:"provisioning,omitempty"`
}

// deviceReport is one device as discover prints it: charDevices are the
// host paths a container given the device gets, the node's rdma_cm last.
type deviceReport struct {
	nic.Device
	CharDevices []string `json:"charDevices"`
}

type poolReport struct {
	Resource         string   `json:"resource"`
	Kind             string   `json:"kind"`
	Devices          []string `json:"devices"`
	Capacity         int      `json:"capacity"`
	RdmaHcaMax       int      `json:"rdmaHcaMax,omitempty"`
	AllocationPolicy string   `json:"allocationPolicy,omitempty"`
}

// defaultHostRoot is the --host-root of discover and doctor when none is
// given: $FASTPATH_HOST_ROOT, which the plugin's container sets to where
// the node's /sys and /dev are (its own /dev has no /dev/infiniband), or /.
func defaultHostRoot() string {
	if v := os.Getenv("FASTPATH_HOST_ROOT"); v != "" {
		return v
	}
	return "/"
}

const discoverUsage = "usage: rdma-device-plugin discover [--host-root DIR] [--config FILE] [--policy FILE] [--resource-prefix P] [-o table|json]\n\n" +
	"Shows the node's NIC functions: SR-IOV PFs and VFs of any vendor, every ConnectX function and any\n" +
	"function with an RDMA device (PF -> VFs -> netdev -> RDMA device -> char devices)\n" +
	"and, with --config, which pool gets which device.\n\n"

func runDiscover(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("discover", discoverUsage, stderr)
	hostRoot := fs.String("host-root", defaultHostRoot(), "directory that stands for / on the node (sysfs at DIR/sys, devices at DIR/dev); default $FASTPATH_HOST_ROOT or /")
	configPath := fs.String("config", "", "pool config file (configList and/or resourceList JSON); empty shows devices only")
	fs.StringVar(configPath, "config-file", "", "the same as --config")
	prefix := fs.String("resource-prefix", pool.DefaultExclusivePrefix, "resource prefix of resourceList pools that give none (configList pools: "+pool.DefaultSharedPrefix+")")
	output := fs.String("o", "table", "output format: table or json")
	policyPath := fs.String("policy", "", "SriovNetworkNodePolicy file: show which policy owns each PF, what it wants, and its pools")
	var node nodeFlags
	registerNodeFlags(fs, &node)
	if help, err := parseFlags(fs, args); help || err != nil {
		if errors.Is(err, errStrayArgument) {
			return fmt.Errorf("discover: %w", err)
		}
		return err
	}
	if *output != "table" && *output != "json" {
		return fmt.Errorf("discover: -o %q: want table or json", *output)
	}
	var cfg *pool.Config
	if *configPath != "" {
		c, err := pool.Load(*configPath, pool.WithResourcePrefix(*prefix))
		if err != nil {
			return err
		}
		cfg = c
	}
	var plan *provision.Plan
	if *policyPath != "" {
		policies, err := provision.Load(*policyPath)
		if err != nil {
			return err
		}
		snap, err := nic.NewScanner(*hostRoot).Scan()
		if err != nil {
			return fmt.Errorf("discover %s: %w", *hostRoot, err)
		}
		nl, err := node.resolve(ctx, podEnv())
		if err != nil {
			return err
		}
		plan = provision.NewPlan(policies, provision.Node{Root: *hostRoot, Snapshot: snap, Labels: nl.Labels, LabelsErr: nl.Err})
		cfg = provision.Merge(cfg, provision.Resources(plan, *prefix))
	}
	report, err := discover(*hostRoot, cfg)
	if err != nil {
		return err
	}
	if plan != nil {
		pr := planReport(plan)
		report.Provisioning = pr.PFs
		report.Warnings = append(report.Warnings, pr.Warnings...)
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(report)
	}
	writeTable(stdout, report)
	for _, w := range report.Warnings {
		fmt.Fprintln(stderr, "warning:", w)
	}
	return nil
}

// discover scans the host and, with a config, builds its pools.
func discover(hostRoot string, cfg *pool.Config) (*discoverReport, error) {
	snap, err := nic.NewScanner(hostRoot, nic.WithNames(pci.LoadNames(hostRoot))).Scan()
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", hostRoot, err)
	}
	r := &discoverReport{Devices: make([]deviceReport, len(snap.Devices)), Pools: []poolReport{}, Warnings: snap.Warnings}
	for i, d := range snap.Devices {
		r.Devices[i] = deviceReport{Device: d, CharDevices: d.CharDevicePaths()}
		if d.RDMADevice != "" && snap.RDMACM != "" {
			r.Devices[i].CharDevices = append(r.Devices[i].CharDevices, snap.RDMACM)
		}
	}
	if r.Warnings == nil {
		r.Warnings = []string{}
	}
	if cfg == nil {
		return r, nil
	}
	// As the plugin does: run where it runs (its pod), the node's default
	// route is this namespace's.
	var build []pool.BuildOption
	if routes, err := plugin.DefaultRouteNetdevs(nil); err == nil {
		build = append(build, pool.WithDefaultRoutes(routes...))
	}
	pools, warns := pool.Build(cfg, snap.Devices, build...)
	// The config's own (an unusual resource prefix, a pool without the
	// NCCL environment), as the plugin logs them, then the pools'.
	r.Warnings = append(r.Warnings, cfg.Warnings...)
	r.Warnings = append(r.Warnings, warns...)
	for i := range pools {
		p := &pools[i]
		pr := poolReport{
			Resource: p.ResourceName(), Kind: string(p.Kind), Devices: []string{},
			Capacity: p.Capacity(), AllocationPolicy: p.AllocationPolicy,
		}
		if p.Kind == pool.Shared {
			pr.RdmaHcaMax = p.RdmaHcaMax
		}
		for _, d := range p.Devices {
			pr.Devices = append(pr.Devices, d.PCIAddress)
		}
		r.Pools = append(r.Pools, pr)
	}
	return r, nil
}

// writeTable prints PFs with their VFs indented below them.
func writeTable(w io.Writer, r *discoverReport) {
	if len(r.Devices) == 0 {
		fmt.Fprintln(w, "no SR-IOV or RDMA NIC functions on this host (no network-class PCI function is an SR-IOV PF or VF, has an RDMA device or is a ConnectX)")
		return
	}
	poolsOf := map[string][]string{}
	for _, p := range r.Pools {
		for _, a := range p.Devices {
			poolsOf[a] = append(poolsOf[a], p.Resource)
		}
	}
	vfsOf := map[string][]deviceReport{}
	var pfs []deviceReport
	known := map[string]bool{}
	for _, d := range r.Devices {
		known[d.PCIAddress] = true
	}
	for _, d := range r.Devices {
		if d.IsVF() && known[d.PFAddress] {
			vfsOf[d.PFAddress] = append(vfsOf[d.PFAddress], d)
			continue
		}
		pfs = append(pfs, d)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PCI\tMODEL\tDRIVER\tNUMA\tPCIE ROOT\tNETDEV\tLINK\tRDMA\tCHAR DEVICES\tPOOL")
	row := func(name string, d deviceReport) {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", name, d.Model, dash(d.Driver), numa(d.NUMANode),
			dash(d.PCIeRoot), dash(d.Netdev), dash(d.LinkType), dash(d.RDMADevice), charDevs(d), dash(strings.Join(poolsOf[d.PCIAddress], ",")))
	}
	owner := map[string]pfReport{}
	for _, p := range r.Provisioning {
		owner[p.PF] = p
	}
	for _, pf := range pfs {
		name := pf.PCIAddress
		o, owned := owner[pf.PCIAddress]
		switch {
		case owned && o.Want != pf.NumVFs:
			name += fmt.Sprintf(" (%d/%d VFs, policy %s wants %d)", pf.NumVFs, pf.TotalVFs, o.Policy, o.Want)
		case owned:
			name += fmt.Sprintf(" (%d/%d VFs, policy %s)", pf.NumVFs, pf.TotalVFs, o.Policy)
		case pf.TotalVFs > 0:
			name += fmt.Sprintf(" (%d/%d VFs)", pf.NumVFs, pf.TotalVFs)
		}
		row(name, pf)
		vfs := vfsOf[pf.PCIAddress]
		sort.Slice(vfs, func(i, j int) bool { return vfs[i].VFIndex < vfs[j].VFIndex })
		for i, vf := range vfs {
			branch := "├─"
			if i == len(vfs)-1 {
				branch = "└─"
			}
			row(fmt.Sprintf("  %s vf%d %s", branch, vf.VFIndex, vf.PCIAddress), vf)
		}
	}
	tw.Flush()
	for _, p := range r.Pools {
		fmt.Fprintf(w, "\npool %s (%s): %d devices, capacity %d", p.Resource, p.Kind, len(p.Devices), p.Capacity)
		if p.AllocationPolicy != "" {
			fmt.Fprintf(w, ", policy %s", p.AllocationPolicy)
		}
	}
	if len(r.Pools) > 0 {
		fmt.Fprintln(w)
	}
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func numa(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}

func charDevs(d deviceReport) string {
	var names []string
	for _, c := range d.CharDevices {
		names = append(names, path.Base(c))
	}
	names = append(names, d.VFIODevices...)
	return dash(strings.Join(names, ","))
}
