// Package testnet holds the helpers that several packages' tests share, so
// that each lives once: the root check, named network namespaces, veth
// links standing in for VF netdevs, and the soak budget that `make soak`
// and `make test` give the fault-injection tests, and Main, which runs a
// package's root tests in namespaces of their own. (Building binaries is
// internal/testsupport/testbin.)
package testnet

import (
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"testing"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// RequireRoot skips the test unless it runs as root; why says what the test
// needs root for.
func RequireRoot(tb testing.TB, why string) {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("needs root: " + why)
	}
}

// RandHex is n random bytes in hex: unique names for links and namespaces.
func RandHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// NetnsDir is where `ip netns` binds named namespaces.
const NetnsDir = "/var/run/netns"

// Netns creates a named network namespace (`ip netns add`) with loopback up
// and returns its name and path; it is deleted when the test ends. Needs
// root.
func Netns(tb testing.TB, prefix string) (name, path string) {
	tb.Helper()
	name = prefix + RandHex(4)
	for _, args := range [][]string{{"netns", "add", name}, {"-n", name, "link", "set", "lo", "up"}} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			tb.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	tb.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return name, NetnsDir + "/" + name
}

// PinnedNetns binds a new network namespace to the file path, as older
// versions of fastpath's CNI pinned the temporary namespace of each move
// (a new file, the namespace bind-mounted on it): what such a version
// left behind, for the tests of its clean-up. The mount is undone, if it
// is still there, when the test ends. Needs root.
func PinnedNetns(tb testing.TB, path string) {
	tb.Helper()
	_, ns := Netns(tb, "fp-pin-")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		tb.Fatal(err)
	}
	if err := unix.Mount(ns, path, "", unix.MS_BIND, ""); err != nil {
		tb.Fatalf("bind-mount %s on %s: %v", ns, path, err)
	}
	tb.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
}

// StandIn creates a veth named name standing in for a VF netdev, in the
// namespace of h (nil: the test's own): up, MTU 1500, a random locally
// administered MAC. Its peer, with a random name, stays where it was made;
// deleting the peer when the test ends deletes the stand-in too, wherever
// it has moved. It returns the stand-in as created. Needs root.
func StandIn(tb testing.TB, h *netlink.Handle, name string) netlink.Link {
	tb.Helper()
	return Veth(tb, h, name, "fp"+RandHex(4))
}

// Veth is StandIn with the peer's name chosen by the caller (who can then
// delete the stand-in, wherever it is, by deleting the peer).
func Veth(tb testing.TB, h *netlink.Handle, name, peer string) netlink.Link {
	tb.Helper()
	if h == nil {
		h = &netlink.Handle{} // the calling thread's namespace, as the package functions
	}
	mac, _ := net.ParseMAC("0a:00:00:" + RandHex(1) + ":" + RandHex(1) + ":" + RandHex(1))
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, HardwareAddr: mac, MTU: 1500}, PeerName: peer}
	if err := h.LinkAdd(v); err != nil {
		tb.Fatalf("stand-in %s: %v", name, err)
	}
	tb.Cleanup(func() {
		if l, err := h.LinkByName(peer); err == nil {
			_ = h.LinkDel(l)
		}
	})
	l, err := h.LinkByName(name)
	if err == nil {
		err = h.LinkSetUp(l)
	}
	if err == nil {
		l, err = h.LinkByName(name)
	}
	if err != nil {
		tb.Fatalf("stand-in %s: %v", name, err)
	}
	return l
}

// PeerOf is the peer of the stand-in name, in h's namespace (nil: the
// test's own).
func PeerOf(tb testing.TB, h *netlink.Handle, name string) netlink.Link {
	tb.Helper()
	if h == nil {
		h = &netlink.Handle{}
	}
	l, err := h.LinkByName(name)
	if err != nil {
		tb.Fatalf("peer of %s: %v", name, err)
	}
	v, ok := l.(*netlink.Veth)
	if !ok {
		tb.Fatalf("peer of %s: a %s, not a veth", name, l.Type())
	}
	idx, err := netlink.VethPeerIndex(v)
	if err != nil {
		tb.Fatalf("peer of %s: %v", name, err)
	}
	p, err := h.LinkByIndex(idx)
	if err != nil {
		tb.Fatalf("peer of %s: %v", name, err)
	}
	return p
}
