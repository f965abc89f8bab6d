//go:build failpoints

package main

import (
	"github.com/fastpath-k8s/fastpath/cmd/sriov-cni/internal/plugin"
	"github.com/fastpath-k8s/fastpath/cmd/sriov-cni/internal/plugin/failpointtest"
)

// testBuild wires the soak suite's fault injection (go build -tags
// failpoints, test/soak): see package failpointtest.
func testBuild(p *plugin.Plugin) { failpointtest.Wire(p) }
