package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	fx "github.com/fastpath-k8s/fastpath/internal/fixture"
	"github.com/fastpath-k8s/fastpath/internal/floor"
	"github.com/fastpath-k8s/fastpath/internal/floor/fromnic"
	"github.com/fastpath-k8s/fastpath/internal/latency"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

const benchPFs, benchVFsPerPF = 8, 128

var (
	benchHostOnce sync.Once
	benchHost     string
	benchHostErr  error
)

// largeHost generates the 1024-VF host once per test binary (thousands of
// files: slow on some disks); TestMain removes it.
func largeHost(b *testing.B) string {
	b.Helper()
	benchHostOnce.Do(func() {
		benchHost, benchHostErr = os.MkdirTemp("", "fastpath-dp-host-")
		if benchHostErr == nil {
			benchHostErr = fx.Generate(benchHost, benchPFs, benchVFsPerPF)
		}
	})
	if benchHostErr != nil {
		b.Fatalf("generate a %dx%d-VF host: %v", benchPFs, benchVFsPerPF, benchHostErr)
	}
	return benchHost
}

// BenchmarkDaemonRSS runs the real binary, built as for the image, on a
// generated host of 8 PFs with 128 VFs each (1024 VFs, each with a netdev,
// an RDMA device and uverbs/umad/issm char devices) with the combined
// config: the 1024 VFs as an exclusive spread pool, the 8 PFs as a shared
// pool, CDI specs and /metrics on. Once both pools registered with the
// kubelet stub and a ListAndWatch returned all 1024 VFs, it reads the
// daemon's VmRSS, RssAnon (RSS less file-backed pages, which are mostly
// the binary's) and VmHWM (the peak) from /proc/<pid>/status; each is the
// largest of the b.N starts. ns/op is start → that first ListAndWatch.
// Target: RSS ≤ 20 MiB.
func BenchmarkDaemonRSS(b *testing.B) {
	host := largeHost(b)
	binary(b) // built outside the timed part
	var rss, anon, hwm float64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		d := startDaemon(b, host, config("combined.json"))
		regs := d.registrations(soakPools...)
		n, err := firstList(d, regs["mellanox.com/mlnx_sriov_rdma"].Endpoint)
		if err != nil {
			b.Fatalf("%v; log:\n%s", err, d.log.String())
		}
		if n != benchPFs*benchVFsPerPF {
			b.Fatalf("ListAndWatch: %d devices, want %d", n, benchPFs*benchVFsPerPF)
		}
		b.StopTimer()
		st, err := procStatus(d.cmd.Process.Pid, "VmRSS", "RssAnon", "VmHWM")
		if err != nil {
			b.Fatal(err)
		}
		rss = max(rss, st["VmRSS"])
		anon = max(anon, st["RssAnon"])
		hwm = max(hwm, st["VmHWM"])
		d.stop()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(rss/1024, "RSS-MiB")
	b.ReportMetric(anon/1024, "anon-RSS-MiB")
	b.ReportMetric(hwm/1024, "peak-RSS-MiB")
}

