package pci

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOwnerOf(t *testing.T) {
	tests := []struct{ target, sub, name, want string }{
		{"../../devices/pci0000:15/0000:15:01.0/0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", "0000:18:00.1"},
		{"../../devices/pci0000:15/0000:18:00.0/infiniband/mlx5_0", "infiniband", "mlx5_0", "0000:18:00.0"},
		{"../../devices/virtual/net/veth0", "net", "veth0", ""},
		{"../../devices/pci0000:0a/0000:0c:00.0/ice.roce.0/infiniband_verbs/uverbs0", "infiniband_verbs", "uverbs0", ""},
		{"../../devices/pci0000:15/0000:18:00.0/net/other", "net", "ibp24s0", ""},
		{"garbage", "net", "garbage", ""},
		{"/net/x", "net", "x", ""},
		// Links that leave <sys>/devices name no owner, whatever their tail.
		{"../../../../etc/devices/pci0000:15/0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/../../../x/0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/pci0000:15/./0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices//0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"/sys/devices/pci0000:15/0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../class/../../devices/pci0000:15/0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		// The address is the whole element before <sub>, and <sub> and
		// <name> are whole elements.
		{"../../devices/pci0000:15/10000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/pci0000:15/0000:18:00.1/nat/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/pci0000:15/0000:18:00.1:net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/pci0000:15/0000:18:00.1/net:ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/pci0000:15/0000:18:00.1/net/xibp24s0v0", "net", "ibp24s0v0", ""},
		{"0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", ""},
		{"../../devices/pci0000:15/.a/0000:18:00.1/net/ibp24s0v0", "net", "ibp24s0v0", "0000:18:00.1"},
	}
	for _, tt := range tests {
		k, ok := ownerOf([]byte(tt.target), tt.sub, tt.name)
		require.Equal(t, tt.want != "", ok, tt.target)
		if ok {
			require.Equal(t, tt.want, k.String(), tt.target)
		}
	}
}

func TestClassLinkInside(t *testing.T) {
	for target, want := range map[string]bool{
		"../../devices/pci0000:15/0000:18:00.1/net/eth0": true,
		"../../devices/virtual/net/lo":                   true,
		"../../devices/..x/0000:18:00.1/net/eth0":        true, // a name that starts with dots
		"../../devices/":                                 false,
		"../../devices/a/../../../etc":                   false,
		"../../devices/a/..":                             false,
		"../../devices/./a":                              false,
		"../../devices/.":                                false,
		"../../devices/a/.":                              false,
		"../../devices/a//b":                             false,
		"../../devices//a":                               false,
		"../../devices/.a/b":                             true,
		"../../../devices/a":                             false,
		"/sys/devices/a":                                 false,
		"devices/a":                                      false,
		"":                                               false,
	} {
		require.Equal(t, want, ClassLinkInside(target), target)
	}
}

func TestClassReader(t *testing.T) {
	sys := t.TempDir()
	class := filepath.Join(sys, "class", "net")
	require.NoError(t, os.MkdirAll(class, 0o755))
	for name, target := range map[string]string{
		"eth9":  "../../devices/pci0000:00/0000:02:00.0/net/eth9",
		"veth1": "../../devices/virtual/net/veth1",
		"out0":  "../../../../outside/devices/pci0000:00/0000:00:01.0/0000:01:00.1/net/out0",
	} {
		require.NoError(t, os.Symlink(target, filepath.Join(class, name)))
	}
	// Several netdevs of one function, made out of order: the listing
	// comes in the file system's order, and its names come out sorted.
	several := []string{"z9", "b0", "m5", "a0", "q1", "c3", "b01"}
	for _, name := range several {
		require.NoError(t, os.Symlink("../../devices/pci0000:00/0000:00:01.0/0000:01:00.1/net/"+name, filepath.Join(class, name)))
	}
	sorted := []string{"a0", "b0", "b01", "c3", "m5", "q1", "z9"}
	for _, workers := range []int{0, 1, 3, 8} {
		links, err := new(ClassReader).Read(sys, "net", "net", workers, nil)
		require.NoError(t, err)
		require.Equal(t, map[string][]string{"0000:01:00.1": sorted, "0000:02:00.0": {"eth9"}}, asMap(links), "workers=%d", workers)
		require.Equal(t, sorted, links.Of("0000:01:00.1"))
		require.Nil(t, links.Of("0000:01:00.2"))
		require.Nil(t, links.Of("short"))
	}
	links, err := new(ClassReader).Read(sys, "infiniband", "infiniband", 2, nil)
	require.NoError(t, err, "a missing class (module not loaded) is empty, not an error")
	require.Empty(t, asMap(links))
}

func TestClassReaderSharing(t *testing.T) {
	sys := t.TempDir()
	class := filepath.Join(sys, "class", "infiniband_mad")
	require.NoError(t, os.MkdirAll(class, 0o755))
	const a, b, c = "0000:01:00.0", "0000:01:00.1", "0000:02:00.0"
	for name, owner := range map[string]string{
		"umad0": a,
		"issm0": b, // never read: it shares umad0's parent
		"umad1": b,
		"issm1": b,
		"issm7": c, // no umad7 listed: read its own link
		// A family number past twice the entries is no kernel's: no
		// family, each reads its own link.
		"umad9999": a,
		"issm9999": c,
	} {
		require.NoError(t, os.Symlink("../../devices/pci0000:00/"+owner+"/infiniband_mad/"+name, filepath.Join(class, name)))
	}
	umadFamily := func(name string) (uint32, bool, bool) {
		for prefix, head := range map[string]bool{"umad": true, "issm": false} {
			if rest, ok := strings.CutPrefix(name, prefix); ok {
				n, err := strconv.ParseUint(rest, 10, 32)
				return uint32(n), head, err == nil
			}
		}
		return 0, false, false
	}
	for _, workers := range []int{1, 4} {
		links, err := new(ClassReader).Read(sys, "infiniband_mad", "infiniband_mad", workers, umadFamily)
		require.NoError(t, err)
		require.Equal(t, map[string][]string{a: {"issm0", "umad0", "umad9999"}, b: {"issm1", "umad1"}, c: {"issm7", "issm9999"}}, asMap(links), "workers=%d", workers)
	}
}

// asMap is links by owner, checking that the owners are sorted and
// distinct (Of searches them).
func asMap(links ClassLinks) map[string][]string {
	m := map[string][]string{}
	for i, o := range links.owners {
		if i > 0 && links.owners[i-1] >= o {
			panic("owners out of order at " + o.String())
		}
		m[o.String()] = links.names(i)
	}
	return m
}

// String is the address k is the key of.
func (k ownerKey) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", uint64(k)>>20&0xffff, uint64(k)>>12&0xff, uint64(k)>>4&0xff, uint64(k)&0xf)
}

// Keys order as their addresses do, and every valid address has one.
func TestKeyOf(t *testing.T) {
	addrs := []string{"0000:00:00.0", "0000:00:00.7", "0000:00:01.0", "0000:00:1f.7", "0000:01:00.0", "0000:18:00.1",
		"0000:a0:00.0", "0000:ff:1f.7", "0001:00:00.0", "00ab:3b:02.3", "ffff:ff:1f.7"}
	var prev ownerKey
	for i, a := range addrs {
		k, ok := keyOf(a)
		require.True(t, ok, a)
		require.Equal(t, a, k.String())
		require.NotZero(t, k, a)
		if i > 0 {
			require.Less(t, prev, k, "%s after %s", a, addrs[i-1])
		}
		prev = k
	}
	for _, a := range []string{"", "0000:18:00.8", "0000:18:20.0", "0000:1G:00.1", "0000:AB:00.1", "0000:18:00.1\n", "0000-18:00.1"} {
		_, ok := keyOf(a)
		require.False(t, ok, a)
	}
}
