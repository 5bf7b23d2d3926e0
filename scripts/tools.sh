#!/usr/bin/env bash
# tools.sh: builds the pinned third-party tools the local cluster runs into bin/.
#
#   scripts/tools.sh [group...]     groups: kube kubelet etcd helm cni conformance istioctl (default: all)
#
# Each group is a Go module under tools/ that pins its versions:
#   kube  tools/kube  kube-apiserver, kube-controller-manager, kube-scheduler,
#                     kube-proxy, kubectl (k8s.io/kubernetes)      -> bin/
#   kubelet tools/kube  kubelet, same version and ldflags as kube    -> bin/
#   etcd  tools/etcd  etcd (go.etcd.io/etcd/server/v3)            -> bin/
#   helm  tools/helm  helm (helm.sh/helm/v3)                       -> bin/
#   cni   tools/cni   bridge, host-local, loopback plugins         -> bin/cni/
#   conformance tools/conformance  the Gateway API conformance suite's
#                     echo-advanced app (Istio's echo server and
#                     client, static) and its test certificate  -> bin/conformance/
#   istioctl tools/conformance  istioctl at the same Istio snapshot  -> bin/
#
# A group is rebuilt only when its stamp (bin/.tools/<group>.stamp, a hash of
# the module's go.mod, go.sum and tools.go, the ldflags, the binary list and
# the Go version) changed or a binary is missing; otherwise it says it is up
# to date. Groups build one after the other, never in parallel (a Kubernetes
# binary takes ~3 GB of memory to build), and a lock keeps two runs of this
# script from building at the same time.
#
# The kubelet is a group of its own so that the real-node mode of the local
# cluster can be built (or not) without rebuilding the control plane; it
# shares tools/kube's module, so both stamps move together with its pins.
#
# Every build records its wall-clock duration in bin/.tools/<group>.build
# (seconds=, cache=shared|cold). TOOLS_COLD=1 rebuilds every group with a
# fresh, temporary GOCACHE, which measures a cold build (what a new machine
# pays); the benchmarks report these records as cluster_cold_tools_build_s.
#
# etcd is built rather than taken from Debian: Debian 12's etcd 3.4 lacks
# watch progress requests, without which kube-apiserver's watch cache turns
# away fresh watches on quiet resources ("Too large resource version").
#
# Environment: GO (default go), BIN (default <repo>/bin), TOOLS_COLD.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
GO=${GO:-go}
BIN=${BIN:-$root/bin}
state="$BIN/.tools"
mkdir -p "$state" "$BIN/cni"

die() {
	echo "tools: $*" >&2
	exit 1
}

command -v "$GO" >/dev/null 2>&1 || die "go not found (set GO or install Go 1.26.8)"

# One build at a time, also across concurrent invocations.
exec 9>"$state/lock"
if ! flock -n 9; then
	echo "tools: another tools build is running; waiting for it"
	flock 9
fi

gocache_dir=""
if [[ "${TOOLS_COLD:-}" == 1 ]]; then
	gocache_dir="$(mktemp -d "${TMPDIR:-/tmp}/tools-gocache.XXXXXX")"
	trap 'rm -rf "$gocache_dir"' EXIT
	export GOCACHE="$gocache_dir"
	cache_kind=cold
else
	cache_kind=shared
fi
goversion="$("$GO" env GOVERSION)" || die "cannot run $GO env GOVERSION; is Go installed?"

# modversion prints the version of module $2 required by tools/$1/go.mod.
modversion() {
	awk -v m="$2" '($1 == m) {print $2; exit} ($1 == "require" && $2 == m) {print $3; exit}' "tools/$1/go.mod"
}

# build_group GROUP OUTDIR LDFLAGS NAME=PKG...
build_group() {
	local group="$1" outdir="$2" ldflags="$3"
	shift 3
	local dir="${dir:-tools/$group}" names=() pkgs=() spec
	for spec in "$@"; do
		names+=("${spec%%=*}")
		pkgs+=("${spec#*=}")
	done
	local version="${label:-}"
	local stamp
	stamp="$(
		cat "$dir/go.mod" "$dir/go.sum" "$dir/tools.go"
		printf 'ldflags=%s\nbinaries=%s\ngo=%s\n' "$ldflags" "$*" "$goversion"
	)"
	stamp="$(sha256sum <<<"$stamp" | awk '{print $1}')"

	local missing=0 n
	for n in "${names[@]}"; do
		[[ -x "$outdir/$n" ]] || missing=1
	done
	if [[ $cache_kind != cold && $missing == 0 && -f "$state/$group.stamp" && "$(cat "$state/$group.stamp")" == "$stamp" ]]; then
		echo "tools: $group $version up to date (${names[*]})"
		return
	fi

	local hint=""
	[[ $group == kube ]] && hint="; a cold build takes ~12 min"
	[[ $group == kubelet ]] && hint="; a cold build takes ~15 min"
	echo "tools: building $group $version (${names[*]}; GOCACHE $cache_kind$hint)"
	rm -f "$state/$group.stamp"
	local log="$state/$group.log" start i
	start=$(date +%s)
	: >"$log"
	for i in "${!names[@]}"; do
		echo "tools:   ${names[$i]}"
		if ! (cd "$dir" && "$GO" build -buildvcs=false -ldflags "$ldflags" -o "$outdir/${names[$i]}.new" "${pkgs[$i]}") >>"$log" 2>&1; then
			rm -f "$outdir/${names[$i]}.new"
			echo "tools: building ${names[$i]} ($group $version) failed; last lines of $log:" >&2
			tail -n 40 "$log" >&2
			exit 1
		fi
		mv -f "$outdir/${names[$i]}.new" "$outdir/${names[$i]}"
	done
	local secs=$(($(date +%s) - start))
	printf 'seconds=%d\ncache=%s\nversion=%s\ngo=%s\ndate=%s\n' "$secs" "$cache_kind" "$version" "$goversion" "$(date -u +%FT%TZ)" >"$state/$group.build"
	echo "$stamp" >"$state/$group.stamp"
	echo "tools: $group $version built in ${secs}s"
}

