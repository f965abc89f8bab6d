package floor_test

import (
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkPageFault is not fastpath code but a yardstick for the device
// plugin's start: what this machine charges for the first touch of a page
// of anonymous memory, the minor fault a fresh process takes for every
// page of heap, stack and data it writes (DaemonStart reports how many a
// start takes). Each op is one page: mapped beforehand, written once,
// unmapped afterwards, the timer stopped for both.
func BenchmarkPageFault(b *testing.B) {
	page := os.Getpagesize()
	const chunk = 1024 // pages per mapping
	for done := 0; done < b.N; done += chunk {
		n := min(chunk, b.N-done)
		b.StopTimer()
		m, err := unix.Mmap(-1, 0, n*page, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for i := 0; i < len(m); i += page {
			m[i] = 1
		}
		b.StopTimer()
		if err := unix.Munmap(m); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}
