package netns_test

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
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

func TestMoveToRenamesAndConfigures(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "vf0")
	l, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.NoError(t, from.Handle().LinkSetUp(l), "an up link moves too")
	mac := l.Attrs().HardwareAddr.String()
	alias := "vf0"
	l, err = netns.MoveTo("vf0", from, to, netns.LinkConfig{Name: "net1", MTU: 9000, Alias: &alias})
	require.NoError(t, err)
	require.Equal(t, "net1", l.Attrs().Name)
	require.Equal(t, mac, l.Attrs().HardwareAddr.String())
	require.Equal(t, 9000, l.Attrs().MTU)
	require.Equal(t, "vf0", l.Attrs().Alias)
	require.Zero(t, l.Attrs().Flags&net.FlagUp, "a move takes the link down")
	_, err = from.Handle().LinkByName("vf0")
	require.Error(t, err)

	// and back, the alias cleared
	none := ""
	l, err = netns.MoveTo("net1", to, from, netns.LinkConfig{Name: "vf0", MTU: 1500, Alias: &none})
	require.NoError(t, err)
	require.Equal(t, "vf0", l.Attrs().Name)
	require.Equal(t, 1500, l.Attrs().MTU)
	require.Equal(t, "", l.Attrs().Alias)

	_, err = netns.MoveTo("nope", from, to, netns.LinkConfig{})
	require.ErrorIs(t, err, netns.ErrLinkNotFound)
}

// The link's own name taken in the target is no clash: it arrives under
// cfg's (__dev_change_net_namespace's pattern); with no new name it is.
func TestMoveToOwnNameTakenInTarget(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "eth0")
	veth(t, to, "eth0")
	l, err := netns.MoveTo("eth0", from, to, netns.LinkConfig{Name: "net1"})
	require.NoError(t, err)
	require.Equal(t, "net1", l.Attrs().Name)

	veth(t, from, "eth1")
	veth(t, to, "eth1")
	_, err = netns.MoveTo("eth1", from, to, netns.LinkConfig{})
	require.ErrorIs(t, err, unix.EEXIST)
	require.ErrorContains(t, err, "an interface named eth1 is already there")
	_, err = from.Handle().LinkByName("eth1")
	require.NoError(t, err, "still in the source")
}

// A new name taken in the target is refused before anything changes.
func TestMoveToRefusesATakenName(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "vf0")
	before, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.NoError(t, to.Handle().LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "net1"}, PeerName: "other"}))
	alias := "vf0"
	_, err = netns.MoveTo("vf0", from, to, netns.LinkConfig{Name: "net1", MTU: 9000, Alias: &alias})
	require.ErrorContains(t, err, "an interface named net1 is already there")
	after, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.Equal(t, before.Attrs().Index, after.Attrs().Index)
	require.Equal(t, 1500, after.Attrs().MTU)
	require.Equal(t, "", after.Attrs().Alias)
}

// A part the kernel refuses after the move (an MTU over veth's 65535:
// dev_set_mtu_ext runs after __dev_change_net_namespace in do_setlink)
// sends the link back under its own name, MTU and alias.
func TestMoveToRefusedAfterTheMoveComesBack(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "vf0")
	l, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err)
	require.NoError(t, from.Handle().LinkSetAlias(l, "mine"))
	alias := "vf0"
	_, err = netns.MoveTo("vf0", from, to, netns.LinkConfig{Name: "net1", MTU: 70000, Alias: &alias})
	require.ErrorIs(t, err, unix.EINVAL)
	require.ErrorContains(t, err, "move vf0 into")
	back, err := from.Handle().LinkByName("vf0")
	require.NoError(t, err, "back in the source under its name")
	require.Equal(t, 1500, back.Attrs().MTU)
	require.Equal(t, "mine", back.Attrs().Alias)
	links, err := to.Links()
	require.NoError(t, err)
	require.Empty(t, links)
}

// A namespace pinned to a file (as older versions of the CNI left one)
// outlives every handle to it: a link left there is found again by path,
// and moved on from there; Unpin releases it.
func TestPinnedNamespaceKeepsLinksUntilUnpin(t *testing.T) {
	from, to := named(t), named(t)
	veth(t, from, "vf0")
	path := filepath.Join(t.TempDir(), "vf.netns")
	testnet.PinnedNetns(t, path)
	via, err := netns.Open(path)
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
	moved, err := netns.MoveTo("net1", again, to, netns.LinkConfig{Name: "eth1", MTU: 4000, Alias: &alias})
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

// Unpin of a plain file (a process killed before the mount) removes it.
func TestUnpinPlainFile(t *testing.T) {
	file := filepath.Join(t.TempDir(), "exists")
	require.NoError(t, os.WriteFile(file, nil, 0o600))
	require.NoError(t, netns.Unpin(file))
	_, err := os.Stat(file)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// OpenPin takes only a network namespace bound to the file itself: a
// symlink (even to a real namespace), a regular file, a UTS namespace
// and the caller's own network namespace are refused with ErrNotPin.
func TestOpenPin(t *testing.T) {
	testnet.RequireRoot(t, "bind-mounts namespaces")
	dir := t.TempDir()
	pinned := filepath.Join(dir, "pinned")
	testnet.PinnedNetns(t, pinned)
	bindOn := func(name, src string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, nil, 0o600))
		require.NoError(t, unix.Mount(src, path, "", unix.MS_BIND, ""))
		t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
		return path
	}
	symlinkTo := func(name, target string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.Symlink(target, path))
		return path
	}
	regular := filepath.Join(dir, "regular")
	require.NoError(t, os.WriteFile(regular, []byte("x"), 0o600))

	n, err := netns.OpenPin(pinned)
	require.NoError(t, err, "a namespace bound to the file")
	n.Close()
	for _, tc := range []struct{ name, path string }{
		{"symlink to the own netns", symlinkTo("link-own", "/proc/self/ns/net")},
		{"symlink to a pinned netns", symlinkTo("link-pinned", pinned)},
		{"regular file", regular},
		{"own netns bind-mounted", bindOn("own", "/proc/self/ns/net")},
		{"UTS namespace bind-mounted", bindOn("uts", "/proc/self/ns/uts")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := netns.OpenPin(tc.path)
			require.ErrorIs(t, err, netns.ErrNotPin)
		})
	}
	_, err = netns.OpenPin(filepath.Join(dir, "missing"))
	require.ErrorIs(t, err, os.ErrNotExist)
}

// Unpin removes a symlink without following it: the namespace it points
// to stays bound where it was.
func TestUnpinSymlink(t *testing.T) {
	testnet.RequireRoot(t, "bind-mounts namespaces")
	dir := t.TempDir()
	pinned := filepath.Join(dir, "pinned")
	testnet.PinnedNetns(t, pinned)
	link := filepath.Join(dir, "link")
	require.NoError(t, os.Symlink(pinned, link))
	require.NoError(t, netns.Unpin(link))
	_, err := os.Lstat(link)
	require.ErrorIs(t, err, os.ErrNotExist)
	n, err := netns.OpenPin(pinned)
	require.NoError(t, err, "the target is still a bound namespace")
	n.Close()
}
