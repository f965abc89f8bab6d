// Package netns moves links between network namespaces the safe way: through
// an intermediate namespace, where the rename and the MAC/MTU changes cannot
// clash with any other interface, with every step rolled back when a later
// one fails. All netlink work goes through per-namespace handles, so no
// goroutine ever switches its thread's namespace for it.
//
// The intermediate namespace can be pinned to a file (Pin): a process killed
// mid-move then leaves the link in a namespace that outlives it, where the
// next caller finds it by path, instead of in one the kernel tears down —
// which destroys a virtual link and sends a physical one to the initial
// namespace under whatever name it had.
//
// Linux only.
package netns