# kube_ldflags prints the version ldflags of the Kubernetes binaries built
# at version $1.
kube_ldflags() {
	local v="$1" major minor
	major="${v#v}"
	major="${major%%.*}"
	minor="$(cut -d. -f2 <<<"$v")"
	local V=k8s.io/component-base/version
	echo "-s -w -X $V.gitVersion=$v -X $V.gitMajor=$major -X $V.gitMinor=$minor -X $V.gitTreeState=clean"
}

kube() {
	local v
	v="$(modversion kube k8s.io/kubernetes)"
	[[ -n "$v" ]] || die "tools/kube/go.mod does not require k8s.io/kubernetes"
	label="$v" build_group kube "$BIN" "$(kube_ldflags "$v")" \
		kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
		kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
		kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
		kube-proxy=k8s.io/kubernetes/cmd/kube-proxy \
		kubectl=k8s.io/kubernetes/cmd/kubectl
}

kubelet() {
	local v
	v="$(modversion kube k8s.io/kubernetes)"
	[[ -n "$v" ]] || die "tools/kube/go.mod does not require k8s.io/kubernetes"
	label="$v" dir=tools/kube build_group kubelet "$BIN" "$(kube_ldflags "$v")" \
		kubelet=k8s.io/kubernetes/cmd/kubelet
}

etcd() {
	local v
	v="$(modversion etcd go.etcd.io/etcd/server/v3)"
	[[ -n "$v" ]] || die "tools/etcd/go.mod does not require go.etcd.io/etcd/server/v3"
	label="$v" build_group etcd "$BIN" "-s -w" etcd=go.etcd.io/etcd/server/v3
}

helm() {
	local v
	v="$(modversion helm helm.sh/helm/v3)"
	[[ -n "$v" ]] || die "tools/helm/go.mod does not require helm.sh/helm/v3"
	label="$v" build_group helm "$BIN" \
		"-s -w -X helm.sh/helm/v3/internal/version.version=$v" \
		helm=helm.sh/helm/v3/cmd/helm
}

cni() {
	local v p=github.com/containernetworking/plugins
	v="$(modversion cni $p)"
	[[ -n "$v" ]] || die "tools/cni/go.mod does not require $p"
	label="$v" build_group cni "$BIN/cni" \
		"-s -w -X $p/pkg/utils/buildversion.BuildVersion=$v" \
		bridge=$p/plugins/main/bridge \
		host-local=$p/plugins/ipam/host-local \
		loopback=$p/plugins/main/loopback
}

# conformance builds the image binaries of the conformance suite's Mesh
# profile: its echo-advanced image is Istio's echo app (server, and the
# client the suite execs in the pods) with the test certificate the image
# carries as /cert.crt and /cert.key. Static: the images have no libc.
conformance() {
	local v m=istio.io/istio
	v="$(modversion conformance $m)"
	[[ -n "$v" ]] || die "tools/conformance/go.mod does not require $m"
	mkdir -p "$BIN/conformance"
	CGO_ENABLED=0 label="$v" build_group conformance "$BIN/conformance" "-s -w" \
		server=$m/pkg/test/echo/cmd/server \
		client=$m/pkg/test/echo/cmd/client
	local src
	src="$(cd tools/conformance && "$GO" list -m -f '{{.Dir}}' $m)" || die "cannot find the source of $m"
	install -m 0644 "$src/tests/testdata/certs/dns/cert-chain.pem" "$BIN/conformance/cert.crt"
	install -m 0644 "$src/tests/testdata/certs/dns/key.pem" "$BIN/conformance/cert.key"
	# The GATEWAY-HTTP profile's backends: the suite's echo-basic, from the
	# conformance module the main module pins, and pause, which stands in
	# for the coredns image of the UDPRoute tests.
	CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$BIN/conformance/" \
		sigs.k8s.io/gateway-api/conformance/echo-basic ./test/cmd/pause
}

# istioctl builds Istio's CLI from the snapshot the conformance group pins,
# for the tests that read Weft's data plane with it (istioctl
# ztunnel-config, istioctl waypoint) as an Istio user would.
istioctl() {
	local v m=istio.io/istio
	v="$(modversion conformance $m)"
	[[ -n "$v" ]] || die "tools/conformance/go.mod does not require $m"
	CGO_ENABLED=0 dir=tools/conformance label="$v" build_group istioctl "$BIN" "-s -w" \
		istioctl=$m/istioctl/cmd/istioctl
}

groups=("$@")
[[ ${#groups[@]} -gt 0 ]] || groups=(kube kubelet etcd helm cni conformance istioctl)
for g in "${groups[@]}"; do
	case "$g" in
	kube | kubelet | etcd | helm | cni | conformance | istioctl) "$g" ;;
	*) die "unknown tool group $g (want kube, kubelet, etcd, helm, cni, conformance or istioctl)" ;;
	esac
done
