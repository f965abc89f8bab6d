package provision_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/pool"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

// emptyHost is a host of pfs InfiniBand PFs (ibp16s0, ibp17s0, …, at
// 0000:10:00.0, 0000:11:00.0, …) that can have totalVFs VFs each and
// have none.
func emptyHost(t testing.TB, pfs, totalVFs int) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, fixture.Generate(root, pfs, totalVFs))
	for i := 0; i < pfs; i++ {
		require.NoError(t, fixture.DisableVFs(root, fixture.PCIAddress(0, 0x10+i, 0, 0)))
	}
	return root
}

func policies(t testing.TB, doc string) []provision.Policy {
	t.Helper()
	ps, err := provision.Parse([]byte(doc), "test.yaml")
	require.NoError(t, err)
	return ps
}

func node(t testing.TB, root string) provision.Node {
	t.Helper()
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	return provision.Node{Root: root, Snapshot: snap}
}

const twoRails = `
metadata: {name: rails}
spec:
  resourceName: rdma_vfs
  numVfs: 4
  nicSelector: {vendor: "15b3", pfNames: [ibp16s0, ibp17s0]}
  deviceType: netdevice
  isRdma: true
`

func applier(root string, k provision.Kernel, state string) *provision.Applier {
	return &provision.Applier{Kernel: k, Root: root, StateDir: state, Timeout: 5 * time.Second, Poll: time.Millisecond}
}

func TestApplyCreatesVFsAndIsIdempotent(t *testing.T) {
	root := emptyHost(t, 2, 8)
	k := provisiontest.New(root)
	k.ProbeDelay = 20 * time.Millisecond
	ps := policies(t, twoRails)
	plan := provision.NewPlan(ps, node(t, root))
	require.Empty(t, plan.Warnings)
	require.Len(t, plan.PFs, 2)
	pf := plan.PFs[0]
	require.Equal(t, "0000:10:00.0", pf.Address)
	require.Equal(t, 0, pf.NumVFs)
	require.Equal(t, 4, pf.Want)
	require.NoError(t, pf.Refused)
	var kinds []provision.StepKind
	for _, s := range pf.Steps {
		kinds = append(kinds, s.Kind)
	}
	// Autoprobe off while the VFs are made and their GUIDs set; on for
	// the binds, so that the PCI core probes them by their IDs.
	require.Equal(t, []provision.StepKind{provision.StepAutoprobe, provision.StepNumVFs,
		provision.StepGUID, provision.StepGUID, provision.StepGUID, provision.StepGUID, provision.StepAutoprobe,
		provision.StepBind, provision.StepWait, provision.StepBind, provision.StepWait,
		provision.StepBind, provision.StepWait, provision.StepBind, provision.StepWait}, kinds)
	require.Equal(t, 0, pf.Steps[0].N)
	require.Equal(t, 1, pf.Steps[6].N)
	require.Equal(t, provision.DriverByID, pf.Steps[7].Drv)

	state := t.TempDir()
	res, err := applier(root, k, state).Apply(context.Background(), plan)
	require.NoError(t, err)
	require.Equal(t, []string{"0000:10:00.0", "0000:11:00.0"}, res.Changed)
	k.Wait()

	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	pfGUID := []byte{0xb8, 0x3f, 0xd2, 0x03, 0x00, 0x10, 0x00, 0x00} // fixture.GUID(0x10, 0)
	for k := 0; k < 4; k++ {
		d, ok := snap.Device(fixture.VFAddress(0x10, k))
		require.True(t, ok)
		require.Equal(t, "mlx5_core", d.Driver)
		require.NotEmpty(t, d.Netdev)
		require.NotEmpty(t, d.RDMADevice)
		want := provision.DeriveGUID(pfGUID, k)
		b, err := os.ReadFile(filepath.Join(root, "sys/class/infiniband", d.RDMADevice, "node_guid"))
		require.NoError(t, err)
		require.Equal(t, want.String(), strings.ReplaceAll(guidColons(strings.TrimSpace(string(b))), "", ""))
	}
	autoprobe, err := os.ReadFile(filepath.Join(root, "sys/bus/pci/devices/0000:10:00.0/sriov_drivers_autoprobe"))
	require.NoError(t, err)
	require.Equal(t, "1\n", string(autoprobe), "autoprobe is put back")
	recs, err := provision.LoadRecords(state)
	require.NoError(t, err)
	require.Empty(t, recs, "no write-ahead record is left after a run that finished")
	// What each PF had is kept for an uninstall: no VFs, autoprobe on.
	found, err := provision.LoadFound(state)
	require.NoError(t, err)
	require.Len(t, found, 2)
	require.Equal(t, 0, found["0000:10:00.0"].NumVFs)
	require.True(t, found["0000:10:00.0"].Autoprobe)
	require.Equal(t, "rails", found["0000:10:00.0"].Policy)

	// The pools the policy feeds see the VFs.
	cfg := provision.Merge(nil, provision.Resources(plan, pool.DefaultExclusivePrefix))
	pools, _ := pool.Build(cfg, snap.Devices)
	require.Len(t, pools, 1)
	require.Equal(t, "mellanox.com/rdma_vfs", pools[0].ResourceName())
	require.Len(t, pools[0].Devices, 8)

	// Twice changes nothing.
	calls := len(k.Calls())
	again := provision.NewPlan(ps, node(t, root))
	require.Zero(t, again.Changes())
	_, err = applier(root, k, state).Apply(context.Background(), again)
	require.NoError(t, err)
	require.Len(t, k.Calls(), calls)
}

