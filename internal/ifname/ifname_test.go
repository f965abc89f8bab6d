package ifname

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestCheck(t *testing.T) {
	for _, ok := range []string{"net1", "eth0", "ibp24s0v0", "a", strings.Repeat("x", 15), "...", "a.b", "vlan@100", "é"} {
		require.NoError(t, Check(ok), ok)
	}
	for _, tc := range []struct{ name, why string }{
		{"", "empty"},
		{strings.Repeat("x", 16), "16 bytes long"},
		{".", "reserved"},
		{"..", "reserved"},
		{"a/b", `contains '/'`},
		{"eth0:1", `contains ':'`},
		{"a b", "whitespace"},
		{"a\tb", "whitespace"},
		{"a\vb", "whitespace"},
		{"à", "whitespace (byte 0xa0)"}, // C3 A0: the kernel's isspace takes 0xa0
		{"a\x00b", "NUL"},
	} {
		err := Check(tc.name)
		require.Error(t, err, "%q", tc.name)
		require.ErrorContains(t, err, tc.why)
		require.ErrorContains(t, err, "is not an interface name")
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{"net1", "", ".", "a/b", "à", strings.Repeat("y", 16)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if Check(name) != nil {
			return
		}
		// What passes is what the kernel's dev_valid_name passes.
		if name == "" || len(name) > MaxLen || name == "." || name == ".." || strings.ContainsAny(name, "/:\x00") ||
			strings.IndexFunc(name, func(r rune) bool { return strings.ContainsRune("\t\n\v\f\r ", r) }) >= 0 ||
			strings.IndexByte(name, 0xa0) >= 0 {
			t.Fatalf("accepted %q", name)
		}
	})
}
