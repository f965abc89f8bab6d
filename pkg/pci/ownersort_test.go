package pci

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// ownerOrder gives the order of a sort of the entries that have an owner
// by owner, stably; so does appendByKey, its way past the index bits,
// which no host reaches to test it there.
func TestOwnerOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	base, _ := keyOf("0000:10:00.0")
	var o ownerOrder
	for _, n := range []int{0, 5, 100, 1032} {
		owners := make([]ownerKey, n)
		for i := range owners {
			if rng.IntN(10) > 0 { // some entries have no owner
				owners[i] = base + ownerKey(rng.Uint64N(8)<<12+rng.Uint64N(0x20)<<4+rng.Uint64N(8))
			}
		}
		want := []int32{-1} // appended to, not overwritten
		for i, k := range owners {
			if k != 0 {
				want = append(want, int32(i))
			}
		}
		slices.SortStableFunc(want[1:], func(a, b int32) int { return cmp.Compare(owners[a], owners[b]) })
		require.Equal(t, want, o.appendOrder([]int32{-1}, owners), "ownerOrder, %d entries", n)
		require.Equal(t, want, appendByKey([]int32{-1}, owners), "appendByKey, %d entries", n)
	}
}
