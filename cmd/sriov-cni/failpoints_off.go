//go:build !failpoints

package main

import "github.com/fastpath-k8s/fastpath/cmd/sriov-cni/internal/plugin"

// testBuild wires what only a test build has: nothing here. A test build
// (go build -tags failpoints, see failpoints_on.go) can stop at a step
// boundary and keep PF settings and RDMA placement in files; nothing a
// conf or the environment says reaches that code in this one.
func testBuild(*plugin.Plugin) {}