// guidColons turns a sysfs node_guid (b83f:d203:…) into net's form.
func guidColons(s string) string {
	h := strings.ReplaceAll(s, ":", "")
	var parts []string
	for i := 0; i+2 <= len(h); i += 2 {
		parts = append(parts, h[i:i+2])
	}
	return strings.Join(parts, ":")
}

func TestResizeGoesThroughZeroAndRefusesWhenBusy(t *testing.T) {
	root := emptyHost(t, 1, 8)
	k := provisiontest.New(root)
	ps := policies(t, twoRails)
	_, err := applier(root, k, "").Apply(context.Background(), provision.NewPlan(ps, node(t, root)))
	require.NoError(t, err)

	// The kernel refuses 4 -> 6 outright, as the PCI core does.
	err = k.SetNumVFs("0000:10:00.0", 6)
	require.ErrorIs(t, err, syscall.EBUSY)

	grow := policies(t, strings.Replace(twoRails, "numVfs: 4", "numVfs: 6", 1))
	n := node(t, root)
	n.InUse = map[string]string{fixture.VFAddress(0x10, 2): "pod default/train-0"}
	plan := provision.NewPlan(grow, n)
	pf := plan.PFs[0]
	require.ErrorIs(t, pf.Refused, provision.ErrBusy)
	require.ErrorContains(t, pf.Refused, "pod default/train-0")
	require.ErrorContains(t, pf.Refused, "0000:10:00.3")
	require.Empty(t, pf.Steps)
	before := len(k.Calls())
	_, err = applier(root, k, "").Apply(context.Background(), plan)
	require.NoError(t, err)
	require.Len(t, k.Calls(), before, "a refused PF is not written")

	plan = provision.NewPlan(grow, node(t, root))
	require.NoError(t, plan.PFs[0].Refused)
	require.Equal(t, provision.Step{Kind: provision.StepNumVFs, VF: -1, N: 0}, plan.PFs[0].Steps[1])
	require.Equal(t, provision.Step{Kind: provision.StepNumVFs, VF: -1, N: 6}, plan.PFs[0].Steps[2])
	_, err = applier(root, k, "").Apply(context.Background(), plan)
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	d, _ := snap.Device("0000:10:00.0")
	require.Equal(t, 6, d.NumVFs)
}

