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
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	fx "github.com/fastpath-k8s/fastpath/internal/testsupport/fixture"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/fixture/genhost"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/floor/fromnic"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/latency"
	"github.com/fastpath-k8s/fastpath/internal/testsupport/testbin"
	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

// benchHost is the generated 1024-VF host: 8 PFs with 128 VFs each.
var benchHost = genhost.Host{PFs: 8, VFsPerPF: 128}

func largeHost(b *testing.B) string { return benchHost.Root(b) }

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
//
// Alternately with each start (floorlist, fastpath, floorlist, …), it
// starts floorlist, BenchmarkDaemonStart's yardstick for this host
// (regfloor -list: the listings and one discovery floor pass, two gRPC
// servers, two registrations), built as the daemon is, and reads the same
// figures once both registered: floorlist-peak-RSS-MiB and
// floor-anon-RSS-MiB, the largest of its starts, and x-floorlist, the
// two peaks' ratio.
func BenchmarkDaemonRSS(b *testing.B) { daemonRSS(b, false) }

// BenchmarkDaemonRSSDRA is BenchmarkDaemonRSS for the build with DRA
// linked in (rdma-device-plugin-dra), with the same config: no pool is
// served through DRA, so the DRA driver and its informers do not start;
// what it adds is client-go's binary and package init. Goal: peak RSS
// ≤ 24 MiB (issue 28). Its floorlist is regfloor built the same way:
// with k8s.io/dynamic-resource-allocation's kubelet plugin library and
// the client-go clientset it takes linked in and not started, what any
// device plugin that can also serve DRA through that library carries.
func BenchmarkDaemonRSSDRA(b *testing.B) { daemonRSS(b, true) }

func daemonRSS(b *testing.B, dra bool) {
	host := largeHost(b)
	floorBin := regfloorBinary(b)
	if dra {
		draBinary(b) // built outside the timed part
		floorBin = regfloorDRABinary(b)
	} else {
		binary(b)
	}
	fl := startRegFloor(b, floorBin, host, true)
	fl.registrations(soakPools...)
	fl.stop()
	var ours, floor rssPeaks
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		drain(fl)
		fl.spawn()
		fl.registrations(soakPools...)
		if err := floor.read(fl.cmd.Process.Pid); err != nil {
			b.Fatal(err)
		}
		fl.stop()
		b.StartTimer()

		d := startDaemonWith(b, daemonOpts{host: host, config: config("combined.json"), dra: dra})
		regs := d.registrations(soakPools...)
		n, err := firstList(d, regs["mellanox.com/mlnx_sriov_rdma"].Endpoint)
		if err != nil {
			b.Fatalf("%v; log:\n%s", err, d.log.String())
		}
		if n != benchHost.VFs() {
			b.Fatalf("ListAndWatch: %d devices, want %d", n, benchHost.VFs())
		}
		b.StopTimer()
		if err := ours.read(d.cmd.Process.Pid); err != nil {
			b.Fatal(err)
		}
		d.stop()
		b.StartTimer()
	}
	b.StopTimer()
	b.ReportMetric(ours.rss/1024, "RSS-MiB")
	b.ReportMetric(ours.anon/1024, "anon-RSS-MiB")
	b.ReportMetric(ours.hwm/1024, "peak-RSS-MiB")
	b.ReportMetric(floor.anon/1024, "floor-anon-RSS-MiB")
	b.ReportMetric(floor.hwm/1024, "floorlist-peak-RSS-MiB")
	b.ReportMetric(ours.hwm/floor.hwm, "x-floorlist")
}

// rssPeaks are the largest VmRSS, RssAnon and VmHWM (KiB) read of a
// process's starts.
type rssPeaks struct{ rss, anon, hwm float64 }

func (p *rssPeaks) read(pid int) error {
	st, err := procStatus(pid, "VmRSS", "RssAnon", "VmHWM")
	if err != nil {
		return err
	}
	p.rss = max(p.rss, st["VmRSS"])
	p.anon = max(p.anon, st["RssAnon"])
	p.hwm = max(p.hwm, st["VmHWM"])
	return nil
}

