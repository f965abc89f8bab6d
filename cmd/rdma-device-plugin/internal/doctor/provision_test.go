package doctor

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
)

func TestProvisionDisagreements(t *testing.T) {
	// Four rails, each disagreeing with the policy another way.
	root := newHost(t, "generate", func(root string) error {
		if err := fixture.DisableVFs(root, "0000:11:00.0"); err != nil {
			return err
		}
		return fixture.FirmwareSRIOVOff(root, "0000:11:00.0")
	})
	ps, err := provision.Parse([]byte(`
metadata: {name: rails}
spec: {resourceName: r, numVfs: 2, isRdma: true, nicSelector: {pfNames: [ibp16s0, ibp17s0]}}
---
metadata: {name: big}
spec: {resourceName: b, numVfs: 4, priority: 1, nicSelector: {pfNames: [ibp16s0]}}
---
metadata: {name: none}
spec: {resourceName: nn, numVfs: 2, nicSelector: {pfNames: [ens9]}}
`), "p.yaml")
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	node := provision.Node{Root: root, Snapshot: snap, InUse: map[string]string{fixture.VFAddress(0x10, 0): "pod ml/train-0"}}
	r := Run(Options{HostRoot: root, PolicyPath: "p.yaml", Plan: provision.NewPlan(ps, node)})
	requireCheck(t, r, "provision", Fail, "0000:11:00.0", "SR-IOV is off in the NIC's firmware", "SRIOV_EN=1")
	requireCheck(t, r, "provision", Fail, "0000:10:00.0", "numVfs is above", "sriov_totalvfs 2")
	requireCheck(t, r, "provision", Warn, "policy none matches no PF")

	// Within totalvfs, the busy VF is what stops it.
	ps[1].NumVFs = 1
	r = Run(Options{HostRoot: root, PolicyPath: "p.yaml", Plan: provision.NewPlan(ps, node)})
	requireCheck(t, r, "provision", Warn, "0000:10:00.0", "pod ml/train-0", "retries")

	// The count agrees, the GUIDs are not the derived ones.
	ps = ps[:1]
	ps[0].PFNames = ps[0].PFNames[:1]
	r = Run(Options{HostRoot: root, PolicyPath: "p.yaml", Plan: provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap})})
	c := requireCheck(t, r, "provision", Warn, "0000:10:00.0", "not provisioned yet", "GUID")
	require.Contains(t, c.Fix, "--policy")

	// The node's labels could not be read: the policies with a
	// nodeSelector wait, and doctor says how to let the plugin read them.
	ps[0].NodeSelector = map[string]string{"role": "gpu"}
	r = Run(Options{HostRoot: root, PolicyPath: "p.yaml", Plan: provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap,
		LabelsErr: errors.New("node n1: labels: get node n1: forbidden (403)")})})
	c = requireCheck(t, r, "provision", Fail, "node labels", "nodeSelector are not applied", "forbidden (403)")
	require.Contains(t, c.Fix, "RBAC get on nodes")
	requireCheck(t, r, "provision", Warn, "policy rails: nodeSelector map[role:gpu]: not applied")
}
