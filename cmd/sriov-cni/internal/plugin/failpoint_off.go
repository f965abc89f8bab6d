//go:build !failpoints

package plugin

// testBuild wires what only a test build has: nothing here. A test build
// (go build -tags failpoints, see failpoint_on.go) can stop at a step
// boundary and keep PF settings and RDMA placement in files; nothing a
// conf or the environment says reaches that code in this one.
func testBuild(*Plugin) {}
