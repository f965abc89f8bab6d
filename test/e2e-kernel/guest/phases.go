package main

// The phases not written yet: each returns its checks once it has them.
func cniChecks() []check  { return nil }
func rdmaChecks() []check { return nil }
