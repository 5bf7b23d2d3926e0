// Package node is the local cluster's node runner: it plays the kubelet for
// one node whose "host" is a network namespace.
//
// A Runner registers its Node (addresses, podCIDR, capacity, a Ready
// condition it keeps fresh) and watches the pods bound to it. For each pod it
// creates a network namespace and runs the node's CNI configuration through
// libcni exactly as a container runtime does — the first network in the
// node's conf dir, plugins from the node's bin dir, executed inside the node's
// namespace — so a chained plugin installed into those directories takes part.
// Each container is a process in the pod's namespace (hostNetwork pods use
// the node's): the image weft/<name>:<tag> runs the binary <name> from the
// image directory, with the container's command, args and environment
// (downward API included) and its volumes bind-mounted at their mount paths
// in a private mount namespace: projected service-account tokens from the
// TokenRequest API, ConfigMaps, Secrets, downward API files, emptyDirs, and
// hostPaths mapped under the node's root directory. The runner reports pod
// IPs, container states and readiness (httpGet and tcpSocket probes sent
// from the node's namespace), restarts containers per restartPolicy, keeps a
// log file per container, and on deletion stops the containers, runs CNI DEL,
// removes the namespace and confirms the deletion.
package node