// BenchmarkDaemonStart is the time from exec of the real binary (built as
// for the image) to the last of its two pools registering with the
// kubelet stub (combined.json: the VFs as an exclusive pool, the IB PFs as
// a shared one, CDI specs and /metrics on), on the DGX H100 fixture and on
// the generated 1024-VF host. The daemon runs in the benchmark's network
// namespace and lists its links, as on a node. Each op is one start; the
// daemon is stopped (SIGTERM) with the timer stopped. Targets: DGX ≤ 10 ms,
// 1024 VFs ≤ 50 ms.
//
// host=none/floor is not fastpath code but a yardstick: test/regfloor,
// the least a Go device plugin on the kubelet's v1beta1 API does (two
// gRPC servers, two Register calls; no config, discovery or metrics),
// built as the daemon is. What it takes is what this machine charges for
// starting such a process at all. host=vfs1024/floor is regfloor making
// one discovery floor pass over the 1024-VF host before it serves
// (package internal/floor; the VFs are found by a scan in the benchmark's
// process): the least a plugin that reads that host before registering
// takes, given the names of every VF's entries. host=vfs1024/floor+list
// adds what it takes to learn them: regfloor -list lists the bus and the
// four class directories first.
//
// On a shared machine the wall time includes waiting for a CPU. Beside
// the percentiles of the wall time it reports the medians of what the
// kernel accounts to the daemon's threads by then (/proc/<pid>/task/*/
// schedstat): oncpu-ms, the time they ran, and runq-ms, the time they were
// runnable but waited for a CPU; and faults, the process's minor page
// faults by then (/proc/<pid>/stat), each a first touch of a page
// (internal/floor's BenchmarkPageFault says what one costs here).
func BenchmarkDaemonStart(b *testing.B) {
	binary(b)
	for _, tc := range []struct {
		name  string
		host  func(*testing.B) string
		floor bool
		list  bool
		args  []string
	}{
		{"host=dgx", func(*testing.B) string { return fixture("dgx-h100") }, false, false, nil},
		// The seed's policy re-applied at start on a node whose 8 VFs per
		// rail already match it, against the same node without --policy.
		{"host=dgx8", func(b *testing.B) string { return provisionedHost(b) }, false, false, nil},
		{"host=dgx8/policy", func(b *testing.B) string { return provisionedHost(b) }, false, false,
			[]string{"--policy", seedPolicy(), "--provision-state-dir", "/nonexistent/fastpath-bench", "--cni-state-dir", ""}},
		{"host=vfs1024", largeHost, false, false, nil},
		{"host=none/floor", nil, true, false, nil},
		{"host=vfs1024/floor", largeHost, true, false, nil},
		{"host=vfs1024/floor+list", largeHost, true, true, nil},
	} {
		b.Run(tc.name, func(b *testing.B) {
			host := ""
			if tc.host != nil {
				host = tc.host(b)
			}
			var d *daemon
			if tc.floor {
				d = startRegFloor(b, host, tc.list)
			} else {
				d = startDaemonWith(b, daemonOpts{host: host, config: config("combined.json"), hostNetns: true, args: tc.args})
			}
			d.registrations(soakPools...)
			d.stop()
			lat := make(latency.Samples, 0, b.N)
			var oncpu, runq latency.Samples
			var faults []int64
			start1 := func() {
				drain(d)
				start := time.Now()
				d.spawn()
				last, err := registeredBy(d, 10*time.Second)
				if err != nil {
					b.Fatalf("%v; log:\n%s", err, d.log.String())
				}
				lat = append(lat, last.Sub(start))
				b.StopTimer()
				run, wait, err := schedStat(d.cmd.Process.Pid)
				if err != nil {
					b.Fatal(err)
				}
				minflt, err := minorFaults(d.cmd.Process.Pid)
				if err != nil {
					b.Fatal(err)
				}
				oncpu, runq = append(oncpu, run), append(runq, wait)
				faults = append(faults, minflt)
				d.stop()
			}
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				start1()
				b.StartTimer()
			}
			b.StopTimer()
			// The percentiles stand on at least minStarts starts; those
			// past b.N are not timed.
			for len(lat) < minStarts {
				start1()
			}
			lat.Report(b)
			b.ReportMetric(float64(oncpu.Percentile(50).Microseconds())/1e3, "oncpu-ms")
			b.ReportMetric(float64(runq.Percentile(50).Microseconds())/1e3, "runq-ms")
			slices.Sort(faults)
			b.ReportMetric(float64(faults[(len(faults)-1)/2]), "faults")
		})
	}
}

// startRegFloor starts test/regfloor for soakPools against a kubelet
// stub, as startDaemonWith starts the daemon; with a host, it makes a
// discovery floor pass over the host's VFs first, after the listings if
// list.
func startRegFloor(b *testing.B, host string, list bool) *daemon {
	b.Helper()
	d := &daemon{t: b, dir: filepath.Join(b.TempDir(), "kubelet"), log: &syncBuffer{}}
	d.startStub()
	d.argv = []string{regfloorBinary(b)}
	if host != "" {
		snap, err := nic.NewScanner(host).Scan()
		require.NoError(b, err)
		vfs, err := fromnic.VFs(snap)
		require.NoError(b, err)
		require.NotEmpty(b, vfs)
		vfsFile := filepath.Join(b.TempDir(), "vfs")
		f, err := os.Create(vfsFile)
		require.NoError(b, err)
		require.NoError(b, floor.Write(f, vfs))
		require.NoError(b, f.Close())
		d.argv = append(d.argv, "-root", host, "-vfs", vfsFile)
		if list {
			d.argv = append(d.argv, "-list")
		}
	}
	d.argv = append(d.argv, d.dir)
	d.argv = append(d.argv, soakPools...)
	d.spawnUntilCleanup()
	return d
}

// schedStat sums what the kernel accounts to the threads of pid: time on a
// CPU and time runnable waiting for one (/proc/<pid>/task/*/schedstat).
func schedStat(pid int) (run, wait time.Duration, err error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, t := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		var r, w int64
		if _, err := fmt.Sscan(string(b), &r, &w); err != nil {
			return 0, 0, fmt.Errorf("schedstat of %d/%s: %q: %w", pid, t.Name(), b, err)
		}
		run += time.Duration(r)
		wait += time.Duration(w)
	}
	return run, wait, nil
}

