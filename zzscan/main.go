package main

import (
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

func flt() int64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Minflt
}

func main() {
	var m0, m1, m2 runtime.MemStats
	runtime.ReadMemStats(&m0)
	f0 := flt()
	t := time.Now()
	snap, err := nic.NewScanner(os.Args[1]).Scan()
	d := time.Since(t)
	f1 := flt()
	runtime.ReadMemStats(&m1)
	if err != nil {
		panic(err)
	}
	t = time.Now()
	snap2, _ := nic.NewScanner(os.Args[1]).Scan()
	d2 := time.Since(t)
	f2 := flt()
	runtime.ReadMemStats(&m2)
	fmt.Println("alloc KB", (m1.TotalAlloc-m0.TotalAlloc)>>10, (m2.TotalAlloc-m1.TotalAlloc)>>10, "stack KB", m0.StackSys>>10, m1.StackSys>>10, m2.StackSys>>10, "heapsys", m0.HeapSys>>10, m1.HeapSys>>10, m2.HeapSys>>10, "gc", m2.NumGC)
	fmt.Println(len(snap.Devices), len(snap2.Devices), "prefaults", f0, "scan1", f1-f0, d, "scan2", f2-f1, d2)
}