// The count a PF had before provisioning first changed it is kept once: a
// later change (a policy grown from 4 to 6) leaves the record of the
// first run's 0, which an uninstall returns the PF to.
func TestFoundIsKeptOnce(t *testing.T) {
	root := emptyHost(t, 1, 8)
	k := provisiontest.New(root)
	state := t.TempDir()
	_, err := applier(root, k, state).Apply(context.Background(), provision.NewPlan(policies(t, twoRails), node(t, root)))
	require.NoError(t, err)
	k.Wait()
	grow := policies(t, strings.Replace(twoRails, "numVfs: 4", "numVfs: 6", 1))
	plan := provision.NewPlan(grow, node(t, root))
	require.Equal(t, 4, plan.PFs[0].NumVFs)
	_, err = applier(root, k, state).Apply(context.Background(), plan)
	require.NoError(t, err)
	found, err := provision.LoadFound(state)
	require.NoError(t, err)
	require.Len(t, found, 1)
	require.Equal(t, 0, found["0000:10:00.0"].NumVFs, "the count before the first run")

	require.NoError(t, provision.RemoveFound(state, "0000:10:00.0"))
	require.NoError(t, provision.RemoveFound(state, "0000:10:00.0"), "a record already gone is no error")
	found, err = provision.LoadFound(state)
	require.NoError(t, err)
	require.Empty(t, found)

	// A record that does not decode is an error that names the file.
	require.NoError(t, os.WriteFile(filepath.Join(provision.FoundDir(state), "0000:10:00.0.json"), []byte("{"), 0o600))
	_, err = provision.LoadFound(state)
	require.ErrorContains(t, err, "0000:10:00.0.json")
}

func TestRefusals(t *testing.T) {
	root := emptyHost(t, 2, 8)
	require.NoError(t, fixture.FirmwareSRIOVOff(root, "0000:11:00.0"))
	plan := provision.NewPlan(policies(t, strings.Replace(twoRails, "numVfs: 4", "numVfs: 8", 1)), node(t, root))
	require.NoError(t, plan.PFs[0].Refused)
	require.ErrorIs(t, plan.PFs[1].Refused, provision.ErrFirmware)
	require.ErrorContains(t, plan.PFs[1].Refused, "SRIOV_EN=1")

	plan = provision.NewPlan(policies(t, strings.Replace(twoRails, "numVfs: 4", "numVfs: 12", 1)), node(t, root))
	require.ErrorIs(t, plan.PFs[0].Refused, provision.ErrTotalVFs)
	require.ErrorContains(t, plan.PFs[0].Refused, "numVfs 12")
	require.ErrorContains(t, plan.PFs[0].Refused, "sriov_totalvfs 8")

	plan = provision.NewPlan(policies(t, twoRails+"  linkType: eth\n"), node(t, root))
	require.ErrorIs(t, plan.PFs[0].Refused, provision.ErrLinkType)

	// The kernel's own answer to the same writes.
	k := provisiontest.New(root)
	require.ErrorIs(t, k.SetNumVFs("0000:10:00.0", 9), syscall.ERANGE)
	require.ErrorIs(t, k.SetNumVFs("0000:11:00.0", 1), syscall.ERANGE)
}

func TestDefaultRouteAndSelection(t *testing.T) {
	root := emptyHost(t, 2, 8)
	n := node(t, root)
	n.DefaultRoutes = []string{"ibp17s0"}
	byVendor := `
metadata: {name: all}
spec: {resourceName: r, numVfs: 2, nicSelector: {vendor: "15b3"}}
`
	plan := provision.NewPlan(policies(t, byVendor), n)
	require.Len(t, plan.PFs, 1)
	require.Equal(t, "0000:10:00.0", plan.PFs[0].Address)
	require.Contains(t, plan.Warnings[0], "carries the node's default route")

	plan = provision.NewPlan(policies(t, twoRails), n)
	require.Len(t, plan.PFs, 2, "named by pfNames, the PF is provisioned")

	n.Labels = map[string]string{"role": "cpu"}
	plan = provision.NewPlan(policies(t, twoRails+"  nodeSelector: {role: gpu}\n"), n)
	require.Empty(t, plan.PFs)
	require.Contains(t, plan.Warnings[0], "nodeSelector")

	// Labels that should be known and could not be read: a policy with a
	// nodeSelector may be meant for other nodes and is not applied; one
	// without applies.
	n.Labels, n.LabelsErr = nil, errors.New("get node n1: forbidden (403)")
	plan = provision.NewPlan(policies(t, twoRails+"  nodeSelector: {role: gpu}\n"), n)
	require.Empty(t, plan.PFs)
	require.Len(t, plan.Warnings, 1)
	require.Contains(t, plan.Warnings[0], "policy rails: nodeSelector map[role:gpu]: not applied, this node's labels are unknown: get node n1: forbidden (403)")
	require.Equal(t, n.LabelsErr, plan.LabelsErr)
	plan = provision.NewPlan(policies(t, twoRails), n)
	require.Len(t, plan.PFs, 2)
	n.LabelsErr = nil

	plan = provision.NewPlan(policies(t, strings.Replace(twoRails, "ibp16s0, ibp17s0", "ens9", 1)), n)
	require.Empty(t, plan.PFs)
	require.Contains(t, plan.Warnings[0], "matches no PF")
}

