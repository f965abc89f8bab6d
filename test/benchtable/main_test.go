package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTable(t *testing.T) {
	in := `goos: linux
pkg: github.com/fastpath-k8s/fastpath/pkg/sriov
cpu: Test CPU             
BenchmarkDiscover/vfs=128-2   20   2102143 ns/op   16423 ns/vf   681560 B/op   10333 allocs/op
some log line
pkg: github.com/fastpath-k8s/fastpath/cmd/x
BenchmarkAllocate-2   1000   51234 ns/op   0.21 p99-ms
PASS
ok  	github.com/fastpath-k8s/fastpath/pkg/sriov	1.0s
`
	var out, errs bytes.Buffer
	require.NoError(t, run(strings.NewReader(in), &out, &errs))
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	require.Contains(t, lines[0], ", Test CPU, ") // the padding Go prints after the name is gone
	require.Equal(t, "| package | benchmark | ns/op | B/op | allocs/op | ns/vf | p99-ms |", lines[2])
	require.Equal(t, "| pkg/sriov | Discover/vfs=128 | 2102143 | 681560 | 10333 | 16423 | – |", lines[4])
	require.Equal(t, "| cmd/x | Allocate | 51234 | – | – | – | 0.21 |", lines[5])
	require.Equal(t, "some log line\n", errs.String())
}

func TestFailureIsAnError(t *testing.T) {
	var out, errs bytes.Buffer
	err := run(strings.NewReader("pkg: p\nBenchmarkA-2 1 5 ns/op\n--- FAIL: BenchmarkB\nFAIL\n"), &out, &errs)
	require.ErrorContains(t, err, "failed")
	require.ErrorContains(t, run(strings.NewReader("PASS\n"), &out, &errs), "no benchmark results")
}
