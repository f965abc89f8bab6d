//go:build !failpoints

package plugin

// failpoints returns this build's failpoint hook: none. Only a test build
// (go build -tags failpoints, see failpoint_on.go) can stop at a step
// boundary; nothing a conf or the environment says reaches this one.
func failpoints() func(string) { return nil }
