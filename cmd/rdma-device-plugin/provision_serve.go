package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/plugin"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

// defaultProvisionRetry is how often a PF left as it was (VFs in use, a
// failed write) is tried again (--provision-retry).
const defaultProvisionRetry = 30 * time.Second

// provisionAtStart creates the VFs the policies ask for before anything
// is served (VFs do not survive a reboot), records desired and actual VF
// counts in metrics, and returns the pools the policies feed. A PF it
// cannot change now is logged and retried in the background until ctx
// ends; only a policy file that does not load stops the start.
func provisionAtStart(ctx context.Context, p *provisioner, prefix string, metrics *plugin.Metrics) ([]pool.Resource, *nic.Snapshot, error) {
	policies, err := provision.Load(p.flags.policy)
	if err != nil {
		return nil, nil, err
	}
	p.policies = policies
	start := time.Now()
	plan, snap, pending := p.once(ctx, metrics)
	p.log.Info("provisioned", "policies", len(policies), "pfs", len(plan.PFs), "duration", time.Since(start).String())
	if pending {
		go p.retry(ctx, metrics)
	}
	return provision.Resources(plan, prefix), snap, nil
}

// once plans and applies; pending says whether something is left to do.
// The scan it planned from is returned when nothing was written: it is
// still the node as it is.
func (p *provisioner) once(ctx context.Context, metrics *plugin.Metrics) (*provision.Plan, *nic.Snapshot, bool) {
	plan, snap, err := p.plan(ctx)
	if err != nil {
		p.log.Error("provision: plan failed", "err", err)
		return &provision.Plan{Policies: p.policies}, nil, true
	}
	for _, w := range plan.Warnings {
		p.log.Warn("provision", "warning", w)
	}
	pending := false
	for _, pf := range plan.PFs {
		for _, w := range pf.Warnings {
			p.log.Warn("provision", "pf", pf.Address, "warning", w)
		}
		if pf.Refused != nil {
			pending = pending || errors.Is(pf.Refused, provision.ErrBusy)
			p.log.Error("provision: PF left as it is", "pf", pf.Address, "policy", pf.Policy, "err", pf.Refused)
		}
	}
	res, err := p.apply(ctx, plan)
	for addr, d := range res.PerPF {
		p.log.Info("provisioned PF", "pf", addr, "duration", d.String())
	}
	if err != nil {
		pending = true
		p.log.Error("provision: apply failed; retried", "err", err, "every", p.retryEvery().String())
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
func (p *provisioner) numVFs(addr string) int {
	b, err := os.ReadFile(filepath.Join(p.hostRoot, "sys", "bus", "pci", "devices", addr, "sriov_numvfs"))
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return -1
	}
	return n
}

func (p *provisioner) retryEvery() time.Duration {
	if p.flags.retry > 0 {
		return p.flags.retry
	}
	return defaultProvisionRetry
}

// retry runs the policies again every --provision-retry until nothing is
// left to do; the periodic rescan then puts the new VFs in their pools.
func (p *provisioner) retry(ctx context.Context, metrics *plugin.Metrics) {
	t := time.NewTicker(p.retryEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if _, _, pending := p.once(ctx, metrics); !pending {
			p.log.Info("provision: every PF is as its policy says")
			return
		}
	}
}

// newProvisioner is the serve path's provisioner.
func newProvisioner(f serveFlags, log *slog.Logger) *provisioner {
	return &provisioner{flags: f.provision, hostRoot: f.hostRoot, podResources: f.podResources, dra: draPrepared(f.dra), log: log, env: podEnv()}
}
