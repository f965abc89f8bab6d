// Package provisioner is the device plugin's provisioning loop: it scans
// the node, asks who holds each VF, plans the SriovNetworkNodePolicies
// with pkg/provision, applies the plan, records desired and actual VF
// counts in metrics, and tries again in the background until every PF is
// as its policy says. pkg/provision plans and applies; this package
// decides when, and with what view of the node.
package provisioner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/cnistate"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pci"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/sriov"
)

// DefaultRetry is how often a PF left as it was (VFs in use, a failed
// write) is tried again (--provision-retry).
const DefaultRetry = 30 * time.Second

// Config is what the flags say: where the policies are, where state is
// kept, how long to wait.
type Config struct {
	Policy      string        // --policy
	StateDir    string        // --provision-state-dir
	CNIStateDir string        // --cni-state-dir
	Timeout     time.Duration // --provision-timeout
	Retry       time.Duration // --provision-retry (serve only); 0: DefaultRetry
}

// NodeLabels are the labels the policies' nodeSelector is matched
// against, and where they came from. Err says why labels that should
// have come from the API server did not: only the policies without a
// nodeSelector then apply (provision.Node.LabelsErr).
type NodeLabels struct {
	Labels map[string]string
	Source string
	Err    error
}

// Metrics records a PF's desired and actual VF counts
// (*plugin.Metrics).
type Metrics interface {
	SetVFs(pf, policy string, desired, actual int)
}

var _ Metrics = (*plugin.Metrics)(nil)

// Provisioner makes and applies plans for one node.
type Provisioner struct {
	Config
	HostRoot string
	// PodResources is the kubelet's PodResources socket; empty: not asked.
	PodResources string
	// DRA names the VFs of prepared DRA claims; nil: none.
	DRA func() (map[string]string, error)
	// Labels finds this node's labels; its error stops the plan (a
	// --node-labels that does not parse).
	Labels   func(context.Context) (NodeLabels, error)
	Log      *slog.Logger
	Policies []provision.Policy
	// Kernel makes the writes; nil: the node's sysfs under HostRoot
	// (provision.NewSysfsKernel).
	Kernel provision.Kernel
	// labelsFrom and labelsErr are the last plan's: where the node's
	// labels came from; why they were unreadable (the policies with a
	// nodeSelector then wait for them).
	labelsFrom string
	labelsErr  error
}

// LabelsFrom says where the last plan's node labels came from.
func (p *Provisioner) LabelsFrom() string { return p.labelsFrom }

// Plan scans the node and plans the policies on it.
func (p *Provisioner) Plan(ctx context.Context) (*provision.Plan, *nic.Snapshot, error) {
	snap, err := nic.NewScanner(p.HostRoot).Scan()
	if err != nil {
		return nil, nil, fmt.Errorf("provision: scan %s: %w", p.HostRoot, err)
	}
	nl, err := p.Labels(ctx)
	if err != nil {
		return nil, nil, err
	}
	p.labelsFrom, p.labelsErr = nl.Source, nl.Err
	if nl.Err != nil {
		p.Log.Error("provision: this node's labels could not be read: the policies with a nodeSelector are not applied until they can be", "err", nl.Err)
	} else {
		p.Log.Info("provision: node labels", "from", nl.Source, "labels", nl.Labels)
	}
	node := provision.Node{Root: p.HostRoot, Snapshot: snap, Labels: nl.Labels, LabelsErr: nl.Err}
	if routes, err := plugin.DefaultRouteNetdevs(nil); err == nil {
		node.DefaultRoutes = routes
	} else {
		p.Log.Warn("provision: the node's default routes are unknown; no PF is left alone as the node's own network", "err", err)
	}
	node.InUse = p.InUse(ctx, snap)
	if node.Records, err = provision.LoadRecords(p.StateDir); err != nil {
		return nil, nil, err
	}
	return provision.NewPlan(p.Policies, node), snap, nil
}

// InUse names who holds each VF of snap (PodResources, the CNI's state,
// the DRA checkpoint), logging what it could not ask.
func (p *Provisioner) InUse(ctx context.Context, snap *nic.Snapshot) map[string]string {
	held, warns := inUse(ctx, snap, p.PodResources, p.CNIStateDir, p.DRA)
	for _, w := range warns {
		p.Log.Warn("provision", "warning", w)
	}
	return held
}

// Apply carries a plan out on the node's kernel.
func (p *Provisioner) Apply(ctx context.Context, plan *provision.Plan) (provision.Result, error) {
	k := p.Kernel
	if k == nil {
		k = provision.NewSysfsKernel(p.HostRoot, sriov.NewNetlinkPFLink(&netlink.Handle{}))
	}
	a := &provision.Applier{Kernel: k, Root: p.HostRoot, StateDir: p.StateDir, Timeout: p.Timeout, Log: p.Log}
	return a.Apply(ctx, plan)
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
