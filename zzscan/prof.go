package main

import (
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/fastpath-k8s/fastpath/pkg/nic"
)

func init() {
	if os.Getenv("PROF") == "" {
		return
	}
	runtime.MemProfileRate = 1
	for i := 0; i < 5; i++ {
		nic.NewScanner(os.Args[1]).Scan()
	}
	runtime.GC()
	f, _ := os.Create("/tmp/scan.mprof")
	pprof.Lookup("allocs").WriteTo(f, 0)
	f.Close()
	os.Exit(0)
}
