#!/usr/bin/env bash
# deps.sh: installs the Debian packages Weft's build, tests and demo need,
# when they are missing. Run as root on Debian; it does nothing when all is there.
# BENCH=1 (make bench) adds what only the benchmarks need: nginx, the
# waypoint's baseline, which the benchmark runs itself (no nginx service),
# and its stream module, ztunnel's relay-pair floor.
set -euo pipefail

# command -> package that provides it
declare -A need=(
	[protoc]=protobuf-compiler
	[ip]=iproute2
	[nft]=nftables
	[iptables]=iptables
	[flock]=util-linux
	[tcpdump]=tcpdump
	# The local cluster's real-node mode: one containerd (with its ctr)
	# per node, runc under it. The package starts no daemon where PID 1 is
	# not systemd, and the policy-rc.d below covers the others.
	[containerd]=containerd
	[runc]=runc
	[nsenter]=util-linux
	# Tests make user-supplied certificates with the openssl command line.
	[openssl]=openssl
	# Lint reads govulncheck's findings.
	[jq]=jq
)
# file -> package that provides it
declare -A files=()
if [[ ${BENCH:-} == 1 ]]; then
	need[nginx]=nginx
	files[/usr/lib/nginx/modules/ngx_stream_module.so]=libnginx-mod-stream
fi

missing=()
for cmd in "${!need[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || [[ -x /usr/sbin/$cmd ]] || missing+=("${need[$cmd]}")
done
for f in "${!files[@]}"; do
	[[ -e $f ]] || missing+=("${files[$f]}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
	echo "deps: missing packages ${missing[*]}; run as root or install them with apt-get" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
# Packages with a service (nginx, containerd) must not start it: a policy-rc.d that
# denies every start, only for this install and only if there is none.
if [[ ! -e /usr/sbin/policy-rc.d ]]; then
	printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
	chmod 755 /usr/sbin/policy-rc.d
	trap 'rm -f /usr/sbin/policy-rc.d' EXIT
fi
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# nor at boot, where systemd runs.
for svc in nginx containerd; do
	if [[ " ${missing[*]} " == *" $svc "* && -d /run/systemd/system ]]; then
		systemctl disable --now "$svc" >/dev/null 2>&1 || true
	fi
done
