// Package netns creates, opens and enters Linux network namespaces.
//
// It is the one place in Weft that calls setns(2). Named namespaces are kept
// the way iproute2's `ip netns add` keeps them: a file under RunDir
// (/var/run/netns) with the namespace bind-mounted onto it, so they outlive
// the process that made them and other tools (`ip netns exec`) see them.
//
// [NS.Do] runs a function on an OS thread that has entered the namespace;
// sockets opened and processes started by that function belong to the
// namespace, and the thread goes back to the caller's namespace afterwards.
// If it cannot go back, the thread is discarded rather than reused, so no
// other goroutine ever runs in the wrong namespace. [NS.Netlink] returns a
// netlink handle whose socket lives in the namespace, for links, addresses
// and routes without entering it at all.
package netns
