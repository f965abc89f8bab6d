//go:build nodra

package main

func defaultDRAFlags() draFlags { return draFlags{} }
