package pci

import (
	"cmp"
	"slices"
)

// ownerOrder orders entries by their owners' keys, the entries of one
// owner by index, again and again (a node's periodic scan), keeping its
// memory for the next time. A class reading orders its entries with it,
// and a scan the bus's addresses (a function is its own owner there).
// The zero ownerOrder is ready to use.
type ownerOrder struct {
	keys []uint64
}

// appendOrder appends to order the indexes of the owners that are not
// zero, by owner and then index. Each entry is sorted as one integer,
// its owner's key above its index (slices.Sort); more entries than the
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
	slices.Sort(keys)
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