// minorFaults is the minor page faults of process pid, all its threads
// (field 10 of /proc/<pid>/stat).
func minorFaults(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) is in parentheses and may hold spaces
	// and parentheses: the fields after it follow the last ')'.
	i := strings.LastIndex(string(b), ") ")
	var fields []string
	if i >= 0 {
		fields = strings.Fields(string(b[i+2:]))
	}
	if len(fields) < 8 {
		return 0, fmt.Errorf("/proc/%d/stat: %q: no minflt field", pid, b)
	}
	return strconv.ParseInt(fields[7], 10, 64)
}

// minStarts is how many starts BenchmarkDaemonStart makes at least.
const minStarts = 30

// registeredBy waits for both pools to register with the current kubelet
// and returns when the last did.
func registeredBy(d *daemon, timeout time.Duration) (time.Time, error) {
	deadline := time.Now().Add(timeout)
	todo := map[string]bool{soakPools[0]: true, soakPools[1]: true}
	var last time.Time
	for len(todo) > 0 {
		r, err := d.stub.WaitRegistration(time.Until(deadline))
		if err != nil {
			return time.Time{}, fmt.Errorf("waiting for %v: %w", todo, err)
		}
		if r.Generation == d.stub.Generation() && todo[r.Request.ResourceName] {
			delete(todo, r.Request.ResourceName)
			last = r.At
		}
	}
	return last, nil
}

// BenchmarkDaemonAllocate is BenchmarkAllocate of the plugin package with
// the kubelet's side in another process, as in production: the real
// binary serves the DGX H100 fixture (host=dgx) or the generated 1024-VF
// host (host=vfs1024: Allocate must not grow with the host), the benchmark
// is the kubelet. Each op is one Allocate round trip for one container;
// the percentiles cover at least 1000 calls (those beyond b.N untimed).
// Target: p99 < 1 ms.
func BenchmarkDaemonAllocate(b *testing.B) {
	binary(b)
	for _, tc := range []struct {
		name string
		host func(*testing.B) string
		ids  []string
	}{
		{"host=dgx/vfs=1", func(*testing.B) string { return fixture("dgx-h100") }, []string{"0000:18:00.1"}},
		{"host=dgx/vfs=8", func(*testing.B) string { return fixture("dgx-h100") }, fx.DGXRailVFs(0)},
		{"host=vfs1024/vfs=1", largeHost, []string{fx.VFAddress(0x10, 0)}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			d := startDaemon(b, tc.host(b), config("combined.json"))
			regs := d.registrations(soakPools...)
			c := d.client(regs["mellanox.com/mlnx_sriov_rdma"].Endpoint)
			req := &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: tc.ids}}}
			call := func() time.Duration {
				start := time.Now()
				resp, err := c.Allocate(context.Background(), req)
				dur := time.Since(start)
				if err != nil {
					b.Fatalf("allocate %v: %v; log:\n%s", tc.ids, err, d.log.String())
				}
				// uverbs, umad, issm per VF, and rdma_cm once.
				if n := len(resp.ContainerResponses[0].Devices); n != 3*len(tc.ids)+1 {
					b.Fatalf("allocate %v: %d device specs, want %d", tc.ids, n, 3*len(tc.ids)+1)
				}
				return dur
			}
			call() // the first call dials
			latency.Measure(b, call)
			d.stop()
		})
	}
}

// firstList drives ListAndWatch as the kubelet does after Register and
// returns the number of devices in the first response.
func firstList(d *daemon, endpoint string) (int, error) {
	c := d.client(endpoint)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := c.ListAndWatch(ctx, &pluginapi.Empty{})
	if err != nil {
		return 0, fmt.Errorf("ListAndWatch %s: %w", endpoint, err)
	}
	r, err := stream.Recv()
	if err != nil {
		return 0, fmt.Errorf("ListAndWatch %s: receive: %w", endpoint, err)
	}
	return len(r.Devices), nil
}

// procStatus reads the given kB fields of /proc/<pid>/status.
func procStatus(pid int, fields ...string) (map[string]float64, error) {
	path := fmt.Sprintf("/proc/%d/status", pid)
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		for _, want := range fields {
			if k != want {
				continue
			}
			kb, unit, _ := strings.Cut(strings.TrimSpace(v), " ")
			n, err := strconv.ParseFloat(kb, 64)
			if err != nil || unit != "kB" {
				return nil, fmt.Errorf("%s: %s: %q is not a kB value", path, k, v)
			}
			out[k] = n
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, want := range fields {
		if _, ok := out[want]; !ok {
			return nil, fmt.Errorf("%s: no %s", path, want)
		}
	}
	return out, nil
}
