package provisioner

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

func fixture(name string) string {
	return filepath.Join("..", "..", "..", "..", "testdata", "sysfs", name)
}

func seedPolicy() string {
	return filepath.Join("..", "..", "..", "..", "testdata", "policy", "seed.yaml")
}

func TestInUseSources(t *testing.T) {
	snap, err := nic.NewScanner(fixture("dgx-h100")).Scan()
	require.NoError(t, err)
	cni := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(cni, "0000:18:00.2.json"), []byte(`{"network":"default/ib-rail0","containerID":"0123456789abcdef"}`), 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(cni, "0000:18:00.2.lock"), nil, 0o600))
	held, warns := inUse(context.Background(), snap, filepath.Join(t.TempDir(), "none.sock"), cni,
		func() (map[string]string, error) {
			return map[string]string{"0000:40:00.1": "DRA claim ns/c", "0000:18:00.2": "DRA claim ns/d"}, nil
		})
	// A VF two sources hold names both holders.
	require.Equal(t, map[string]string{
		"0000:18:00.2": "CNI attachment of container 0123456789ab (network default/ib-rail0); DRA claim ns/d",
		"0000:40:00.1": "DRA claim ns/c",
	}, held)
	require.Len(t, warns, 1)
	require.Contains(t, warns[0], "no kubelet PodResources socket")

	// A source that cannot be read holds every VF.
	held, warns = inUse(context.Background(), snap, "", "", func() (map[string]string, error) { return nil, errors.New("torn") })
	require.Len(t, held, 32)
	require.Contains(t, held["0000:dc:00.4"], "DRA checkpoint unreadable")
	require.Contains(t, warns[0], "every VF counts as in use")
}

// provisionedHost is the DGX node after the seed's policy ran on it: 8
// VFs on each compute rail.
func provisionedHost(t *testing.T, ps []provision.Policy) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, fx.Write(root, "dgx-h100-novfs"))
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	_, err = (&provision.Applier{Kernel: provisiontest.New(root), Root: root}).Apply(context.Background(), provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap}))
	require.NoError(t, err)
	return root
}

// vfGauge records SetVFs as the daemon's metrics would export it.
type vfGauge map[string][2]int

func (g vfGauge) SetVFs(pf, policy string, desired, actual int) {
	g[pf+" "+policy] = [2]int{desired, actual}
}

// Once on a node that is as the policy says writes nothing, records each
// PF's desired and actual VFs, and is pending only while the node's
// labels are unknown or the plan could not be made.
func TestOnce(t *testing.T) {
	ps, err := provision.Load(seedPolicy())
	require.NoError(t, err)
	host := provisionedHost(t, ps)
	for _, tc := range []struct {
		name    string
		labels  func(context.Context) (NodeLabels, error)
		pfs     int
		pending bool
		metrics int
	}{
		{"labels known", func(context.Context) (NodeLabels, error) {
			return NodeLabels{Labels: map[string]string{"feature.node.kubernetes.io/network-sriov.capable": "true"}, Source: "--node-labels"}, nil
		}, 8, false, 8},
		{"labels unreadable", func(context.Context) (NodeLabels, error) {
			return NodeLabels{Source: "node a: unreadable", Err: errors.New("forbidden")}, nil
		}, 0, true, 0},
		{"no plan", func(context.Context) (NodeLabels, error) {
			return NodeLabels{}, errors.New(`--node-labels: "a" is not key=value`)
		}, 0, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := &Provisioner{Config: Config{StateDir: t.TempDir()}, HostRoot: host, Labels: tc.labels,
				Log: slog.New(slog.DiscardHandler), Policies: ps}
			g := vfGauge{}
			plan, snap, pending := p.Once(context.Background(), g)
			require.Len(t, plan.PFs, tc.pfs)
			require.Zero(t, plan.Changes(), "the host has the seed's VFs")
			require.Equal(t, tc.pending, pending)
			require.Len(t, g, tc.metrics)
			if tc.metrics > 0 {
				require.Equal(t, [2]int{8, 8}, g["0000:18:00.0 ib-rails"])
				require.NotNil(t, snap, "nothing was written: the scan is the node as it is")
			}
		})
	}
}

// Start loads the policy file; one that does not load stops the start.
func TestStartPolicyUnreadable(t *testing.T) {
	p := &Provisioner{Config: Config{Policy: filepath.Join(t.TempDir(), "none.yaml")}, Log: slog.New(slog.DiscardHandler)}
	_, _, err := p.Start(context.Background(), "mellanox.com", vfGauge{})
	require.Error(t, err)
}
