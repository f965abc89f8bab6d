package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

func TestMain(m *testing.M) { os.Exit(testnet.Main(m)) }

// TestCNIOnHost drives the real sriov CNI through a phase's plumbing on a
// veth stand-in whose VF has no RDMA device (this machine has no RDMA
// core; make rdma-check adds one): ADD into a pod netns, CHECK, DEL, and
// what the leak check sees before and after DEL.
func TestCNIOnHost(t *testing.T) {
	testnet.RequireRoot(t, "veth links and network namespaces")
	if testing.Short() {
		t.Skip("builds the CNI")
	}
	bin := testbin.Build(t, "github.com/fastpath-k8s/fastpath/cmd/sriov-cni=sriov", testbin.HostLocal)
	var out bytes.Buffer
	r := newReport(&out)
	p, err := newPhase(r, kernelRDMA{}, bin, modeShared)
	require.NoError(t, err)
	t.Cleanup(func() {
		p.cleanup()
		require.False(t, r.failed(), out.String())
	})
	vf := standIn{PCIAddress: vfAddress(0), Netdev: "fprcvf0", RDMA: "rxefpabsent"}
	l, err := p.veth(vf.Netdev, "fprcpeer0")
	require.NoError(t, err)
	vf.MAC = l.Attrs().HardwareAddr.String()
	host, err := p.host(vf)
	require.NoError(t, err)
	pod, podPath, err := p.podNetns()
	require.NoError(t, err)
	n, err := newCNI(p.bin, p.work, host, "rdmacheck-test", "192.168.78.0/24")
	require.NoError(t, err)
	ctx := context.Background()
	rt := attachment(pod, podPath, "net1", vf.PCIAddress)

	res, err := n.add(ctx, rt)
	require.NoError(t, err, n.log())
	require.Equal(t, "192.168.78.2/24", res.IPs[0].Address.String())
	links, err := podLinks(podPath)
	require.NoError(t, err)
	require.Equal(t, []string{"net1"}, links)
	left := strings.Join(n.leftovers(p.node, []string{vf.Netdev}, []string{podPath}), "\n")
	for _, want := range []string{"stand-in fprcvf0 not back in the node's netns", "pod netns " + podPath + " still holds net1",
		"CNI state dir", "host-local still holds 192.168.78.2"} {
		require.Contains(t, left, want)
	}
	require.NoError(t, n.check(ctx, rt), n.log())
	require.NoError(t, n.del(ctx, rt), n.log())
	require.Empty(t, n.leftovers(p.node, []string{vf.Netdev}, []string{podPath}))
	p.clean(n, []string{vf.Netdev}, []string{podPath})
	require.Equal(t, 1, r.counts[outOK], out.String())
	require.Contains(t, out.String(), "nothing left behind: stand-in back in the node's netns under its own name")

	// A VF the host does not have: ADD fails with the CNI's reason.
	_, err = n.add(ctx, attachment(pod, podPath, "net2", vfAddress(5)))
	require.ErrorContains(t, err, "CNI ADD net2 "+vfAddress(5))
	require.Empty(t, n.leftovers(p.node, []string{vf.Netdev}, []string{podPath}))
}
