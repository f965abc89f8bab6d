package ifname

import (
	"testing"

	"github.com/containernetworking/cni/pkg/utils"
	"github.com/stretchr/testify/require"
)

// TestWhereTheCNILibraryDiffers is why Check is not the CNI library's
// utils.ValidateInterfaceName (docs/benchmarks.md, library decisions): the
// library reads runes and Unicode's spaces, the kernel (dev_valid_name,
// net/core/dev.c) bytes and its Latin-1 isspace (lib/ctype.c). For the
// names below one of them is wrong about what the kernel takes.
func TestWhereTheCNILibraryDiffers(t *testing.T) {
	for _, tc := range []struct {
		name         string
		kernelTakes  bool
		libraryTakes bool
	}{
		{"net1", true, true},
		{"eth\u00e0", false, true}, // 0xc3 0xa0: 0xa0 is the kernel's no-break space
		{"eth\u2003", true, false}, // 0xe2 0x80 0x83: no byte the kernel calls space
		{"eth\x00x", false, true},  // a C string ends at the NUL
		{"a\u00a0b", false, false}, // both refuse
	} {
		require.Equal(t, tc.kernelTakes, Check(tc.name) == nil, "Check(%q)", tc.name)
		require.Equal(t, tc.libraryTakes, utils.ValidateInterfaceName(tc.name) == nil, "ValidateInterfaceName(%q)", tc.name)
	}
}
