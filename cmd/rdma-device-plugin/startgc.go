package main

import (
	"os"
	"runtime/debug"
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
	// The DaemonSet's container limit is 256 MiB.
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
	limit := debug.SetMemoryLimit(startMemoryLimit)
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