func TestPriorityAndPartitions(t *testing.T) {
	root := emptyHost(t, 1, 8)
	two := `
metadata: {name: a-low}
spec: {resourceName: low, numVfs: 2, nicSelector: {pfNames: [ibp16s0]}}
---
metadata: {name: b-high}
spec: {resourceName: high, numVfs: 6, priority: 10, nicSelector: {pfNames: [ibp16s0]}}
`
	plan := provision.NewPlan(policies(t, two), node(t, root))
	require.Equal(t, "b-high", plan.PFs[0].Policy, "priority 10 beats 99")
	require.Equal(t, 6, plan.PFs[0].Want)
	require.Contains(t, plan.PFs[0].Warnings[0], "overrides a-low")

	k := provisiontest.New(root)
	ps, err := provision.Load("testdata/multi.yaml")
	require.NoError(t, err)
	plan = provision.NewPlan(ps, node(t, root))
	pf := plan.PFs[0]
	require.Len(t, pf.Groups, 2, "disjoint ranges at the same priority partition the PF")
	require.Equal(t, "low", pf.PolicyOf(0))
	require.Equal(t, "high", pf.PolicyOf(3))
	_, err = applier(root, k, "").Apply(context.Background(), plan)
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	d, _ := snap.Device(fixture.VFAddress(0x10, 3))
	require.Equal(t, "vfio-pci", d.Driver)
	d, _ = snap.Device(fixture.VFAddress(0x10, 1))
	require.Equal(t, "mlx5_core", d.Driver)
	pools, _ := pool.Build(provision.Merge(nil, provision.Resources(plan, "mellanox.com")), snap.Devices)
	require.Len(t, pools, 2)
	require.Len(t, pools[0].Devices, 2)
	require.Len(t, pools[1].Devices, 2)
}

func TestCrashHalfWayIsRepaired(t *testing.T) {
	root := emptyHost(t, 1, 8)
	state := t.TempDir()
	k := provisiontest.New(root)
	ps := policies(t, twoRails)
	k.FailNext("Bind", errors.New("killed"))
	_, err := applier(root, k, state).Apply(context.Background(), provision.NewPlan(ps, node(t, root)))
	require.ErrorContains(t, err, "killed")
	recs, err := provision.LoadRecords(state)
	require.NoError(t, err)
	require.Contains(t, recs, "0000:10:00.0")
	require.Equal(t, 4, recs["0000:10:00.0"].Want)

	n := node(t, root)
	n.Records = recs
	plan := provision.NewPlan(ps, n)
	require.NotZero(t, plan.Changes())
	res, err := applier(root, k, state).Apply(context.Background(), plan)
	require.NoError(t, err)
	require.Equal(t, []string{"0000:10:00.0"}, res.Repaired)
	b, err := os.ReadFile(filepath.Join(root, "sys/bus/pci/devices/0000:10:00.0/sriov_drivers_autoprobe"))
	require.NoError(t, err)
	require.Equal(t, "1\n", string(b))
	recs, err = provision.LoadRecords(state)
	require.NoError(t, err)
	require.Empty(t, recs)
	require.Zero(t, provision.NewPlan(ps, node(t, root)).Changes())
}

