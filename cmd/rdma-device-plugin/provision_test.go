package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
	"github.com/fastpath-k8s/fastpath/pkg/provision"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

func seedPolicy() string { return filepath.Join("..", "..", "testdata", "policy", "seed.yaml") }

// provisionArgs keep the subcommand off this machine's kubelet and CNI.
func provisionArgs(t *testing.T, host string, more ...string) []string {
	return append([]string{"provision", "--policy", seedPolicy(), "--host-root", host,
		"--provision-state-dir", t.TempDir(), "--pod-resources-socket", "", "--cni-state-dir", t.TempDir()}, more...)
}

func TestProvisionDryRun(t *testing.T) {
	host := fixture("dgx-h100-novfs")
	var out, errs bytes.Buffer
	require.NoError(t, run(context.Background(), provisionArgs(t, host, "--dry-run"), &out, &errs), errs.String())
	s := out.String()
	require.Contains(t, s, "0000:18:00.0  ibp24s0   ib-rails  0/16  8     27 steps: sriov_numvfs 0 -> 8, 8 GUID, 8 bind")
	require.Contains(t, s, "0000:dc:00.0 would:")
	require.Contains(t, s, " 2. write sriov_numvfs 8")
	require.NotContains(t, s, "0000:29:00.0", "the storage NICs are not in pfNames")
	b, err := os.ReadFile(filepath.Join(host, "sys/bus/pci/devices/0000:18:00.0/sriov_numvfs"))
	require.NoError(t, err)
	require.Equal(t, "0\n", string(b), "a dry run writes nothing")

	out.Reset()
	require.NoError(t, run(context.Background(), provisionArgs(t, host, "--dry-run", "-o", "json"), &out, &errs))
	var plan planJSON
	require.NoError(t, json.Unmarshal(out.Bytes(), &plan))
	require.Len(t, plan.PFs, 8)
	require.Equal(t, 8, plan.PFs[0].Want)
	require.Len(t, plan.PFs[0].Steps, 27)
	require.Contains(t, plan.NodeLabels, "unknown")

	// Labels that the seed's nodeSelector does not match: nothing to do.
	out.Reset()
	require.NoError(t, run(context.Background(), provisionArgs(t, host, "--dry-run", "--node-labels", "kubernetes.io/os=linux"), &out, &errs))
	require.Contains(t, out.String(), "nodeSelector")
	require.Contains(t, out.String(), "nothing to change")
	require.Contains(t, out.String(), "node labels: --node-labels\n")

	err = run(context.Background(), []string{"provision", "--dry-run"}, &out, &errs)
	require.ErrorContains(t, err, "--policy FILE is required")
}

// provisionedHost is the DGX node after the seed's policy ran on it: 8
// VFs on each compute rail, with their derived GUIDs.
func provisionedHost(t testing.TB) string {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, fx.Write(root, "dgx-h100-novfs"))
	ps, err := provision.Load(seedPolicy())
	require.NoError(t, err)
	snap, err := nic.NewScanner(root).Scan()
	require.NoError(t, err)
	k := provisiontest.New(root)
	_, err = (&provision.Applier{Kernel: k, Root: root}).Apply(context.Background(), provision.NewPlan(ps, provision.Node{Root: root, Snapshot: snap}))
	require.NoError(t, err)
	return root
}

func TestDiscoverWithPolicy(t *testing.T) {
	v := discoverJSON(t, "--host-root", fixture("dgx-h100"), "--policy", seedPolicy())
	prov := v["provisioning"].([]any)
	require.Len(t, prov, 8)
	pf := prov[0].(map[string]any)
	require.Equal(t, "ib-rails", pf["policy"])
	require.EqualValues(t, 4, pf["numVfs"])
	require.EqualValues(t, 16, pf["totalVfs"])
	require.EqualValues(t, 8, pf["want"])
	pools := v["pools"].([]any)
	require.Len(t, pools, 1)
	require.Equal(t, "mellanox.com/mlnx_sriov_rdma", pools[0].(map[string]any)["resource"])
	require.Len(t, pools[0].(map[string]any)["devices"], 32)

	// The seed's nodeSelector, matched against the node's labels as
	// provisioning matches it.
	v = discoverJSON(t, "--host-root", fixture("dgx-h100"), "--policy", seedPolicy(), "--node-labels", "kubernetes.io/os=linux")
	require.Empty(t, v["provisioning"])
	require.Contains(t, fmt.Sprint(v["warnings"]), "policy ib-rails: nodeSelector map[feature.node.kubernetes.io/network-sriov.capable:true] does not match this node's labels")
	v = discoverJSON(t, "--host-root", fixture("dgx-h100"), "--policy", seedPolicy(), "--node-labels", "feature.node.kubernetes.io/network-sriov.capable=true")
	require.Len(t, v["provisioning"], 8)

	var out, errs bytes.Buffer
	require.NoError(t, run(context.Background(), []string{"discover", "--host-root", provisionedHost(t), "--policy", seedPolicy()}, &out, &errs))
	require.Contains(t, out.String(), "0000:18:00.0 (8/16 VFs, policy ib-rails)")
	require.Contains(t, out.String(), "pool mellanox.com/mlnx_sriov_rdma (exclusive): 64 devices")
	require.False(t, strings.Contains(out.String(), "wants"))
}

// The daemon with --policy and no pool config: on a node whose VFs match
// the policy it writes nothing, serves the policy's pool and exports
// desired and actual VFs per PF.
func TestServeWithPolicy(t *testing.T) {
	host := provisionedHost(t)
	d := startDaemonWith(t, daemonOpts{host: host, config: filepath.Join(t.TempDir(), "none.json"),
		args: []string{"--policy", seedPolicy(), "--provision-state-dir", t.TempDir(), "--cni-state-dir", t.TempDir()}})
	regs := d.registrations("mellanox.com/mlnx_sriov_rdma")
	c := d.client(regs["mellanox.com/mlnx_sriov_rdma"].Endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	require.NoError(t, err)
	first, err := stream.Recv()
	require.NoError(t, err)
	require.Len(t, first.Devices, 64)
	code, body := d.get("/metrics")
	require.Equal(t, 200, code)
	require.Contains(t, body, `fastpath_provision_vfs_desired{pf="0000:18:00.0",policy="ib-rails"} 8`)
	require.Contains(t, body, `fastpath_provision_vfs{pf="0000:dc:00.0"} 8`)
	require.NotContains(t, d.log.String(), "provisioning PF", "nothing is written on a node that matches")
	for _, l := range strings.Split(d.log.String(), "\n") {
		if strings.Contains(l, `"msg":"provisioned"`) {
			t.Log(l) // how long the re-apply at start took
		}
	}
	d.stop()
}
