package plugin

import (
	"net"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/fastpath-k8s/fastpath/internal/testsupport/testnet"
)

// The real route dump: in a namespace of its own, a link with the default
// route is named, IPv4 and IPv6 and both paths of a multipath one; a link
// with only a subnet route, or down, is not.
func TestDefaultRouteNetdevs(t *testing.T) {
	testnet.RequireRoot(t, "creates a network namespace with veths and routes")
	_, path := testnet.Netns(t, "fpdr")
	ns, err := netns.GetFromPath(path)
	require.NoError(t, err)
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	require.NoError(t, err)
	defer h.Close()

	got, err := DefaultRouteNetdevs(&ns)
	require.NoError(t, err)
	require.Empty(t, got, "a fresh namespace has no default route")

	addr := func(l netlink.Link, cidr string) {
		a, err := netlink.ParseAddr(cidr)
		require.NoError(t, err)
		require.NoError(t, h.AddrAdd(l, a))
	}
	mgmt := testnet.StandIn(t, h, "mgmt0")
	addr(mgmt, "10.99.0.2/24")
	gw := net.ParseIP("10.99.0.1")
	require.NoError(t, h.RouteAdd(&netlink.Route{LinkIndex: mgmt.Attrs().Index, Gw: gw}))
	data := testnet.StandIn(t, h, "data0")
	addr(data, "10.98.0.2/24") // a subnet route only

	got, err = DefaultRouteNetdevs(&ns)
	require.NoError(t, err)
	require.Equal(t, []string{"mgmt0"}, got)

	// IPv6 default on another link, and a multipath IPv4 default over two.
	v6 := testnet.StandIn(t, h, "v6up0")
	addr(v6, "fd00:99::2/64")
	_, any6, _ := net.ParseCIDR("::/0")
	require.NoError(t, h.RouteAdd(&netlink.Route{LinkIndex: v6.Attrs().Index, Dst: any6, Gw: net.ParseIP("fd00:99::1")}))
	a, b := testnet.StandIn(t, h, "mpa0"), testnet.StandIn(t, h, "mpb0")
	addr(a, "10.97.0.2/24")
	addr(b, "10.96.0.2/24")
	require.NoError(t, h.RouteDel(&netlink.Route{LinkIndex: mgmt.Attrs().Index, Gw: gw}))
	_, any4, _ := net.ParseCIDR("0.0.0.0/0")
	require.NoError(t, h.RouteAdd(&netlink.Route{Dst: any4, MultiPath: []*netlink.NexthopInfo{
		{LinkIndex: a.Attrs().Index, Gw: net.ParseIP("10.97.0.1")},
		{LinkIndex: b.Attrs().Index, Gw: net.ParseIP("10.96.0.1")},
	}}))
	got, err = DefaultRouteNetdevs(&ns)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"v6up0", "mpa0", "mpb0"}, got)
}