// BenchmarkDaemonStart is the time from exec of the real binary (built as
// for the image) to the last of its two pools registering with the
// kubelet stub (combined.json: the VFs as an exclusive pool, the IB PFs as
// a shared one, CDI specs and /metrics on), against a yardstick started
// alternately with it in the same run: yardstick, fastpath, yardstick,
// fastpath … Each op is one such pair; the daemons are stopped (SIGTERM)
// with the timer stopped. The daemon runs in the benchmark's network
// namespace and lists its links, as on a node.
//
// The yardstick is not fastpath code: test/regfloor, the least a Go
// device plugin on the kubelet's v1beta1 API does (two gRPC servers, two
// Register calls; no config, discovery or metrics), built as the daemon
// is. host=dgx, the DGX H100 fixture, is held against regfloor alone:
// what this machine charges for starting such a process at all.
// host=vfs1024, the generated 1024-VF host, is held against floorlist:
// regfloor -list, which lists the bus and the four class directories and
// then makes one discovery floor pass over every VF (package
// internal/testsupport/floor; the VFs come from a scan in the benchmark's process),
// the least a plugin that reads that host before registering does.
//
// It reports the percentiles of fastpath's wall time (p50-µs, p99-µs), the
// yardstick's median (<yardstick>-p50-µs) and x-<yardstick>, the median
// of the per-pair ratios: on a machine shared with other work the load
// moves between seconds, and a pair is started within milliseconds.
// Beside them, the medians of what the kernel accounts to the daemon's
// threads by then (/proc/<pid>/task/*/schedstat): oncpu-ms, the time they
// ran, and runq-ms, the time they were runnable but waited for a CPU; and
// faults, the minor page faults by then (/proc/<pid>/stat), each a first
// touch of a page (internal/testsupport/floor's BenchmarkPageFault says what one
// costs here); floor-oncpu-ms, floor-runq-ms and floor-faults are the
// yardstick's. Goals: x-regfloor ≤ 1.15,
// x-floorlist ≤ 1.15 (goal-x-*).
func BenchmarkDaemonStart(b *testing.B) {
	binary(b)
	for _, tc := range []struct {
		name, yardstick string
		host            func(*testing.B) string
		floorHost       bool // the yardstick reads the host (-list and a floor pass)
	}{
		{"host=dgx", "regfloor", func(*testing.B) string { return fixture("dgx-h100") }, false},
		{"host=vfs1024", "floorlist", largeHost, true},
	} {
		b.Run(tc.name, func(b *testing.B) {
			host := tc.host(b)
			floorHost := ""
			if tc.floorHost {
				floorHost = host
			}
			floor := &starts{d: startRegFloor(b, regfloorBinary(b), floorHost, tc.floorHost)}
			ours := &starts{d: startDaemonWith(b, daemonOpts{host: host, config: config("combined.json"), hostNetns: true})}
			// regfloor reads no host: beside it, the DGX start is also
			// held against floorlist on the same host (the least a plugin
			// that reads it first does), which tells how much of the
			// 1.15 reading the host alone takes.
			var more []*starts
			if !tc.floorHost {
				more = append(more, &starts{d: startRegFloor(b, regfloorBinary(b), host, true)})
			}
			ratios := alternate(b, floor, ours, true, more...)
			ours.lat.Report(b)
			b.ReportMetric(float64(floor.lat.Percentile(50).Nanoseconds())/1e3, tc.yardstick+"-p50-µs")
			b.ReportMetric(median(ratios), "x-"+tc.yardstick)
			b.ReportMetric(1.15, "goal-x-"+tc.yardstick)
			for _, list := range more {
				b.ReportMetric(float64(list.lat.Percentile(50).Nanoseconds())/1e3, "floorlist-p50-µs")
				b.ReportMetric(median(pairRatios(ours, list)), "x-floorlist")
				b.ReportMetric(median(pairRatios(list, floor)), "floorlist-vs-"+tc.yardstick)
			}
			b.ReportMetric(float64(ours.oncpu.Percentile(50).Microseconds())/1e3, "oncpu-ms")
			b.ReportMetric(float64(ours.runq.Percentile(50).Microseconds())/1e3, "runq-ms")
			b.ReportMetric(median(ours.faults), "faults")
			b.ReportMetric(median(floor.faults), "floor-faults")
			b.ReportMetric(float64(floor.oncpu.Percentile(50).Microseconds())/1e3, "floor-oncpu-ms")
			b.ReportMetric(float64(floor.runq.Percentile(50).Microseconds())/1e3, "floor-runq-ms")
		})
	}
}

