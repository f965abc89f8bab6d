// Package netns moves links between network namespaces in one step: the
// move, the rename and the MTU and alias changes go to the kernel as one
// rtnetlink request (MoveTo), which it carries out under one hold of the
// RTNL lock, so a link is never seen, nor left by a killed process, half-way
// between two namespaces. All netlink work goes through per-namespace
// sockets, so no goroutine ever switches its thread's namespace for long.
//
// A namespace can be pinned to a file (Pin), so that it outlives every
// process that has it open; fastpath's CNI pinned one per move before it
// moved links in one request, and still opens and releases (Unpin) those an
// older version left behind.
//
// Linux only.
package netns
