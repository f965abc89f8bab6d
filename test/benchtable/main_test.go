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

func TestRatioTable(t *testing.T) {
	in := `pkg: github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin
BenchmarkDaemonStart/host=dgx-2   30   41000000 ns/op   20500 p50-µs   40100 p99-µs   17800 regfloor-p50-µs   1.152 x-regfloor   1.15 goal-x-regfloor   830 faults   400 floor-faults
BenchmarkDaemonAllocate/host=vfs1024/vfs=1-2   1000   300000 ns/op   250 p50-µs   900 p99-µs   850 dgx-p99-µs   1.0588 x-dgx   1.2 goal-x-dgx
pkg: github.com/fastpath-k8s/fastpath/pkg/nic
BenchmarkDiscover/vfs=1024/vs-floor-2   60   90000000 ns/op   1.04 x-floor
BenchmarkDiscover/vfs=1024/scan-2   12   45000000 ns/op
`
	var out, errs bytes.Buffer
	require.NoError(t, run(strings.NewReader(in), &out, &errs))
	_, tail, ok := strings.Cut(out.String(), "Against this machine's floor")
	require.True(t, ok, "a ratio table:\n%s", out.String())
	lines := strings.Split(strings.TrimSpace(tail), "\n")
	require.Len(t, lines, 2+2+3, "intro and a blank line, header, rule and one row per ratio; the scan row has none")
	require.Equal(t, "| cmd/rdma-device-plugin | DaemonStart/host=dgx | p50-µs | 20500 | 17800 (regfloor) | 1.152× | ≤ 1.15× | no |", lines[4])
	require.Equal(t, "| cmd/rdma-device-plugin | DaemonAllocate/host=vfs1024/vfs=1 | p99-µs | 900.0 | 850.0 (dgx) | 1.059× | ≤ 1.20× | yes |", lines[5])
	require.Equal(t, "| pkg/nic | Discover/vfs=1024/vs-floor | – | – | – (floor) | 1.040× | – | – |", lines[6])
}

func TestNoRatiosNoRatioTable(t *testing.T) {
	var out, errs bytes.Buffer
	require.NoError(t, run(strings.NewReader("pkg: p\nBenchmarkA-2 1 5 ns/op 3 floor-ms\n"), &out, &errs))
	require.NotContains(t, out.String(), "Against")
}
