// Package redirect builds and installs the traffic redirection of Istio's
// ambient mode with nftables over netlink: the in-pod rules that send an
// enrolled pod's traffic to the ztunnel listeners inside its network
// namespace, and the node-side rule that marks kubelet probes.
//
// The in-pod rule set is rule-for-rule Istio's nftables variant
// (protocols.md §3.3–§3.4): three inet tables, istio-ambient-nat,
// istio-ambient-mangle and istio-ambient-raw, whose base chains hook
// prerouting and output and jump to istio-prerouting and istio-output.
//
//   - Outbound TCP not to loopback and not from ztunnel (mark 0x539/0xfff)
//     is redirected to 15001; inbound TCP not to 15008 is redirected to
//     15006; DNS to 15053 when DNS capture is on, with ztunnel's own DNS
//     flows in conntrack zone 1.
//   - Packets ztunnel sends into the pod (mark 0x539) get connmark 0x111,
//     which output restores onto the app's replies; policy rule 32764 sends
//     mark 0x111/0xfff to table 100, whose local default route via lo hands
//     the replies back to ztunnel (IPv4, and IPv6 when lo has ::1).
//   - TCP from 169.254.7.127 (IPv6 fd16:9254:7127:1337:ffff:ffff:ffff:ffff)
//     is accepted untouched: those are kubelet probes, which the node-side
//     rule SNATs to that address (table istio-ambient-nat in the node's
//     netns, chain postrouting, for pod IPs in sets istio-inpod-probes-v4
//     and -v6, from a local socket or a configured UID).
//
// [Pod] and [Host] build the rule sets as data; [Ruleset.String] renders
// them as nft-style text, which is also how rules read back from the kernel
// are compared. [ApplyPod] installs the nftables part in one netlink batch,
// so a pod is either fully redirected or not at all; re-applying is
// idempotent and [RemovePod] leaves nothing behind. The functions that touch
// the kernel act on the network namespace of the calling thread: run them
// inside the target namespace (internal/netns).
package redirect
