package pci

import (
	"cmp"
	"math/bits"
	"slices"
)

// ownerOrder orders entries by their owners' keys, the entries of one
// owner by index, again and again (a node's periodic scan), keeping its
// memory for the next time. A class reading orders its entries with it,
// and a scan the bus's addresses (a function is its own owner there).
// The zero ownerOrder is ready to use.
type ownerOrder struct {
	keys, tmp []uint64
}

// appendOrder appends to order the indexes of the owners that are not
// zero, by owner and then index. Each entry is sorted as one integer,
// its owner's key above its index (sortByOwner); more entries than the
// index bits hold (no host's) go to appendByKey.
func (o *ownerOrder) appendOrder(order []int32, owners []ownerKey) []int32 {
	if len(owners) >= 1<<indexBits {
		return appendByKey(order, owners)
	}
	keys := slices.Grow(o.keys[:0], len(owners))
	for i, k := range owners {
		if k != 0 {
			keys = append(keys, uint64(k)<<indexBits|uint64(i))
		}
	}
	keys, o.tmp = sortByOwner(keys, slices.Grow(o.tmp[:0], len(keys)))
	o.keys = keys
	for _, k := range keys {
		order = append(order, int32(k&(1<<indexBits-1)))
	}
	return order
}

// appendByKey is appendOrder by a stable comparison sort of the indexes.
func appendByKey(order []int32, owners []ownerKey) []int32 {
	start := len(order)
	for i, k := range owners {
		if k != 0 {
			order = append(order, int32(i))
		}
	}
	slices.SortStableFunc(order[start:], func(a, b int32) int { return cmp.Compare(owners[a], owners[b]) })
	return order
}

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
