package main

import (
	"bytes"
	"os"
	"path"
	"runtime/debug"
	"strconv"
	"sync"
	"time"
)

// A start's heap is mostly what the daemon keeps: its scan, its pools and
// their servers. On the 1024-VF host it allocates about 4 MB before it
// registers, and the collection the runtime made at its 4 MB minimum, in
// the middle of the start, found half of it live. Without it the start
// takes about 230 fewer page faults and 0.07–0.12 less of its ratio to
// floor+list (BenchmarkDaemonStart/host=vfs1024, five pairs of runs; see
// docs/performance-ratios.md, round 7). The first memory release after
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
	var files [][2]string // a group's limit file, and the root's
	for _, line := range bytes.Split(b, []byte("\n")) {
		// hierarchy-ID:controller-list:cgroup-path
		f := bytes.SplitN(line, []byte(":"), 3)
		if len(f) != 3 {
			continue
		}
		switch group := string(f[2]); {
		case string(f[0]) == "0" && len(f[1]) == 0:
			files = append(files, [2]string{path.Join("/sys/fs/cgroup", group, "memory.max"), "/sys/fs/cgroup/memory.max"})
		case bytes.Contains(append(append([]byte(","), f[1]...), ','), []byte(",memory,")):
			// v1 first: a v2 line beside it holds no memory controller.
			files = append([][2]string{{path.Join("/sys/fs/cgroup/memory", group, "memory.limit_in_bytes"), "/sys/fs/cgroup/memory/memory.limit_in_bytes"}}, files...)
		}
	}
	for _, f := range files {
		for _, name := range f {
			b, err := readFile(name)
			if err != nil {
				continue
			}
			v := string(bytes.TrimSpace(b))
			n, err := strconv.ParseInt(v, 10, 64)
			if v == "max" || err != nil || n <= 0 || n >= 1<<62 {
				return 0, false
			}
			return n, true
		}
	}
	return 0, false
}