// A run stopped half way while autoprobe was on for the binds leaves the
// PF's sriov_drivers_autoprobe as its record says the run found it: 0
// here (an admin's), put back by the run that resumes; a record that does
// not say (a torn one) gives the kernel's default, 1.
func TestCrashHalfWayLeavesAutoprobeAsFound(t *testing.T) {
	for _, tc := range []struct {
		name string
		torn bool
		want string
	}{{"record says 0", false, "0"}, {"torn record", true, "1"}} {
		t.Run(tc.name, func(t *testing.T) {
			root := emptyHost(t, 1, 8)
			autoprobe := filepath.Join(root, "sys/bus/pci/devices/0000:10:00.0/sriov_drivers_autoprobe")
			require.NoError(t, os.WriteFile(autoprobe, []byte("0\n"), 0o644))
			state := t.TempDir()
			k := provisiontest.New(root)
			ps := policies(t, twoRails)
			k.FailNext("Bind", errors.New("killed"))
			_, err := applier(root, k, state).Apply(context.Background(), provision.NewPlan(ps, node(t, root)))
			require.ErrorContains(t, err, "killed")
			b, err := os.ReadFile(autoprobe)
			require.NoError(t, err)
			require.Equal(t, "1\n", string(b), "on for the binds when the run stopped")
			if tc.torn {
				require.NoError(t, os.WriteFile(filepath.Join(state, "0000:10:00.0.json"), []byte("{"), 0o600))
			}
			recs, err := provision.LoadRecords(state)
			require.NoError(t, err)

			n := node(t, root)
			n.Records = recs
			_, err = applier(root, k, state).Apply(context.Background(), provision.NewPlan(ps, n))
			require.NoError(t, err)
			b, err = os.ReadFile(autoprobe)
			require.NoError(t, err)
			require.Equal(t, tc.want+"\n", string(b))
			snap, err := nic.NewScanner(root).Scan()
			require.NoError(t, err)
			for i := 0; i < 4; i++ {
				d, ok := snap.Device(fixture.VFAddress(0x10, i))
				require.True(t, ok)
				require.Equal(t, "mlx5_core", d.Driver)
				require.NotEmpty(t, d.Netdev)
			}
			require.Zero(t, provision.NewPlan(ps, node(t, root)).Changes())
		})
	}
}

func TestWaitTimesOut(t *testing.T) {
	root := emptyHost(t, 1, 8)
	k := provisiontest.New(root)
	k.ProbeDelay = time.Hour
	a := applier(root, k, "")
	a.Timeout = 50 * time.Millisecond
	_, err := a.Apply(context.Background(), provision.NewPlan(policies(t, twoRails), node(t, root)))
	require.ErrorIs(t, err, provision.ErrTimeout)
	require.ErrorContains(t, err, "0000:10:00.1")
	require.ErrorContains(t, err, "netdev and an RDMA device")
}

func TestAdminGUIDsWin(t *testing.T) {
	root := emptyHost(t, 1, 8)
	doc := `
metadata:
  name: rails
  annotations:
    fastpath-k8s.io/vf-guids: '{"ibp16s0": ["02:00:00:00:00:00:00:aa"]}'
spec: {resourceName: r, numVfs: 2, isRdma: true, nicSelector: {pfNames: [ibp16s0]}}
`
	plan := provision.NewPlan(policies(t, doc), node(t, root))
	require.Equal(t, "02:00:00:00:00:00:00:aa", plan.PFs[0].Steps[2].GUID.String())
	require.Equal(t, provision.DeriveGUID([]byte{0xb8, 0x3f, 0xd2, 0x03, 0, 0x10, 0, 0}, 1).String(), plan.PFs[0].Steps[3].GUID.String())
}

