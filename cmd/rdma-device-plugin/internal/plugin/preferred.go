package plugin

import (
	"cmp"
	"slices"

	"github.com/fastpath-k8s/fastpath/pkg/pool"
)

// candidate is what preferred allocation needs to know about a device.
type candidate struct {
	ID   string
	NUMA int    // -1: unknown
	PF   string // grouping key: the PF's PCI address
}

// preferred picks size devices out of available, keeping every one of
// mustInclude. It prefers one NUMA node; within it, policy "spread" takes
// one VF per PF before a second VF of any PF (an 8-VF request on a host
// with 8 rails gets one VF per rail), and "pack" fills as few PFs as
// possible. The result is deterministic: ties break on PF address, then
// device ID. Unknown IDs in available or mustInclude are ignored; the
// answer may be shorter than size when there are not enough devices; a
// size beyond the pool is clamped to it, a negative one is 0.
func preferred(all map[string]candidate, available, mustInclude []string, size int, policy string) []string {
	size = max(0, min(size, len(all)))
	chosen := make([]string, 0, size)
	taken := make(map[string]bool, size)
	pfUse := map[string]int{}
	numaUse := map[int]int{}
	take := func(c candidate) {
		chosen = append(chosen, c.ID)
		taken[c.ID] = true
		pfUse[c.PF]++
		numaUse[c.NUMA]++
	}
	for _, id := range mustInclude {
		if c, ok := all[id]; ok && !taken[id] && len(chosen) < size {
			take(c)
		}
	}
	var rest []candidate
	for _, id := range available {
		if c, ok := all[id]; ok && !taken[id] {
			rest = append(rest, c)
			taken[id] = true // dedupe available; cleared below
		}
	}
	for _, c := range rest {
		delete(taken, c.ID)
	}
	need := size - len(chosen)
	if need <= 0 || len(rest) == 0 {
		return chosen
	}
	node := pickNUMA(rest, numaUse, need, policy)
	// Per-PF counts of what is left, for pack.
	pfFree := map[string]int{}
	for _, c := range rest {
		pfFree[c.PF]++
	}
	for ; need > 0 && len(rest) > 0; need-- {
		best := 0
		for i := 1; i < len(rest); i++ {
			if better(rest[i], rest[best], node, policy, pfUse, pfFree) {
				best = i
			}
		}
		c := rest[best]
		take(c)
		pfFree[c.PF]--
		rest = slices.Delete(rest, best, best+1)
	}
	return chosen
}

// pickNUMA chooses the node to allocate from: the node mustInclude already
// uses most, else the lowest node that can satisfy the request on its own
// (enough devices for pack, enough distinct PFs for spread), else the node
// with the most to offer. -1 (unknown) is the last resort.
func pickNUMA(rest []candidate, numaUse map[int]int, need int, policy string) int {
	if len(numaUse) > 0 {
		best, n := -1, -1
		for node, used := range numaUse {
			if used > n || used == n && node < best {
				best, n = node, used
			}
		}
		return best
	}
	devs := map[int]int{}
	pfs := map[int]map[string]bool{}
	for _, c := range rest {
		devs[c.NUMA]++
		if pfs[c.NUMA] == nil {
			pfs[c.NUMA] = map[string]bool{}
		}
		pfs[c.NUMA][c.PF] = true
	}
	capacity := func(node int) int {
		if policy == pool.PolicySpread {
			return len(pfs[node])
		}
		return devs[node]
	}
	nodes := make([]int, 0, len(devs))
	for node := range devs {
		nodes = append(nodes, node)
	}
	// Known nodes in order, unknown last.
	slices.SortFunc(nodes, func(a, b int) int {
		if (a < 0) != (b < 0) {
			if a < 0 {
				return 1
			}
			return -1
		}
		return cmp.Compare(a, b)
	})
	for _, node := range nodes {
		if capacity(node) >= need {
			return node
		}
	}
	best := nodes[0]
	for _, node := range nodes[1:] {
		if capacity(node) > capacity(best) {
			best = node
		}
	}
	return best
}

// better reports whether a should be taken before b.
//
// spread: an unused PF beats NUMA locality (one VF per rail comes first),
// then the chosen node, then the least used PF. pack: the chosen node, then
// PFs already used, then the PF with most VFs left.
func better(a, b candidate, node int, policy string, pfUse, pfFree map[string]int) bool {
	if policy == pool.PolicySpread && a.PF != b.PF && (pfUse[a.PF] == 0) != (pfUse[b.PF] == 0) {
		return pfUse[a.PF] == 0
	}
	if (a.NUMA == node) != (b.NUMA == node) {
		return a.NUMA == node
	}
	if a.PF != b.PF {
		ua, ub := pfUse[a.PF], pfUse[b.PF]
		if policy == pool.PolicySpread {
			if ua != ub {
				return ua < ub
			}
		} else {
			// pack: stay on PFs already used, then the PF with most left.
			if (ua > 0) != (ub > 0) {
				return ua > 0
			}
			if pfFree[a.PF] != pfFree[b.PF] {
				return pfFree[a.PF] > pfFree[b.PF]
			}
		}
		return a.PF < b.PF
	}
	return a.ID < b.ID
}
