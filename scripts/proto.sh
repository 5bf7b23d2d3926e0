#!/usr/bin/env bash
# Regenerates the checked-in Go code from internal/pb/**/*.proto.
#
# protoc comes from the system (Debian: apt-get install protobuf-compiler); the
# Go plugins are pinned in tools/proto/go.mod and built into bin/ on first use
# or when the pin changes. Output lands next to each .proto file.
#
# Environment:
#   PROTOC          protoc binary (default: protoc on PATH)
#   PROTOC_INCLUDE  directory holding google/protobuf/*.proto (default: /usr/include)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

go="${GO:-go}"
protoc="${PROTOC:-protoc}"
include="${PROTOC_INCLUDE:-/usr/include}"
bin="$root/bin"
srcdir="internal/pb"

die() {
	echo "proto.sh: $*" >&2
	exit 1
}

if ! command -v "$protoc" >/dev/null 2>&1; then
	die "protoc not found; install it with: apt-get install protobuf-compiler (or set PROTOC)"
fi
if [[ ! -f "$include/google/protobuf/struct.proto" ]]; then
	die "well-known protos not found under $include/google/protobuf; install them with: apt-get install libprotobuf-dev (or set PROTOC_INCLUDE)"
fi

# pinned prints the version of module $1 required by tools/proto/go.mod.
pinned() {
	(cd tools/proto && "$go" list -m -f '{{.Version}}' "$1")
}

# ensure_plugin builds plugin $1 (Go package $2) into bin/ unless the binary
# there already reports version $3.
ensure_plugin() {
	local name="$1" pkg="$2" want="$3" have=""
	if [[ -x "$bin/$name" ]]; then
		have="$("$bin/$name" --version 2>/dev/null | awk '{print $NF}')" || have=""
	fi
	if [[ "${have#v}" == "${want#v}" ]]; then
		return
	fi
	echo "building $name $want" >&2
	mkdir -p "$bin"
	(cd tools/proto && "$go" build -trimpath -o "$bin/$name" "$pkg")
}

ensure_plugin protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go \
	"$(pinned google.golang.org/protobuf)"
ensure_plugin protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc \
	"$(pinned google.golang.org/grpc/cmd/protoc-gen-go-grpc)"

mapfile -t protos < <(cd "$srcdir" && find . -name '*.proto' -printf '%P\n' | LC_ALL=C sort)
if [[ ${#protos[@]} -eq 0 ]]; then
	die "no .proto files under $srcdir"
fi

# Generate into a scratch tree first so a failure leaves the checked-in code
# untouched, then replace every generated file (stale ones included).
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT

"$protoc" \
	--plugin=protoc-gen-go="$bin/protoc-gen-go" \
	--plugin=protoc-gen-go-grpc="$bin/protoc-gen-go-grpc" \
	--proto_path="$srcdir" \
	--proto_path="$include" \
	--go_out="$out" --go_opt=paths=source_relative \
	--go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
	"${protos[@]}"

find "$srcdir" -name '*.pb.go' -delete
(cd "$out" && find . -name '*.pb.go' -printf '%P\n') | while read -r f; do
	mkdir -p "$srcdir/$(dirname "$f")"
	cp "$out/$f" "$srcdir/$f"
done

echo "generated Go for ${#protos[@]} proto files under $srcdir" >&2
