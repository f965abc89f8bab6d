// Command scanfaults is not fastpath code but a measurement behind the
// README's start-time notes: what a scan of a host costs a fresh process
// in minor page faults and heap, for the first scan (a fresh scanner, as
// the daemon's first scan is) and for a second fresh scanner after it.
//
//	scanfaults HOST-ROOT
//
// Run it several times (each run is one fresh process) on a generated host
// (internal/testsupport/fixture.Generate) or a node's /.
package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

func minflt() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		panic(err)
	}
	return ru.Minflt
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: scanfaults HOST-ROOT")
		os.Exit(2)
	}
	fmt.Printf("before: %d faults\n", minflt())
	for i := 1; i <= 2; i++ {
		var m0, m1 runtime.MemStats
		runtime.ReadMemStats(&m0)
		f0, t0 := minflt(), time.Now()
		snap, err := nic.NewScanner(os.Args[1]).Scan()
		d, f1 := time.Since(t0), minflt()
		runtime.ReadMemStats(&m1)
		if err != nil {
			fmt.Fprintln(os.Stderr, "scanfaults:", err)
			os.Exit(1)
		}
		fmt.Printf("scan %d: %d devices, %d faults, %d KiB allocated, %v\n", i, len(snap.Devices), f1-f0, (m1.TotalAlloc-m0.TotalAlloc)>>10, d.Round(10*time.Microsecond))
	}
}
