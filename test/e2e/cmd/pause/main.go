// Command pause blocks until SIGTERM or SIGINT. The e2e test packs it into
// a local image and runs it as both the pod sandbox and the pod's
// container: there is no registry to pull the upstream pause image from,
// and the test inspects the container from the host (/proc/PID/environ,
// /proc/PID/root/dev/infiniband), so the container needs nothing else.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
