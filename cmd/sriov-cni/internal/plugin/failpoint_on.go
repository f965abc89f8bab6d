//go:build failpoints

package plugin

import (
	"fmt"
	"os"
	"syscall"
)

// FailpointEnv names, in a test build (-tags failpoints, which the fault
// injection suite in test/soak builds; release builds have no such code),
// the step boundary at which the plugin kills itself with SIGKILL, as the
// OOM killer or a node drain would: e.g. add:link, teardown:vf.
const FailpointEnv = "FASTPATH_FAILPOINT"

func failpoints() func(string) {
	want := os.Getenv(FailpointEnv)
	if want == "" {
		return nil
	}
	return func(name string) {
		if name != want {
			return
		}
		fmt.Fprintf(os.Stderr, "failpoint %s: SIGKILL\n", name)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
