package main

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"

	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
	"github.com/fastpath-k8s/fastpath/pkg/provision/provisiontest"
)

// componentCaps are the capabilities deployments/components/provision
// adds to the plugin's container, as setpriv spells them.
func componentCaps(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "deployments", "components", "provision", "daemonset-provision.yaml"))
	require.NoError(t, err)
	var ds appsv1.DaemonSet
	require.NoError(t, yaml.UnmarshalStrict(data, &ds))
	c := ds.Spec.Template.Spec.Containers[0]
	require.Equal(t, "rdma-device-plugin", c.Name)
	require.NotNil(t, c.SecurityContext.Capabilities)
	var caps []string
	for _, c := range c.SecurityContext.Capabilities.Add {
		caps = append(caps, strings.ToLower(string(c)))
	}
	require.NotEmpty(t, caps)
	return caps
}

// TestProvisionUnderComponentCaps runs `provision` as
// components/provision runs it — root with only the capabilities the
// component adds (an empty bounding set otherwise, no_new_privs), in the
// network namespace that has the PF — on a copy of the DGX host with no
// VFs (provisiontest.Standin adds them when sriov_numvfs is written), where
// a veth stands for the rail-0 PF's netdev. The sysfs writes
// need no capability; the GUID's rtnetlink call gets past the kernel's
// CAP_NET_ADMIN check to the device (a veth is no InfiniBand device, and
// says so: EOPNOTSUPP). Without the capability the kernel refuses it
// (EPERM): the component grants what is needed, and no more is used.
func TestProvisionUnderComponentCaps(t *testing.T) {
	testnet.RequireRoot(t, "creates a network namespace and a veth named as a fixture PF")
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		t.Skip("needs setpriv (util-linux)")
	}
	caps := componentCaps(t)
	require.Equal(t, []string{"net_admin"}, caps)
	bin := binary(t)
	for _, tc := range []struct {
		name    string
		bset    string
		wantErr string
	}{
		{"component's capabilities", "-all,+" + strings.Join(caps, ",+"), "node GUID: operation not supported"},
		{"no capabilities", "-all", "node GUID: operation not permitted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			const pf = "0000:18:00.0"
			host := t.TempDir()
			require.NoError(t, fx.Write(host, "dgx-h100-novfs"))
			// The VFs must be on the bus before their GUIDs are set: the
			// stand-in adds them when sriov_numvfs is written. Without
			// MLNX_OFED's GUID files the rtnetlink error is the answer.
			standin, err := provisiontest.NewStandin(&provisiontest.Host{Root: host}, slog.New(slog.DiscardHandler))
			require.NoError(t, err)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- standin.Run(ctx) }()
			defer func() {
				cancel()
				require.NoError(t, <-done)
			}()
			ns, nsPath := testnet.Netns(t, "fp-prov-")
			n, err := netns.Open(nsPath)
			require.NoError(t, err)
			defer n.Close()
			testnet.StandIn(t, n.Handle(), "ibp24s0")

			args := append([]string{"netns", "exec", ns, "env", "-u", "NODE_NAME", "-u", "FASTPATH_NODE_LABELS",
				setpriv, "--no-new-privs", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=" + tc.bset, bin},
				provisionArgs(t, host, "--provision-timeout", "1s")...)
			out, err := exec.Command("ip", args...).CombinedOutput()
			require.Error(t, err, "%s", out)
			s := string(out)
			line := ""
			for l := range strings.SplitSeq(s, "\n") {
				if strings.Contains(l, "pci "+pf+": step 3 (set VF node/port GUID 0") {
					line = l
				}
			}
			require.NotEmpty(t, line, "the rail-0 PF's first GUID step failed: %s", s)
			require.Contains(t, line, "on ibp24s0: "+tc.wantErr)
			// The sysfs writes before it went through, as root without a capability.
			b, err := os.ReadFile(filepath.Join(host, "sys/bus/pci/devices", pf, "sriov_numvfs"))
			require.NoError(t, err)
			require.Equal(t, "8", strings.TrimSpace(string(b)))
		})
	}
}