// BenchmarkDaemonStartPolicy is what --policy adds to a start on a node
// whose VFs already match the policy (the seed's, 8 VFs a rail on the DGX
// fixture): provisioning only reads there. Starts with and without
// --policy alternate as in BenchmarkDaemonStart; it reports the with-policy
// percentiles, added-ms (the difference of the medians; goal < 5 ms) and
// x-nopolicy, the median of the per-pair ratios.
func BenchmarkDaemonStartPolicy(b *testing.B) {
	binary(b)
	host := provisionedHost(b)
	opts := daemonOpts{host: host, config: config("combined.json"), hostNetns: true}
	plain := &starts{d: startDaemonWith(b, opts)}
	opts.args = []string{"--policy", seedPolicy(), "--provision-state-dir", "/nonexistent/fastpath-bench", "--cni-state-dir", ""}
	policy := &starts{d: startDaemonWith(b, opts)}
	ratios := alternate(b, plain, policy, false)
	policy.lat.Report(b)
	b.ReportMetric(float64(policy.lat.Percentile(50)-plain.lat.Percentile(50))/1e6, "added-ms")
	b.ReportMetric(median(ratios), "x-nopolicy")
}

// alternate starts base and ours once each untimed (the page cache and
// the binary's first exec), then in pairs, base first: b.N timed pairs
// (base's start timed too when timeBase), then untimed ones until the
// medians stand on at least minStarts pairs. It returns each pair's
// ours/base ratio.
//
// Each of more, when given, starts after ours in every pair, untimed; its
// starts line up with the others' in lat (pairRatios).
func alternate(b *testing.B, base, ours *starts, timeBase bool, more ...*starts) []float64 {
	for _, s := range append([]*starts{base, ours}, more...) {
		s.d.registrations(soakPools...)
		s.d.stop()
	}
	var ratios []float64
	pair := func(timed bool) {
		f, o := base.start(b, timed && timeBase), ours.start(b, timed)
		ratios = append(ratios, float64(o)/float64(f))
		for _, s := range more {
			s.start(b, false)
		}
	}
	b.ResetTimer()
	b.StopTimer()
	for i := 0; i < b.N; i++ {
		pair(true)
	}
	for len(ratios) < minStarts {
		pair(false)
	}
	return ratios
}

// starts are the timed starts of one daemon (or yardstick).
type starts struct {
	d           *daemon
	lat         latency.Samples
	oncpu, runq latency.Samples
	faults      []float64
}

