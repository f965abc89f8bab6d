package sysfs

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hostNames are the names a 1024-VF host lists below /sys/bus/pci/devices,
// /sys/class/{net,infiniband,infiniband_verbs,infiniband_mad} and
// /dev/infiniband, in a shuffled order as a kernel hashes them.
func hostNames(seed uint64) [][]string {
	r := rand.New(rand.NewPCG(seed, 1))
	var bus, net, ib, verbs, mad, dev []string
	for pf := range 8 {
		bus = append(bus, fmt.Sprintf("0000:%02x:00.%d", 0x18+pf/2, pf%2))
		for vf := range 128 {
			bus = append(bus, fmt.Sprintf("0000:%02x:%02x.%d", 0x18+pf/2, 1+vf/8, vf%8))
		}
	}
	for i := range 1032 {
		n := fmt.Sprint(i)
		net = append(net, "eth"+n)
		ib = append(ib, "mlx5_"+n)
		verbs = append(verbs, "uverbs"+n)
		mad = append(mad, "umad"+n, "issm"+n)
		dev = append(dev, "uverbs"+n, "umad"+n, "issm"+n)
	}
	dev = append(dev, "rdma_cm")
	out := [][]string{bus, net, ib, verbs, mad, dev}
	for _, l := range out {
		r.Shuffle(len(l), func(i, j int) { l[i], l[j] = l[j], l[i] })
	}
	return out
}

// sortNames orders as slices.Sort does: names that begin others, equal
// names, bytes above 0x7f, input already sorted or reversed, and the
// listings of a large host.
func TestSortNames(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	alphabet := []byte("ab09:._\x00\x7f\x80\xff")
	random := func(n, maxLen int) []string {
		out := make([]string, n)
		for i := range out {
			b := make([]byte, r.IntN(maxLen+1))
			for j := range b {
				b[j] = alphabet[r.IntN(len(alphabet))]
			}
			out[i] = string(b)
		}
		return out
	}
	cases := map[string][]string{
		"empty":    nil,
		"one":      {"eth0"},
		"prefixes": {"mlx5_10", "mlx5_1", "mlx5_", "mlx5_100", "mlx5_1", "m", "", "mlx5_10"},
	}
	for i := range 200 {
		cases[fmt.Sprintf("random%d", i)] = random(r.IntN(300), 1+r.IntN(6))
	}
	for i, l := range hostNames(1) {
		cases[fmt.Sprintf("host%d", i)] = l
		sorted := slices.Sorted(slices.Values(l))
		cases[fmt.Sprintf("host%d-sorted", i)] = sorted
		reversed := slices.Clone(sorted)
		slices.Reverse(reversed)
		cases[fmt.Sprintf("host%d-reversed", i)] = reversed
	}
	for name, in := range cases {
		want := slices.Clone(in)
		slices.Sort(want)
		got := slices.Clone(in)
		sortNames(got)
		require.Equal(t, want, got, name)
	}
}

// BenchmarkSortNames sorts the six listings of a 1024-VF host, as a
// daemon's first scan does, against slices.Sort.
func BenchmarkSortNames(b *testing.B) {
	lists := hostNames(1)
	work := make([][]string, len(lists))
	for _, s := range []struct {
		name string
		sort func([]string)
	}{{"sortNames", sortNames}, {"slices.Sort", slices.Sort[[]string]}} {
		b.Run(s.name, func(b *testing.B) {
			for b.Loop() {
				for i, l := range lists {
					work[i] = append(work[i][:0], l...)
					s.sort(work[i])
				}
			}
		})
	}
}

// FuzzSortNames holds sortNames to slices.Sort on any list of names: the
// input split at newlines (a directory's names hold none).
func FuzzSortNames(f *testing.F) {
	f.Add("uverbs10\nuverbs1\numad0\nissm0\nuverbs\nrdma_cm\nuverbs10")
	f.Add("0000:18:00.1\n0000:18:00.0\n0000:3b:0f.7\n0000:18:00.1")
	f.Add(strings.Repeat("mlx5_\n", 40) + "\xff\n\x00\n")
	f.Fuzz(func(t *testing.T, in string) {
		names := strings.Split(in, "\n")
		want := slices.Clone(names)
		slices.Sort(want)
		sortNames(names)
		if !slices.Equal(want, names) {
			t.Fatalf("sortNames(%q) = %q, want %q", in, names, want)
		}
	})
}
