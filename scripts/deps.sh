#!/usr/bin/env bash
# deps.sh: installs the Debian packages Weft's build, tests and demo need,
# when they are missing. Run as root on Debian; it does nothing when all is there.
set -euo pipefail

# command -> package that provides it
declare -A need=(
	[protoc]=protobuf-compiler
	[ip]=iproute2
	[nft]=nftables
	[iptables]=iptables
	[flock]=util-linux
	[tcpdump]=tcpdump
)

missing=()
for cmd in "${!need[@]}"; do
	command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
	echo "deps: missing packages ${missing[*]}; run as root or install them with apt-get" >&2
	exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
