package main

// The phases not written yet: each returns its checks once it has them.
func rdmaChecks() []check { return nil }
