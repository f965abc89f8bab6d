package netns_test

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

func named(t *testing.T) (*netns.NS, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates network namespaces and veth links")
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	name := "fp-nstest-" + hex.EncodeToString(b)
	out, err := exec.Command("ip", "netns", "add", name).CombinedOutput()
	require.NoError(t, err, "%s", out)
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	n, err := netns.Open("/var/run/netns/" + name)
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	return n, name
}

func TestMoveRenamesAndConfigures(t *testing.T) {
	from, _ := named(t)
	to, _ := named(t)
	require.NoError(t, from.Handle().LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vf0", MTU: 1500}, PeerName: "vf0peer"}))
	mac, _ := net.ParseMAC("02:11:22:33:44:55")
	alias := "vf0"
	l, err := netns.Move("vf0", from, to, netns.LinkConfig{Name: "net1", MAC: mac, MTU: 9000, Alias: &alias})
	require.NoError(t, err)
	require.Equal(t, "net1", l.Attrs().Name)
	require.Equal(t, mac.String(), l.Attrs().HardwareAddr.String())
	require.Equal(t, 9000, l.Attrs().MTU)
	require.Equal(t, "vf0", l.Attrs().Alias)
	_, err = from.Handle().LinkByName("vf0")
	require.Error(t, err)

	_, err = netns.Move("nope", from, to, netns.LinkConfig{})
	require.ErrorIs(t, err, netns.ErrLinkNotFound)
}

// A clash in the target rolls every step back: the link is in the source
// under its name, MAC, MTU and alias.
func TestMoveRollsBackOnNameClash(t *testing.T) {
	from, _ := named(t)
	to, _ := named(t)
	require.NoError(t, from.Handle().LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "vf0", MTU: 1500}, PeerName: "vf0peer"}))
	before, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.NoError(t, to.Handle().LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "net1"}, PeerName: "other"}))
	mac, _ := net.ParseMAC("02:11:22:33:44:55")
	alias := "vf0"
	_, err = netns.Move("vf0", from, to, netns.LinkConfig{Name: "net1", MAC: mac, MTU: 9000, Alias: &alias})
	require.ErrorContains(t, err, "an interface named net1 is already there")
	after, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.Equal(t, before.Attrs().HardwareAddr.String(), after.Attrs().HardwareAddr.String())
	require.Equal(t, 1500, after.Attrs().MTU)
	require.Equal(t, "", after.Attrs().Alias)
}