func TestDeriveGUID(t *testing.T) {
	seen := map[string]bool{}
	for bus := 0x10; bus < 0x18; bus++ {
		pf := []byte{0xb8, 0x3f, 0xd2, 0x03, 0, byte(bus), 0, 0}
		for vf := 0; vf < 128; vf++ {
			g := provision.DeriveGUID(pf, vf)
			require.Len(t, g, 8)
			require.Equal(t, byte(0x02), g[0]&0x03, "locally administered, not a group address")
			require.Equal(t, g, provision.DeriveGUID(pf, vf), "stable")
			require.False(t, seen[g.String()], "unique")
			seen[g.String()] = true
		}
	}
}

// lateBus returns from SetNumVFs before the VFs show on the bus, as a
// kernel stand-in that reacts to the write afterwards does.
type lateBus struct {
	*provisiontest.Kernel
	delay time.Duration
	wg    sync.WaitGroup
}

func (l *lateBus) SetNumVFs(pf string, n int) error {
	l.wg.Add(1)
	time.AfterFunc(l.delay, func() {
		defer l.wg.Done()
		_ = l.Kernel.SetNumVFs(pf, n)
	})
	return nil
}

// After writing sriov_numvfs the steps wait for the VFs to show on the
// bus before they set GUIDs and bind; a bus that never shows them is a
// timeout naming the count.
func TestApplyWaitsForTheBus(t *testing.T) {
	root := emptyHost(t, 1, 8)
	k := &lateBus{Kernel: provisiontest.New(root), delay: 30 * time.Millisecond}
	plan := provision.NewPlan(policies(t, twoRails), node(t, root))
	_, err := applier(root, k, "").Apply(context.Background(), plan)
	k.wg.Wait()
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	d, ok := snap.Device(fixture.VFAddress(0x10, 3))
	require.True(t, ok)
	require.Equal(t, "mlx5_core", d.Driver)

	root = emptyHost(t, 1, 8)
	k = &lateBus{Kernel: provisiontest.New(root), delay: time.Hour}
	a := applier(root, k, "")
	a.Timeout = 50 * time.Millisecond
	_, err = a.Apply(context.Background(), provision.NewPlan(policies(t, twoRails), node(t, root)))
	require.ErrorIs(t, err, provision.ErrTimeout)
	require.ErrorContains(t, err, "waiting for the PCI core to show 4 VFs (it shows 0)")
}

// A VF that sriov_numvfs counts but the bus lacks (removed through its
// remove attribute) is made again with its PF's others: N -> 0 -> N, the
// same busy check first; not "up to date".
func TestMissingVFIsMadeAgain(t *testing.T) {
	root := emptyHost(t, 1, 8)
	k := provisiontest.New(root)
	ps := policies(t, twoRails)
	_, err := applier(root, k, "").Apply(context.Background(), provision.NewPlan(ps, node(t, root)))
	require.NoError(t, err)
	require.NoError(t, fixture.RemoveVF(root, "0000:10:00.0", 2))

	n := node(t, root)
	n.InUse = map[string]string{fixture.VFAddress(0x10, 1): "pod default/train-0"}
	plan := provision.NewPlan(ps, n)
	pf := plan.PFs[0]
	require.ErrorIs(t, pf.Refused, provision.ErrBusy, "the other VFs go too: not while one is in use")
	// The scan indexes VFs up to the first missing virtfn link: VF 3 is
	// on the bus but without an index, so it is named too.
	require.Contains(t, strings.Join(pf.Warnings, "\n"), "VFs [2 3] of 0000:10:00.0 are not on the PCI bus although sriov_numvfs is 4")

	plan = provision.NewPlan(ps, node(t, root))
	pf = plan.PFs[0]
	require.NoError(t, pf.Refused)
	require.Equal(t, provision.Step{Kind: provision.StepNumVFs, VF: -1, N: 0}, pf.Steps[1])
	require.Equal(t, provision.Step{Kind: provision.StepNumVFs, VF: -1, N: 4}, pf.Steps[2])
	_, err = applier(root, k, "").Apply(context.Background(), plan)
	require.NoError(t, err)
	k.Wait()
	require.Zero(t, provision.NewPlan(ps, node(t, root)).Changes(), "every VF back")
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	_, ok := snap.Device(fixture.VFAddress(0x10, 2))
	require.True(t, ok, "VF 2 is on the bus again")
}
