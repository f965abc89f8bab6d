package pci

import (
	"math/bits"
	"slices"
)

// sortByOwner sorts keys, each an owner's key above an entry's index
// (indexBits), that come in the order of their indexes, by owner and so
// by owner and then index. It is a stable radix sort, a byte at a time,
// over only the bits in which the owners differ: the functions of a node
// differ in their bus, device and function numbers, two or three bytes,
// where a comparison sort of a thousand entries makes some ten passes
// over them with a branch per step that the hash order of a listing
// leaves unpredictable. Owners that differ in more than four bytes (no
// node's), and few keys, go to slices.Sort. tmp is scratch of at least
// len(keys); the result is in keys or in tmp, and the other is returned
// as the spare.
func sortByOwner(keys, tmp []uint64) (sorted, spare []uint64) {
	if len(keys) < 64 {
		slices.Sort(keys)
		return keys, tmp
	}
	first := keys[0] >> indexBits
	var diff uint64
	for _, k := range keys {
		diff |= k>>indexBits ^ first
	}
	if diff == 0 {
		return keys, tmp // one owner: in index order already
	}
	lo := bits.TrailingZeros64(diff)
	hi := 64 - bits.LeadingZeros64(diff)
	if hi-lo > 32 {
		slices.Sort(keys)
		return keys, tmp
	}
	src, dst := keys, tmp[:len(keys)]
	for shift := indexBits + lo; shift < indexBits+hi; shift += 8 {
		var next [256]int // where the next key of each byte value goes
		for _, k := range src {
			next[k>>shift&0xff]++
		}
		at := 0
		for b, n := range next {
			next[b] = at
			at += n
		}
		for _, k := range src {
			b := k >> shift & 0xff
			dst[next[b]] = k
			next[b]++
		}
		src, dst = dst, src
	}
	return src, dst
}
