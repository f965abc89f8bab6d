package pci

import (
	"cmp"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

// sortByOwner sorts as slices.Sort does, whatever bits the owners differ
// in: a node's few low bytes, one owner, bits far apart (more than four
// bytes: slices.Sort), and too few keys for the radix.
func TestSortByOwner(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	owners := map[string]func() uint64{
		"node": func() uint64 { // 0000:1x:dd.f
			k, _ := keyOf("0000:10:00.0")
			return uint64(k) + rng.Uint64N(8)<<12 + rng.Uint64N(0x20)<<4 + rng.Uint64N(8)
		},
		"one":  func() uint64 { k, _ := keyOf("0000:18:00.1"); return uint64(k) },
		"wide": func() uint64 { return 1<<36 | rng.Uint64N(1<<36) },
		"odd":  func() uint64 { return 1<<36 | rng.Uint64N(2)<<33 | rng.Uint64N(2)<<2 }, // two bits 31 apart
	}
	for name, owner := range owners {
		for _, n := range []int{0, 1, 63, 64, 1032, 5000} {
			keys := make([]uint64, n)
			for i := range keys {
				keys[i] = owner()<<indexBits | uint64(i)
			}
			want := slices.Clone(keys)
			slices.Sort(want)
			got, spare := sortByOwner(slices.Clone(keys), make([]uint64, n))
			require.Equal(t, want, got, "%s, %d keys", name, n)
			require.Len(t, spare, n)
		}
	}
}

// BenchmarkSortByOwner sorts the keys of a 1024-VF host's class, in the
// hash order of a listing, against slices.Sort.
func BenchmarkSortByOwner(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	base, _ := keyOf("0000:10:00.0")
	var owners []uint64
	for bus := range uint64(8) {
		for fn := range uint64(129) {
			owners = append(owners, uint64(base)+bus<<12+fn/8<<4+fn%8)
		}
	}
	rng.Shuffle(len(owners), func(i, j int) { owners[i], owners[j] = owners[j], owners[i] })
	keys := make([]uint64, len(owners))
	for i, o := range owners {
		keys[i] = o<<indexBits | uint64(i)
	}
	work, tmp := make([]uint64, len(keys)), make([]uint64, len(keys))
	b.Run("sortByOwner", func(b *testing.B) {
		for b.Loop() {
			copy(work, keys)
			sortByOwner(work, tmp)
		}
	})
	b.Run("slices.Sort", func(b *testing.B) {
		for b.Loop() {
			copy(work, keys)
			slices.Sort(work)
		}
	})
}

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