// start starts s.d until both pools registered, timed if timed, and stops
// it untimed; it returns the time to registration.
func (s *starts) start(b *testing.B, timed bool) time.Duration {
	drain(s.d)
	if timed {
		b.StartTimer()
	}
	start := time.Now()
	s.d.spawn()
	last, err := registeredBy(s.d, 10*time.Second)
	b.StopTimer()
	if err != nil {
		b.Fatalf("%v; log:\n%s", err, s.d.log.String())
	}
	took := last.Sub(start)
	run, wait, err := schedStat(s.d.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	minflt, err := minorFaults(s.d.cmd.Process.Pid)
	if err != nil {
		b.Fatal(err)
	}
	s.lat, s.oncpu, s.runq = append(s.lat, took), append(s.oncpu, run), append(s.runq, wait)
	s.faults = append(s.faults, float64(minflt))
	s.d.stop()
	return took
}

// pairRatios are a's starts over b's, pair by pair, of two starts that
// alternate ran together.
func pairRatios(a, b *starts) []float64 {
	xs := make([]float64, min(len(a.lat), len(b.lat)))
	for i := range xs {
		xs[i] = float64(a.lat[i]) / float64(b.lat[i])
	}
	return xs
}

// median is the median of xs (the upper one of an even count); it sorts xs.
func median(xs []float64) float64 {
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// startRegFloor starts test/regfloor for soakPools against a kubelet
// stub, as startDaemonWith starts the daemon; with a host, it makes a
// discovery floor pass over the host's VFs first, after the listings if
// list. bin is the regfloor build to start (regfloorBinary,
// regfloorDRABinary).
func startRegFloor(b *testing.B, bin, host string, list bool) *daemon {
	b.Helper()
	d := &daemon{t: b, dir: filepath.Join(b.TempDir(), "kubelet"), log: &testbin.Output{}}
	d.startStub()
	d.argv = []string{bin}
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
// binary serves the DGX H100 fixture or the generated 1024-VF host, the
// benchmark is the kubelet. Each op is one Allocate round trip for one
// container.
//
// host=vfs1024/vfs=1 says whether Allocate grows with the host: in
// rounds, it starts the daemon on the DGX fixture, makes allocsPerRound
// Allocates of one VF right after registration, stops it, and does the
// same on the 1024-VF host, round after round until each host has at
// least latency.MinSamples calls (those beyond b.N untimed; ns/op is the
// 1024-VF host's). The first call of a round dials, untimed, as
// BenchmarkAllocate's first call does. It reports the 1024-VF host's percentiles (p50-µs,
// p99-µs), the DGX host's p99 (dgx-p99-µs) and their quotient (x-dgx).
// Goals: p99 < 1 ms, x-dgx ≤ 1.2 (goal-x-dgx). host=dgx/vfs=8 is a
// rail-optimised 8-GPU pod's Allocate: one VF of each rail.
func BenchmarkDaemonAllocate(b *testing.B) {
	binary(b)
	dgx := fixture("dgx-h100")
	b.Run("host=dgx/vfs=8", func(b *testing.B) {
		a := startAllocator(b, dgx, fx.DGXRailVFs(0))
		a.call(b) // the first call dials
		latency.Measure(b, func() time.Duration { return a.call(b) })
		a.d.stop()
	})
	b.Run("host=vfs1024/vfs=1", func(b *testing.B) {
		large := largeHost(b)
		var small, big latency.Samples
		b.ResetTimer()
		b.StopTimer()
		for len(small) < latency.MinSamples || len(big) < max(b.N, latency.MinSamples) {
			for _, h := range []struct {
				root string
				ids  []string
				s    *latency.Samples
			}{{dgx, []string{"0000:18:00.1"}, &small}, {large, []string{fx.VFAddress(0x10, 0)}, &big}} {
				a := startAllocator(b, h.root, h.ids)
				a.call(b) // dials
				timed := h.s == &big
				for range allocsPerRound {
					if timed && len(big) < b.N {
						b.StartTimer()
					}
					*h.s = append(*h.s, a.call(b))
					b.StopTimer()
				}
				a.d.stop()
			}
		}
		big.Report(b)
		b.ReportMetric(float64(small.Percentile(99).Nanoseconds())/1e3, "dgx-p99-µs")
		b.ReportMetric(float64(big.Percentile(99))/float64(small.Percentile(99)), "x-dgx")
		b.ReportMetric(1.2, "goal-x-dgx")
	})
}

// allocsPerRound is how many Allocates BenchmarkDaemonAllocate makes
// after each registration.
const allocsPerRound = 250

// allocator is a kubelet's Allocate of ids on a daemon it started.
type allocator struct {
	d   *daemon
	c   pluginapi.DevicePluginClient
	req *pluginapi.AllocateRequest
}

// startAllocator starts the daemon on host with combined.json and waits
// for both pools to register.
func startAllocator(b *testing.B, host string, ids []string) *allocator {
	d := startDaemon(b, host, config("combined.json"))
	regs := d.registrations(soakPools...)
	return &allocator{
		d: d, c: d.client(regs["mellanox.com/mlnx_sriov_rdma"].Endpoint),
		req: &pluginapi.AllocateRequest{ContainerRequests: []*pluginapi.ContainerAllocateRequest{{DevicesIds: ids}}},
	}
}

// call makes one Allocate, checks its answer and returns how long it took.
func (a *allocator) call(b *testing.B) time.Duration {
	ids := a.req.ContainerRequests[0].DevicesIds
	start := time.Now()
	resp, err := a.c.Allocate(context.Background(), a.req)
	dur := time.Since(start)
	if err != nil {
		b.Fatalf("allocate %v: %v; log:\n%s", ids, err, a.d.log.String())
	}
	// uverbs, umad, issm per VF, and rdma_cm once.
	if n := len(resp.ContainerResponses[0].Devices); n != 3*len(ids)+1 {
		b.Fatalf("allocate %v: %d device specs, want %d", ids, n, 3*len(ids)+1)
	}
	return dur
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
