// Package netns moves links between network namespaces in one step: the
// move, the rename and the MTU and alias changes go to the kernel as one
// rtnetlink request (MoveTo), which it carries out under one hold of the
// RTNL lock, so a link is never seen, nor left by a killed process, half-way
// between two namespaces. All netlink work goes through per-namespace
// sockets, so no goroutine ever switches its thread's namespace for long.
//
// The reference host-device plugin, and this package until 2026-12, move a
// link through a temporary namespace, renaming it there, with a rollback
// after each step. That buys two things: the link's name never clashes in
// either namespace, and (with the temporary namespace pinned to a file) a
// process killed between steps leaves the link where the next caller finds
// it. One request buys both without the detour: the kernel names the link
// as it arrives when its own name is taken there (__dev_change_net_namespace),
// a new name taken in the target is refused before anything changes, and
// there are no steps to be killed between. What the kernel refuses after
// the move (an MTU out of range) is rolled back, as before. Creating and
// tearing down the temporary namespace was most of a CNI ADD+DEL: 139-144
// against 71-74 ms on the host, 293 against 250 ms in the real-kernel guest
// (docs/benchmarks.md, "The CNI binary and its ADD+DEL").
//
// Older versions of fastpath's CNI bound each move's temporary namespace
// to a file, so that it outlived a killed process; the CNI still opens
// those it finds (OpenPin, Links) and releases them (Unpin). OpenPin never
// follows a symlink and takes only a network namespace bound to the file
// that is not the caller's own: a file in a state directory is evidence
// of what an older version did, never a pointer to follow.
//
// Linux only.
package netns
