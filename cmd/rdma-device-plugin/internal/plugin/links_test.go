package plugin

import "github.com/fastpath-k8s/fastpath/cmd/rdma-device-plugin/internal/links/linkstest"

// ChanLinks is a LinkSource fed by hand: tests and benchmarks send on C.
type ChanLinks = linkstest.Chan

// NewChanLinks returns a ChanLinks with a small buffer.
func NewChanLinks() *ChanLinks { return linkstest.NewChan() }
