package main

import (
	"os"
	"path"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A start's heap is mostly what the daemon keeps: its scan, its pools and
// their servers. On the 1024-VF host it allocates about 4 MB before it
// registers, and the collection the runtime made at its 4 MB minimum, in
// the middle of the start, found half of it live. Without it the start
// takes about 230 fewer page faults and 0.07–0.12 less of its ratio to
// floor+list (BenchmarkDaemonStart/host=vfs1024, five pairs of runs,
// issue 28's round 7; measured again against the runtime's own pacing in
// issue 40: docs/benchmarks.md). The first memory release after
// registration (plugin.Options.ReleaseMemory, which waits for a pause in
// the Allocates that follow a registration, 2 s at most) collects anyway.
const (
	// startMemoryLimit bounds the Go memory of a start whose collection
	// is put off: past it the runtime collects as it would with a limit
	// set, so a start that allocates more than a large host's (or waits
	// long for its kubelet while rescans run) does not grow unbounded.
	// The DaemonSet's container limit is 256 MiB; under a container
	// limit below twice this, half the container's (startLimit).
	startMemoryLimit = 32 << 20
)

// startCollectionBound is the longest the collection stays off when no
// release comes. The first release follows the first registration round
// (at most 2 s after it, whether the kubelet answered or not), so this
// is a backstop for a start that takes far longer than it should. A
// variable for the tests.
var startCollectionBound = 5 * time.Second

// deferCollection turns the garbage collector off for a start, under
// startMemoryLimit, and returns the function that turns it back on as it
// was: once, whichever comes first of a call and startCollectionBound. A
// GOGC or GOMEMLIMIT the user set is theirs: then it changes nothing. So
// does a call while an earlier one's collection is still off (two serves
// in one process, as a test may run them), whose settings would be that
// earlier call's.
func deferCollection() (restore func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	deferred.Lock()
	defer deferred.Unlock()
	if deferred.on {
		return func() {}
	}
	deferred.on = true
	limit := debug.SetMemoryLimit(startLimit(os.ReadFile))
	percent := debug.SetGCPercent(-1)
	on := sync.OnceFunc(func() {
		deferred.Lock()
		defer deferred.Unlock()
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
		deferred.on = false
	})
	timer := time.AfterFunc(startCollectionBound, on)
	return func() {
		timer.Stop()
		on()
	}
}

// deferred says whether a start's collection is off now.
var deferred struct {
	sync.Mutex
	on bool
}

// startLimit is startMemoryLimit, or half the memory limit of the
// process's cgroup when that is lower: a container given less memory
// than the DaemonSet's must not be killed for a collection put off.
func startLimit(readFile func(string) ([]byte, error)) int64 {
	if l, ok := cgroupMemoryLimit(readFile); ok && l/2 < startMemoryLimit {
		return l / 2
	}
	return startMemoryLimit
}

// cgroupMemoryLimit reads the memory limit of the process's cgroup:
// memory.limit_in_bytes of its cgroup v1 memory controller, or
// memory.max of its cgroup v2 group, at its path in /proc/self/cgroup
// or, where that path is not visible (a container that sees its own
// group at the mount's root), at the root. False when there is none
// ("max", v1's page-rounded maximum) or none can be read.
func cgroupMemoryLimit(readFile func(string) ([]byte, error)) (int64, bool) {
	b, err := readFile("/proc/self/cgroup")
	if err != nil {
		return 0, false
	}
	// The group's path in the v1 memory hierarchy and in the v2 one.
	var v1, v2 string
	var inV1, inV2 bool
	for _, line := range strings.Split(string(b), "\n") {
		// hierarchy-ID:controller-list:cgroup-path
		id, rest, _ := strings.Cut(line, ":")
		controllers, group, ok := strings.Cut(rest, ":")
		switch {
		case !ok:
		case id == "0" && controllers == "":
			v2, inV2 = group, true
		case slices.Contains(strings.Split(controllers, ","), "memory"):
			v1, inV1 = group, true
		}
	}
	// Each the group's limit file, then the root's; v1 first, where the
	// memory controller is, and a v2 line beside it has none.
	var files []string
	if inV1 {
		files = append(files, path.Join("/sys/fs/cgroup/memory", v1, "memory.limit_in_bytes"), "/sys/fs/cgroup/memory/memory.limit_in_bytes")
	}
	if inV2 {
		files = append(files, path.Join("/sys/fs/cgroup", v2, "memory.max"), "/sys/fs/cgroup/memory.max")
	}
	for _, name := range files {
		b, err := readFile(name)
		if err != nil {
			continue
		}
		v := strings.TrimSpace(string(b))
		n, err := strconv.ParseInt(v, 10, 64)
		if v == "max" || err != nil || n <= 0 || n >= 1<<62 {
			return 0, false
		}
		return n, true
	}
	return 0, false
}
