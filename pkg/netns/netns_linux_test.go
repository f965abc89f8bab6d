package netns_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"

	"github.com/fastpath-k8s/fastpath/internal/testnet"
	"github.com/fastpath-k8s/fastpath/pkg/netns"
)

func TestMain(m *testing.M) { os.Exit(testnet.Main(m)) }

func named(t *testing.T) *netns.NS {
	t.Helper()
	testnet.RequireRoot(t, "creates network namespaces and veth links")
	_, path := testnet.Netns(t, "fp-nstest-")
	n, err := netns.Open(path)
	require.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	return n
}

func veth(t *testing.T, in *netns.NS, name string) {
	t.Helper()
	require.NoError(t, in.Handle().LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, MTU: 1500}, PeerName: name + "peer"}))
}

// The plugin's own namespace opens and reads without privileges: no setns.
func TestCurrentNeedsNoPrivilege(t *testing.T) {
	n, err := netns.Current()
	require.NoError(t, err)
	defer n.Close()
	l, err := n.Handle().LinkByName("lo")
	require.NoError(t, err)
	require.Equal(t, "lo", l.Attrs().Name)
}

func TestIsCurrent(t *testing.T) {
	for _, p := range []string{"/proc/self/ns/net", "/proc/thread-self/ns/net"} {
		same, err := netns.IsCurrent(p)
		require.NoError(t, err)
		require.True(t, same, p)
	}
	file := filepath.Join(t.TempDir(), "not-a-netns")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	same, err := netns.IsCurrent(file)
	require.NoError(t, err)
	require.False(t, same)
	_, err = netns.IsCurrent(filepath.Join(t.TempDir(), "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)

	if os.Geteuid() == 0 {
		_, path := testnet.Netns(t, "fp-nstest-")
		same, err := netns.IsCurrent(path)
		require.NoError(t, err)
		require.False(t, same, "another namespace")
	}
}

func TestMoveRenamesAndConfigures(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "vf0")
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
	from, to := named(t), named(t)
	veth(t, from, "vf0")
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

// A pinned namespace outlives every handle to it: a link left there is
// found again by path, and a move is finished from there.
func TestPinKeepsLinksUntilUnpin(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "vf0")
	path := filepath.Join(t.TempDir(), "vf.netns")
	via, err := netns.Pin(path)
	require.NoError(t, err)
	t.Cleanup(func() { _ = netns.Unpin(path) })
	links, err := via.Links()
	require.NoError(t, err)
	require.Empty(t, links, "a new namespace holds only loopback")

	// A process dies with the link half-way: moved into the pinned
	// namespace and renamed there.
	l, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.NoError(t, from.Handle().LinkSetNsFd(l, via.Fd()))
	l, err = via.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.NoError(t, via.Handle().LinkSetName(l, "net1"))
	require.NoError(t, via.Close())

	again, err := netns.Open(path)
	require.NoError(t, err)
	defer again.Close()
	links, err = again.Links()
	require.NoError(t, err)
	require.Equal(t, []string{"net1"}, links, "the link outlived the handle")

	alias := "vf0"
	moved, err := netns.MoveVia("net1", again, again, to, netns.LinkConfig{Name: "eth1", MTU: 4000, Alias: &alias})
	require.NoError(t, err)
	require.Equal(t, "eth1", moved.Attrs().Name)
	require.Equal(t, 4000, moved.Attrs().MTU)
	links, err = again.Links()
	require.NoError(t, err)
	require.Empty(t, links)

	require.NoError(t, netns.Unpin(path))
	_, err = os.Stat(path)
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, netns.Unpin(path), "twice is fine")
}

func TestPinRefusesExistingPaths(t *testing.T) {
	testnet.RequireRoot(t, "creates network namespaces")
	dir := t.TempDir()
	file := filepath.Join(dir, "exists")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	_, err := netns.Pin(file)
	require.ErrorIs(t, err, os.ErrExist)
	link := filepath.Join(dir, "dangling")
	require.NoError(t, os.Symlink(filepath.Join(dir, "target"), link))
	_, err = netns.Pin(link)
	require.Error(t, err)
	_, err = os.Stat(filepath.Join(dir, "target"))
	require.ErrorIs(t, err, os.ErrNotExist, "nothing created through the symlink")

	// Unpin of a plain file (a process killed before the mount) removes it.
	require.NoError(t, netns.Unpin(file))
	_, err = os.Stat(file)
	require.ErrorIs(t, err, os.ErrNotExist)
}
