package provisioner

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// Start creates the VFs the policies ask for before anything is served
// (VFs do not survive a reboot), records desired and actual VF counts in
// metrics, and returns the pools the policies feed. A PF it cannot
// change now is logged and retried in the background until ctx ends;
// only a policy file that does not load stops the start.
func (p *Provisioner) Start(ctx context.Context, prefix string, metrics Metrics) ([]pool.Resource, *nic.Snapshot, error) {
	policies, err := provision.Load(p.Policy)
	if err != nil {
		return nil, nil, err
	}
	p.Policies = policies
	start := time.Now()
	plan, snap, pending := p.Once(ctx, metrics)
	p.Log.Info("provisioned", "policies", len(policies), "pfs", len(plan.PFs), "duration", time.Since(start).String())
	if pending {
		go p.retry(ctx, metrics)
	}
	return provision.Resources(plan, prefix), snap, nil
}

// Once plans and applies; pending says whether something is left to do.
// The scan it planned from is returned when nothing was written: it is
// still the node as it is.
func (p *Provisioner) Once(ctx context.Context, metrics Metrics) (*provision.Plan, *nic.Snapshot, bool) {
	plan, snap, err := p.Plan(ctx)
	if err != nil {
		p.Log.Error("provision: plan failed", "err", err)
		return &provision.Plan{Policies: p.Policies}, nil, true
	}
	for _, w := range plan.Warnings {
		p.Log.Warn("provision", "warning", w)
	}
	pending := false
	for _, pf := range plan.PFs {
		for _, w := range pf.Warnings {
			p.Log.Warn("provision", "pf", pf.Address, "warning", w)
		}
		if pf.Refused != nil {
			pending = pending || errors.Is(pf.Refused, provision.ErrBusy)
			p.Log.Error("provision: PF left as it is", "pf", pf.Address, "policy", pf.Policy, "err", pf.Refused)
		}
	}
	res, err := p.Apply(ctx, plan)
	for addr, d := range res.PerPF {
		p.Log.Info("provisioned PF", "pf", addr, "duration", d.String())
	}
	if err != nil {
		pending = true
		p.Log.Error("provision: apply failed; retried", "err", err, "every", p.retryEvery().String())
	}
	// The policies with a nodeSelector wait for the node's labels.
	pending = pending || p.labelsErr != nil
	for _, pf := range plan.PFs {
		metrics.SetVFs(pf.Address, pf.Policy, pf.Want, p.numVFs(pf.Address))
	}
	if plan.Changes() > 0 {
		snap = nil
	}
	return plan, snap, pending
}

// numVFs reads a PF's sriov_numvfs now, -1 when it cannot.
func (p *Provisioner) numVFs(addr string) int {
	b, err := os.ReadFile(filepath.Join(p.HostRoot, "sys", "bus", "pci", "devices", addr, "sriov_numvfs"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func (p *Provisioner) retryEvery() time.Duration {
	if p.Retry > 0 {
		return p.Retry
	}
	return DefaultRetry
}

// retry runs the policies again every --provision-retry until nothing is
// left to do; the periodic rescan then puts the new VFs in their pools.
func (p *Provisioner) retry(ctx context.Context, metrics Metrics) {
	t := time.NewTicker(p.retryEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, _, pending := p.Once(ctx, metrics); !pending {
			p.Log.Info("provision: every PF is as its policy says")
			return
		}
	}
}
